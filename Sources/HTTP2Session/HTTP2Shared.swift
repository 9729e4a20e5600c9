import CNGHTTP2

/// An error libnghttp2 cannot go on from (or a request it refused): the connection is done
/// (libnghttp2 may have queued a GOAWAY to send).
public struct HTTP2ProtocolError: Error, CustomStringConvertible {
    public var code: Int32
    public var description: String { "HTTP/2 session error: \(String(cString: nghttp2_strerror(Int32(code))))" }
}

/// A request's or response's header fields, names and values in one buffer: what libnghttp2 copies from, built
/// without a string per field.
public struct HTTP2HeaderList: Sendable {
    var bytes: [UInt8] = []
    var lengths: [(name: Int, value: Int)] = []

    public init(bytes: Int = 512, fields: Int = 16) {
        self.bytes.reserveCapacity(bytes)
        lengths.reserveCapacity(fields)
    }

    /// Adds `name: value + more` (`more`, to join a prefix and a value without a string between).
    /// Pseudo-headers first, names lowercase.
    public mutating func add(_ name: String, _ value: String, _ more: String = "") {
        let start = bytes.count
        bytes.append(contentsOf: name.utf8)
        let nameLength = bytes.count - start
        bytes.append(contentsOf: value.utf8)
        bytes.append(contentsOf: more.utf8)
        lengths.append((nameLength, bytes.count - start - nameLength))
    }

    public var count: Int { lengths.count }
}

/// Sends `nva` built over a header list's one buffer to `body` (libnghttp2 copies every name and value
/// before the call returns, and never writes to them).
func withNameValues<T>(_ headers: HTTP2HeaderList, _ body: (UnsafeMutablePointer<nghttp2_nv>, Int) -> T) -> T {
    headers.bytes.withUnsafeBufferPointer { bytes -> T in
        let base = UnsafeMutablePointer(mutating: bytes.baseAddress!)
        return withUnsafeTemporaryAllocation(of: nghttp2_nv.self, capacity: max(headers.lengths.count, 1)) { nva -> T in
            var offset = 0
            for (index, (n, v)) in headers.lengths.enumerated() {
                nva[index] = nghttp2_nv(name: base + offset, value: base + offset + n,
                                        namelen: n, valuelen: v, flags: UInt8(NGHTTP2_NV_FLAG_NONE.rawValue))
                offset += n + v
            }
            return body(nva.baseAddress!, headers.lengths.count)
        }
    }
}

/// A body handed to libnghttp2 a piece at a time, through a data provider pointing at its holder.
final class OutgoingBody {
    let bytes: [UInt8]
    var sent = 0

    init(_ bytes: [UInt8]) { self.bytes = bytes }

    /// Copies the next piece into libnghttp2's buffer; EOF with the last.
    func read(into buffer: UnsafeMutablePointer<UInt8>, length: Int, flags: UnsafeMutablePointer<UInt32>) -> Int {
        let count = min(length, bytes.count - sent)
        bytes.withUnsafeBufferPointer { body in
            if count > 0 { buffer.update(from: body.baseAddress! + sent, count: count) }
        }
        sent += count
        if sent == bytes.count { flags.pointee |= NGHTTP2_DATA_FLAG_EOF.rawValue }
        return count
    }
}

/// libnghttp2's read callback for an `OutgoingBody` (the data source's pointer, unretained: its
/// session keeps it alive until the stream closes).
let readOutgoingBody: nghttp2_data_source_read_callback = { _, _, buffer, length, flags, source, _ in
    guard let pointer = source?.pointee.ptr, let buffer, let flags else { return Int(NGHTTP2_ERR_CALLBACK_FAILURE.rawValue) }
    return Unmanaged<OutgoingBody>.fromOpaque(pointer).takeUnretainedValue().read(into: buffer, length: length, flags: flags)
}

/// Where libnghttp2's callbacks go: the session's user data is this sink, and each session sets the
/// handlers it uses (capturing itself unowned: the session owns the sink and outlives every callback,
/// which come only from within its own calls into libnghttp2).
final class CallbackSink {
    var beginHeaders: (UnsafePointer<nghttp2_frame>) -> Void = { _ in }
    var header: (_ stream: Int32, _ name: UnsafeBufferPointer<UInt8>, _ value: UnsafeBufferPointer<UInt8>) -> Void = { _, _, _ in }
    var data: (_ stream: Int32, _ chunk: UnsafeBufferPointer<UInt8>) -> Void = { _, _ in }
    var frame: (UnsafePointer<nghttp2_frame>) -> Void = { _ in }
    var close: (_ stream: Int32, _ errorCode: UInt32) -> Void = { _, _ in }

    var userData: UnsafeMutableRawPointer { Unmanaged.passUnretained(self).toOpaque() }

    /// A new libnghttp2 session, client or server, whose callbacks go to this sink's handlers.
    func makeSession(server: Bool) throws(HTTP2ProtocolError) -> OpaquePointer {
        var callbacks: OpaquePointer?
        guard nghttp2_session_callbacks_new(&callbacks) == 0, let callbacks else { throw HTTP2ProtocolError(code: NGHTTP2_ERR_NOMEM.rawValue) }
        defer { nghttp2_session_callbacks_del(callbacks) }
        Self.install(on: callbacks)
        var session: OpaquePointer?
        let status = server ? nghttp2_session_server_new(&session, callbacks, userData)
                            : nghttp2_session_client_new(&session, callbacks, userData)
        guard status == 0, let session else { throw HTTP2ProtocolError(code: status) }
        return session
    }

    /// Points libnghttp2's callbacks at a sink's handlers.
    private static func install(on callbacks: OpaquePointer) {
        nghttp2_session_callbacks_set_on_begin_headers_callback(callbacks, sinkBeginHeaders)
        nghttp2_session_callbacks_set_on_header_callback(callbacks, sinkHeader)
        nghttp2_session_callbacks_set_on_data_chunk_recv_callback(callbacks, sinkDataChunk)
        nghttp2_session_callbacks_set_on_frame_recv_callback(callbacks, sinkFrame)
        nghttp2_session_callbacks_set_on_stream_close_callback(callbacks, sinkStreamClose)
    }
}

private func sink(_ userData: UnsafeMutableRawPointer?) -> CallbackSink {
    Unmanaged<CallbackSink>.fromOpaque(userData!).takeUnretainedValue()
}

private let sinkBeginHeaders: nghttp2_on_begin_headers_callback = { _, frame, userData in
    if let frame { sink(userData).beginHeaders(frame) }
    return 0
}

private let sinkHeader: nghttp2_on_header_callback = { _, frame, name, nameLength, value, valueLength, _, userData in
    guard let frame, frame.pointee.hd.type == UInt8(NGHTTP2_HEADERS.rawValue) else { return 0 }
    sink(userData).header(frame.pointee.hd.stream_id, UnsafeBufferPointer(start: name, count: nameLength),
                          UnsafeBufferPointer(start: value, count: valueLength))
    return 0
}

private let sinkDataChunk: nghttp2_on_data_chunk_recv_callback = { _, _, streamID, data, length, userData in
    sink(userData).data(streamID, UnsafeBufferPointer(start: data, count: length))
    return 0
}

private let sinkFrame: nghttp2_on_frame_recv_callback = { _, frame, userData in
    if let frame { sink(userData).frame(frame) }
    return 0
}

private let sinkStreamClose: nghttp2_on_stream_close_callback = { _, streamID, errorCode, userData in
    sink(userData).close(streamID, errorCode)
    return 0
}
