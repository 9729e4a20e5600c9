// libFuzzer target for what the APNs client's HTTP/2 session reads from the server: whatever bytes
// come back (Apple, a proxy in between, a broken peer), `HTTP2ClientSession` must not trap, must end
// every request exactly once (a `closed` event, or `abandonStreams` when the connection is given up),
// and must keep its event stream consistent. The bytes are libnghttp2's to parse; the target covers
// our callbacks on top of it (headers, body limit, stream close, SETTINGS, GOAWAY, PING) and the
// stream bookkeeping. Built by `make fuzz-build` with Sources/HTTP2Session (the client and the shared file) and libnghttp2.
//
// Input layout: a byte of how many requests to submit first (1-8), then the server's bytes, fed in
// chunks whose sizes come from the bytes themselves, so frames split across reads are exercised.
// The server's preface (an empty SETTINGS frame) goes first unless the input's first byte is odd,
// so most inputs get past it and reach the streams.

final class Tag {
    let index: Int
    init(_ index: Int) { self.index = index }
}

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzHTTP2Session(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let input = Array(UnsafeBufferPointer(start: data, count: size))
    guard let first = input.first else { return 0 }
    guard let session = try? HTTP2ClientSession(maximumBodyBytes: 64) else { fatalError("no session") }
    let requests = Int(first % 8) + 1
    var open = Set<Int>()
    for index in 0..<requests {
        var headers = HTTP2HeaderList()
        headers.add(":method", "POST")
        headers.add(":scheme", "https")
        headers.add(":path", "/3/device/\(index)")
        headers.add(":authority", "fuzz")
        headers.add("content-length", "2")
        guard (try? session.submitRequest(headers: headers, body: [0x7B, 0x7D], context: Tag(index))) != nil else {
            fatalError("a fresh session refused request \(index)")
        }
        open.insert(index)
    }
    var closedTwice = false
    func drain() {
        session.drainEvents { event in
            if case .closed(let closed) = event {
                let index = (closed.context as! Tag).index
                if open.remove(index) == nil { closedTwice = true }
                if closed.body.count > 64 { fatalError("body over its limit: \(closed.body.count)") }
                if closed.complete, closed.errorCode != 0 { fatalError("complete with error \(closed.errorCode)") }
            }
        }
        if closedTwice { fatalError("a stream closed twice") }
    }
    try? session.send { _ in }
    drain()
    var server: [UInt8] = first & 1 == 0 ? [0, 0, 0, 4, 0, 0, 0, 0, 0] : []
    server += input.dropFirst()
    var offset = 0
    var failed = false
    while offset < server.count, !failed {
        let length = min(server.count - offset, Int(server[offset]) % 61 + 1)
        do {
            try server[offset..<offset + length].withUnsafeBytes { try session.receive($0) }
        } catch {
            failed = true
        }
        offset += length
        drain()
        try? session.send { _ in }
        drain()
    }
    // The connection ends either way: every request still open ends now, once.
    session.abandonStreams()
    drain()
    if !open.isEmpty { fatalError("requests never ended: \(open.sorted())") }
    return 0
}
