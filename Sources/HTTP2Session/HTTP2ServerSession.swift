import CNGHTTP2

/// An HTTP/2 server session on libnghttp2, without I/O: the client's bytes go in (`receive`), bytes
/// for it come out (`send`), and each complete request comes out as an event (`drainEvents`) to be
/// answered with `respond`. libnghttp2 checks the preface, HPACK, flow control, the stream limit this
/// side announced and HTTP's own rules for a request (pseudo-headers, field validity, content-length
/// against the body), resetting a stream that breaks them. Not thread-safe: one owner drives it.
public final class HTTP2ServerSession {
    /// A request whose stream the client ended (END_STREAM): every header field in order (pseudo-
    /// headers included), and its body up to `maximumBodyBytes`.
    public struct Request {
        public var streamID: Int32
        public var headers: [(name: String, value: String)]
        public var body: [UInt8]
        /// The body's whole length, kept or not.
        public var bodyLength: Int
    }

    public enum Event {
        /// A client opened a stream; how many are open now.
        case opened(streamID: Int32, openStreams: Int)
        case request(Request)
        /// A stream ended (answered, reset by either side, or refused); how many are still open.
        case closed(streamID: Int32, errorCode: UInt32, openStreams: Int)
    }

    final class Stream {
        let id: Int32
        var headers: [(name: String, value: String)] = []
        var body: [UInt8] = []
        var bodyLength = 0
        /// The first header block is complete; a later one is trailers.
        var headersDone = false
        var response: OutgoingBody?

        init(id: Int32) { self.id = id }
    }

    private var session: OpaquePointer!
    private let sink = CallbackSink()
    private var streams: [Int32: Stream] = [:]
    private var events: [Event] = []
    private var handling: [Event] = []
    let maximumBodyBytes: Int

    /// - Parameter settings: the SETTINGS this side announces first (identifier, value), e.g.
    ///   `NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS`.
    public init(settings: [(id: Int32, value: UInt32)], maximumBodyBytes: Int) throws(HTTP2ProtocolError) {
        self.maximumBodyBytes = maximumBodyBytes
        session = try sink.makeSession(server: true)
        sink.beginHeaders = { [unowned self] in beginHeaders($0) }
        sink.header = { [unowned self] in header(stream: $0, name: $1, value: $2) }
        sink.data = { [unowned self] in data(stream: $0, $1) }
        sink.frame = { [unowned self] in frame($0) }
        sink.close = { [unowned self] in close(stream: $0, errorCode: $1) }
        try submitSettings(settings)
    }

    deinit {
        nghttp2_session_del(session)
    }

