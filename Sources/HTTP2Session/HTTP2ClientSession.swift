import CNGHTTP2

/// An HTTP/2 client session on libnghttp2, without I/O: bytes from the server go in (`receive`),
/// bytes for the server come out (`send`), and what happened comes out as events (`drainEvents`).
/// libnghttp2's own session is sans-I/O (`nghttp2_session_mem_recv`, `nghttp2_session_mem_send`); this
/// wraps it for Swift: requests with a body held until sent, the response's status, chosen headers and
/// body gathered per stream, and the connection's SETTINGS, GOAWAY and PING acknowledgements.
///
/// libnghttp2 does the protocol: HPACK, flow control (WINDOW_UPDATE is automatic), the server's
/// MAX_CONCURRENT_STREAMS (requests beyond it wait in its queue), SETTINGS and PING acknowledgements,
/// frames for streams already reset, stream IDs. Not thread-safe: one owner (an event loop) drives it.
public final class HTTP2ClientSession {
    /// One request's outcome, when its stream closes.
    public struct Closed {
        /// What the caller passed to `submitRequest`.
        public var context: AnyObject
        public var streamID: Int32
        /// `:status`, if a response header block arrived.
        public var status: Int?
        /// The headers named in `capturedHeaders` that the response carried, in order.
        public var headers: [(name: String, value: String)]
        /// The response body, up to `maximumBodyBytes`.
        public var body: [UInt8]
        /// The server ended the response (END_STREAM) before the stream closed.
        public var complete: Bool
        /// The stream's error code: 0 (NO_ERROR) for a stream that ended normally, else RST_STREAM's code,
        /// or REFUSED_STREAM for a stream above a GOAWAY's last stream ID, or the code of `reset`.
        public var errorCode: UInt32
    }

    public enum Event {
        /// The server's SETTINGS were applied; its current limit on streams at once.
        case settings(maxConcurrentStreams: Int)
        case goAway(lastStreamID: Int32, errorCode: UInt32)
        case pingAcknowledged
        case closed(Closed)
    }

    /// Per stream: the body still to send, and the response gathered so far.
    final class Stream {
        let context: AnyObject
        let body: OutgoingBody
        var id: Int32 = 0
        var status: Int?
        var headers: [(name: String, value: String)] = []
        var responseBody: [UInt8] = []
        var complete = false

        init(context: AnyObject, body: [UInt8]) {
            self.context = context
            self.body = OutgoingBody(body)
        }
    }

    // Owned by this object; freed in deinit. Never nil after init.
    private var session: OpaquePointer!
    private let sink = CallbackSink()
    /// Open streams by ID; libnghttp2 holds unretained pointers to them as stream user data.
    private var streams: [Int32: Stream] = [:]
    private var events: [Event] = []
    private var handling: [Event] = []
    /// Set by `abandonStreams`: the connection is gone, and libnghttp2 may still point at freed streams.
    private var abandoned = false
    let capturedHeaders: [[UInt8]]
    let maximumBodyBytes: Int