    /// Announces new SETTINGS (a higher stream limit once the client has shown who it is).
    public func submitSettings(_ settings: [(id: Int32, value: UInt32)]) throws(HTTP2ProtocolError) {
        var entries = settings.map { nghttp2_settings_entry(settings_id: $0.id, value: $0.value) }
        let status = nghttp2_submit_settings(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), &entries, entries.count)
        guard status == 0 else { throw HTTP2ProtocolError(code: status) }
    }

    /// Answers a request: headers (`:status` first), and a body unless nil (then the headers end the stream).
    public func respond(streamID: Int32, headers: HTTP2HeaderList, body: [UInt8]?) throws(HTTP2ProtocolError) {
        guard let stream = streams[streamID] else { return }  // reset meanwhile: nobody to answer
        // A second answer would free the first's body while libnghttp2 still points at it.
        guard stream.response == nil else { throw HTTP2ProtocolError(code: NGHTTP2_ERR_INVALID_STATE.rawValue) }
        let status: Int32
        if let body {
            let outgoing = OutgoingBody(body)
            stream.response = outgoing
            status = withNameValues(headers) { nva, count in
                var provider = nghttp2_data_provider(source: nghttp2_data_source(ptr: Unmanaged.passUnretained(outgoing).toOpaque()),
                                                     read_callback: readOutgoingBody)
                return nghttp2_submit_response(session, streamID, nva, count, &provider)
            }
        } else {
            status = withNameValues(headers) { nva, count in nghttp2_submit_response(session, streamID, nva, count, nil) }
        }
        guard status == 0 else { throw HTTP2ProtocolError(code: status) }
    }

    /// GOAWAY: no stream above `lastStreamID` will be processed; the ones at or below it still are.
    public func goAway(lastStreamID: Int32, errorCode: UInt32, debugData: [UInt8]) {
        debugData.withUnsafeBufferPointer { data in
            _ = nghttp2_submit_goaway(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), lastStreamID, errorCode, data.baseAddress, data.count)
        }
    }

    /// The highest stream ID the client has opened.
    public var highestStreamID: Int32 { nghttp2_session_get_last_proc_stream_id(session) }

    public var openStreams: Int { streams.count }

    /// Feeds the client's bytes. A connection error in them does not throw: libnghttp2 queues a GOAWAY
    /// and ends the session (`isAlive` false once it is sent). It throws when it cannot go on at all,
    /// as for bytes that do not start with the HTTP/2 preface.
    public func receive(_ bytes: UnsafeRawBufferPointer) throws(HTTP2ProtocolError) {
        guard let base = bytes.baseAddress, bytes.count > 0 else { return }
        let read = nghttp2_session_mem_recv(session, base.assumingMemoryBound(to: UInt8.self), bytes.count)
        if read < 0 { throw HTTP2ProtocolError(code: Int32(read)) }
    }

    /// Hands every byte ready for the client to `write`, chunk by chunk (each valid only during the call).
    public func send(_ write: (UnsafeRawBufferPointer) -> Void) throws(HTTP2ProtocolError) {
        while true {
            var data: UnsafePointer<UInt8>?
            let count = nghttp2_session_mem_send(session, &data)
            if count < 0 { throw HTTP2ProtocolError(code: Int32(count)) }
            guard count > 0, let data else { return }
            write(UnsafeRawBufferPointer(start: data, count: count))
        }
    }

    /// False once the session is over: after a connection error, or a GOAWAY both ways with nothing left.
    public var isAlive: Bool { nghttp2_session_want_read(session) != 0 || nghttp2_session_want_write(session) != 0 }

    /// Every event since the last call, in order.
    public func drainEvents(_ handle: (Event) -> Void) {
        while !events.isEmpty {
            swap(&events, &handling)
            for event in handling { handle(event) }
            handling.removeAll(keepingCapacity: true)
        }
    }

    // MARK: libnghttp2's callbacks

    private func beginHeaders(_ frame: UnsafePointer<nghttp2_frame>) {
        guard frame.pointee.hd.type == UInt8(NGHTTP2_HEADERS.rawValue), frame.pointee.headers.cat == NGHTTP2_HCAT_REQUEST else { return }
        let id = frame.pointee.hd.stream_id
        let stream = Stream(id: id)
        streams[id] = stream
        nghttp2_session_set_stream_user_data(session, id, Unmanaged.passUnretained(stream).toOpaque())
        events.append(.opened(streamID: id, openStreams: streams.count))
    }

    private func stream(_ id: Int32) -> Stream? {
        guard let pointer = nghttp2_session_get_stream_user_data(session, id) else { return nil }
        return Unmanaged<Stream>.fromOpaque(pointer).takeUnretainedValue()
    }

    private func header(stream id: Int32, name: UnsafeBufferPointer<UInt8>, value: UnsafeBufferPointer<UInt8>) {
        // Trailers (a second block) carry nothing APNs reads: only the first block's fields are kept.
        guard let stream = stream(id), !stream.headersDone else { return }
        stream.headers.append((String(decoding: name, as: UTF8.self), String(decoding: value, as: UTF8.self)))
    }

    private func data(stream id: Int32, _ chunk: UnsafeBufferPointer<UInt8>) {
        guard let stream = stream(id) else { return }
        stream.bodyLength += chunk.count
        let room = maximumBodyBytes - stream.body.count
        if room > 0 { stream.body.append(contentsOf: chunk.prefix(room)) }
    }

    private func frame(_ frame: UnsafePointer<nghttp2_frame>) {
        let header = frame.pointee.hd
        if header.type == UInt8(NGHTTP2_HEADERS.rawValue) { stream(header.stream_id)?.headersDone = true }
        guard header.type == UInt8(NGHTTP2_HEADERS.rawValue) || header.type == UInt8(NGHTTP2_DATA.rawValue),
              header.flags & UInt8(NGHTTP2_FLAG_END_STREAM.rawValue) != 0, let stream = stream(header.stream_id) else { return }
        events.append(.request(Request(streamID: stream.id, headers: stream.headers, body: stream.body, bodyLength: stream.bodyLength)))
    }

    private func close(stream id: Int32, errorCode: UInt32) {
        guard streams.removeValue(forKey: id) != nil else { return }
        events.append(.closed(streamID: id, errorCode: errorCode, openStreams: streams.count))
    }
}