    /// - Parameters:
    ///   - capturedHeaders: response headers to keep (lowercase), besides `:status`.
    ///   - maximumBodyBytes: response body kept per stream; more is read and dropped.
    public init(capturedHeaders: [String] = [], maximumBodyBytes: Int = 4_096) throws(HTTP2ProtocolError) {
        self.capturedHeaders = capturedHeaders.map { Array($0.utf8) }
        self.maximumBodyBytes = maximumBodyBytes
        session = try sink.makeSession(server: false)
        sink.header = { [unowned self] in header(stream: $0, name: $1, value: $2) }
        sink.data = { [unowned self] in data(stream: $0, $1) }
        sink.frame = { [unowned self] in frame($0) }
        sink.close = { [unowned self] in close(stream: $0, errorCode: $1) }
        // The client's SETTINGS, the first frame after the preface: no server push (APNs has none).
        var settings = [nghttp2_settings_entry(settings_id: Int32(NGHTTP2_SETTINGS_ENABLE_PUSH.rawValue), value: 0)]
        let submitted = nghttp2_submit_settings(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), &settings, settings.count)
        guard submitted == 0 else { throw HTTP2ProtocolError(code: submitted) }
    }

    deinit {
        nghttp2_session_del(session)
    }

    /// Streams open or waiting for the server's limit.
    public var openStreams: Int { streams.count }

    /// Queues a request; its stream ID, or an error (`NGHTTP2_ERR_STREAM_ID_NOT_AVAILABLE` once the
    /// connection's stream IDs are spent: a new connection is needed).
    public func submitRequest(headers: HTTP2HeaderList, body: [UInt8], context: AnyObject) throws(HTTP2ProtocolError) -> Int32 {
        guard !abandoned else { throw HTTP2ProtocolError(code: NGHTTP2_ERR_INVALID_STATE.rawValue) }
        let stream = Stream(context: context, body: body)
        let pointer = Unmanaged.passUnretained(stream).toOpaque()
        let source = Unmanaged.passUnretained(stream.body).toOpaque()
        let id = withNameValues(headers) { nva, count -> Int32 in
            var provider = nghttp2_data_provider(source: nghttp2_data_source(ptr: source), read_callback: readOutgoingBody)
            return nghttp2_submit_request(session, nil, nva, count, &provider, pointer)
        }
        guard id > 0 else { throw HTTP2ProtocolError(code: id) }
        stream.id = id
        streams[id] = stream
        return id
    }

    /// Feeds bytes read from the server. Events it causes wait in `drainEvents`. A connection error in
    /// them (a malformed frame, bytes that are not HTTP/2) does not throw: libnghttp2 queues a GOAWAY
    /// saying why and ends the session, and `isAlive` turns false once it is sent. It throws only
    /// when libnghttp2 cannot go on at all (out of memory, a flood of frames it refuses to answer).
    public func receive(_ bytes: UnsafeRawBufferPointer) throws(HTTP2ProtocolError) {
        guard !abandoned, let base = bytes.baseAddress, bytes.count > 0 else { return }
        let read = nghttp2_session_mem_recv(session, base.assumingMemoryBound(to: UInt8.self), bytes.count)
        if read < 0 { throw HTTP2ProtocolError(code: Int32(read)) }
    }

    /// Hands every byte that is ready for the server to `write`, chunk by chunk (each chunk valid only
    /// during the call).
    public func send(_ write: (UnsafeRawBufferPointer) -> Void) throws(HTTP2ProtocolError) {
        while !abandoned {
            var data: UnsafePointer<UInt8>?
            let count = nghttp2_session_mem_send(session, &data)
            if count < 0 { throw HTTP2ProtocolError(code: Int32(count)) }
            guard count > 0, let data else { return }
            write(UnsafeRawBufferPointer(start: data, count: count))
        }
    }

    /// Whether there are bytes to send.
    public var wantsWrite: Bool { nghttp2_session_want_write(session) != 0 }

    /// Whether the session is still usable: false after a GOAWAY both ways or a fatal error.
    public var isAlive: Bool { nghttp2_session_want_read(session) != 0 || nghttp2_session_want_write(session) != 0 }

    /// Resets a stream (a request that took too long); its `closed` event comes with `code`.
    public func reset(streamID: Int32, code: UInt32 = NGHTTP2_CANCEL.rawValue) {
        _ = nghttp2_submit_rst_stream(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), streamID, code)
    }

    /// Queues a PING; `pingAcknowledged` follows its answer.
    public func ping(_ payload: UInt64) {
        var opaque = payload.bigEndian
        withUnsafeBytes(of: &opaque) { bytes in
            _ = nghttp2_submit_ping(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), bytes.baseAddress!.assumingMemoryBound(to: UInt8.self))
        }
    }

    /// Every event since the last call, in order.
    public func drainEvents(_ handle: (Event) -> Void) {
        // Handling one may cause more (a reset sent from within it): loop until none are left. The two
        // arrays trade places, so neither is copied or reallocated.
        while !events.isEmpty {
            swap(&events, &handling)
            for event in handling { handle(event) }
            handling.removeAll(keepingCapacity: true)
        }
    }

    /// The connection is gone: every open stream ends now, as if reset with `code`. Their events wait
    /// in `drainEvents`.
    public func abandonStreams(code: UInt32 = NGHTTP2_CANCEL.rawValue) {
        abandoned = true
        let open = streams.values.sorted { $0.id < $1.id }
        streams.removeAll()
        for stream in open { nghttp2_session_set_stream_user_data(session, stream.id, nil) }
        for stream in open { events.append(.closed(closed(stream, errorCode: code))) }
    }

    // MARK: libnghttp2's callbacks, through the session pointer it hands back as user data.

    private func stream(_ id: Int32) -> Stream? {
        guard let pointer = nghttp2_session_get_stream_user_data(session, id) else { return nil }
        return Unmanaged<Stream>.fromOpaque(pointer).takeUnretainedValue()
    }

    private func header(stream id: Int32, name: UnsafeBufferPointer<UInt8>, value: UnsafeBufferPointer<UInt8>) {
        guard let stream = stream(id) else { return }
        if name.elementsEqual(":status".utf8) {
            // An interim (1xx) answer is not the final one.
            if (stream.status ?? 0) < 200 { stream.status = Int(String(decoding: value, as: UTF8.self)) }
        } else if capturedHeaders.contains(where: { $0.elementsEqual(name) }) {
            stream.headers.append((String(decoding: name, as: UTF8.self), String(decoding: value, as: UTF8.self)))
        }
    }

    private func data(stream id: Int32, _ chunk: UnsafeBufferPointer<UInt8>) {
        guard let stream = stream(id), stream.responseBody.count < maximumBodyBytes else { return }
        stream.responseBody.append(contentsOf: chunk.prefix(maximumBodyBytes - stream.responseBody.count))
    }

    private func frame(_ frame: UnsafePointer<nghttp2_frame>) {
        let header = frame.pointee.hd
        switch Int(header.type) {
        case Int(NGHTTP2_SETTINGS.rawValue) where header.flags & UInt8(NGHTTP2_FLAG_ACK.rawValue) == 0:
            let limit = nghttp2_session_get_remote_settings(session, NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS)
            events.append(.settings(maxConcurrentStreams: Int(limit)))
        case Int(NGHTTP2_GOAWAY.rawValue):
            events.append(.goAway(lastStreamID: frame.pointee.goaway.last_stream_id, errorCode: frame.pointee.goaway.error_code))
        case Int(NGHTTP2_PING.rawValue) where header.flags & UInt8(NGHTTP2_FLAG_ACK.rawValue) != 0:
            events.append(.pingAcknowledged)
        case Int(NGHTTP2_HEADERS.rawValue), Int(NGHTTP2_DATA.rawValue):
            if header.flags & UInt8(NGHTTP2_FLAG_END_STREAM.rawValue) != 0 { stream(header.stream_id)?.complete = true }
        default:
            break
        }
    }

    private func close(stream id: Int32, errorCode: UInt32) {
        guard let stream = streams.removeValue(forKey: id) else { return }
        events.append(.closed(closed(stream, errorCode: errorCode)))
    }

    private func closed(_ stream: Stream, errorCode: UInt32) -> Closed {
        Closed(context: stream.context, streamID: stream.id, status: stream.status, headers: stream.headers,
               body: stream.responseBody, complete: stream.complete && errorCode == 0, errorCode: errorCode)
    }
}
