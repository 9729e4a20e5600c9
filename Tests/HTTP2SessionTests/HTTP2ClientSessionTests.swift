import HTTP2Session
import Testing

/// The session without I/O: server frames written byte for byte here (HPACK's static table gives
/// `:status` 200 as 0x88 and 400 as 0x8C), fed in, and the events and bytes that come out checked.
@Suite struct HTTP2ClientSessionTests {
    final class Tag {
        let name: String
        init(_ name: String) { self.name = name }
    }

    static let preface = Array("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".utf8)

    /// One frame: length, type, flags, stream ID, payload.
    static func frame(_ type: UInt8, flags: UInt8 = 0, stream: UInt32 = 0, _ payload: [UInt8] = []) -> [UInt8] {
        [UInt8(payload.count >> 16), UInt8(payload.count >> 8 & 0xFF), UInt8(payload.count & 0xFF), type, flags,
         UInt8(stream >> 24), UInt8(stream >> 16 & 0xFF), UInt8(stream >> 8 & 0xFF), UInt8(stream & 0xFF)] + payload
    }

    static func u32(_ value: UInt32) -> [UInt8] {
        [UInt8(value >> 24), UInt8(value >> 16 & 0xFF), UInt8(value >> 8 & 0xFF), UInt8(value & 0xFF)]
    }

    static let serverSettings = frame(4)
    static let settingsAck = frame(4, flags: 1)

    struct Sent: Equatable {
        var type: UInt8
        var flags: UInt8
        var stream: UInt32
    }

    /// The frames the session has to send now (after the client preface, which it checks once).
    func sent(_ session: HTTP2ClientSession, preface: Bool = false) throws -> [Sent] {
        var bytes: [UInt8] = []
        try session.send { bytes += $0 }
        if preface {
            #expect(Array(bytes.prefix(Self.preface.count)) == Self.preface)
            bytes.removeFirst(Self.preface.count)
        }
        var frames: [Sent] = []
        var offset = 0
        while offset + 9 <= bytes.count {
            let length = Int(bytes[offset]) << 16 | Int(bytes[offset + 1]) << 8 | Int(bytes[offset + 2])
            let stream = UInt32(bytes[offset + 5] & 0x7F) << 24 | UInt32(bytes[offset + 6]) << 16
                | UInt32(bytes[offset + 7]) << 8 | UInt32(bytes[offset + 8])
            frames.append(Sent(type: bytes[offset + 3], flags: bytes[offset + 4], stream: stream))
            offset += 9 + length
        }
        #expect(offset == bytes.count, "whole frames")
        return frames
    }

    func events(_ session: HTTP2ClientSession) -> [HTTP2ClientSession.Event] {
        var events: [HTTP2ClientSession.Event] = []
        session.drainEvents { events.append($0) }
        return events
    }

    func closed(_ events: [HTTP2ClientSession.Event]) -> [HTTP2ClientSession.Closed] {
        events.compactMap { if case .closed(let closed) = $0 { return closed } else { return nil } }
    }

    func request(_ session: HTTP2ClientSession, _ name: String, body: [UInt8] = Array("{}".utf8)) throws -> Int32 {
        var headers = HTTP2HeaderList()
        headers.add(":method", "POST")
        headers.add(":scheme", "https")
        headers.add(":path", "/3/device/", name)
        headers.add(":authority", "api.push.apple.com")
        headers.add("content-length", String(body.count))
        return try session.submitRequest(headers: headers, body: body, context: Tag(name))
    }

    func receive(_ session: HTTP2ClientSession, _ bytes: [UInt8]) throws {
        try bytes.withUnsafeBytes { try session.receive($0) }
    }

    @Test func aRequestIsHeadersThenItsBodyEndingTheStream() throws {
        let session = try HTTP2ClientSession()
        #expect(try sent(session, preface: true) == [Sent(type: 4, flags: 0, stream: 0)], "SETTINGS first")
        #expect(try request(session, "a") == 1)
        #expect(try request(session, "b") == 3)
        let frames = try sent(session)
        for stream: UInt32 in [1, 3] {
            // libnghttp2 sends the HEADERS of a batch before its DATA; per stream the order is fixed.
            #expect(frames.filter { $0.stream == stream } == [Sent(type: 1, flags: 4, stream: stream), Sent(type: 0, flags: 1, stream: stream)])
        }
        #expect(frames.count == 4)
        #expect(session.openStreams == 2)
    }

    @Test func responsesEndTheirStreamsWithStatusAndBody() throws {
        let session = try HTTP2ClientSession(maximumBodyBytes: 16)
        _ = try sent(session, preface: true)
        _ = try request(session, "accepted")
        _ = try request(session, "refused")
        _ = try sent(session)
        try receive(session, Self.serverSettings + Self.settingsAck
                    + Self.frame(1, flags: 5, stream: 1, [0x88])
                    + Self.frame(1, flags: 4, stream: 3, [0x8C])
                    + Self.frame(0, flags: 1, stream: 3, Array(#"{"reason":"BadDeviceToken"}"#.utf8)))
        let events = events(session)
        guard case .settings(let limit) = events.first else { Issue.record("no settings event: \(events)"); return }
        #expect(limit > 100, "no limit said: libnghttp2's default")
        let ends = closed(events)
        #expect(ends.map { ($0.context as! Tag).name } == ["accepted", "refused"])
        #expect(ends.map(\.status) == [200, 400])
        #expect(ends.allSatisfy { $0.complete && $0.errorCode == 0 })
        #expect(ends[1].body == Array(#"{"reason":"BadDe"#.utf8), "kept up to maximumBodyBytes")
        #expect(session.openStreams == 0)
        #expect(try sent(session) == [Sent(type: 4, flags: 1, stream: 0)], "the server's SETTINGS acknowledged")
    }

    @Test func theServersStreamLimitHoldsRequestsBack() throws {
        let session = try HTTP2ClientSession()
        _ = try sent(session, preface: true)
        try receive(session, Self.frame(4, [0, 3] + Self.u32(1)))  // MAX_CONCURRENT_STREAMS 1
        #expect(events(session).count == 1)
        _ = try request(session, "a")
        _ = try request(session, "b")
        #expect(try sent(session).filter { $0.type == 1 }.map(\.stream) == [1], "one stream at a time")
        try receive(session, Self.frame(1, flags: 5, stream: 1, [0x88]))
        #expect(closed(events(session)).count == 1)
        #expect(try sent(session).filter { $0.type == 1 }.map(\.stream) == [3], "the next once the first closed")
    }

    @Test func aResetStreamEndsWithItsCodeAndItsLateAnswerIsIgnored() throws {
        let session = try HTTP2ClientSession()
        _ = try sent(session, preface: true)
        _ = try request(session, "server-reset")
        _ = try request(session, "timed-out")
        _ = try request(session, "answered")
        _ = try sent(session)
        try receive(session, Self.serverSettings + Self.frame(3, stream: 1, Self.u32(2)))  // INTERNAL_ERROR
        session.reset(streamID: 3)
        #expect(try sent(session).contains(Sent(type: 3, flags: 0, stream: 3)), "RST_STREAM sent")
        // The answer to the stream reset here arrives after all, then another stream's.
        try receive(session, Self.frame(1, flags: 5, stream: 3, [0x88]) + Self.frame(1, flags: 5, stream: 5, [0x88]))
        let ends = closed(events(session))
        #expect(ends.map { ($0.context as! Tag).name } == ["server-reset", "timed-out", "answered"])
        #expect(ends.map(\.errorCode) == [2, 8, 0])  // INTERNAL_ERROR, CANCEL, NO_ERROR
        #expect(ends.map(\.complete) == [false, false, true])
    }

    @Test func aGoAwayRefusesTheStreamsAboveItsLastID() throws {
        let session = try HTTP2ClientSession()
        _ = try sent(session, preface: true)
        for name in ["kept", "refused", "refused too"] { _ = try request(session, name) }
        _ = try sent(session)
        try receive(session, Self.serverSettings + Self.frame(7, Self.u32(1) + Self.u32(0)))
        let events = events(session)
        #expect(events.contains { if case .goAway(1, 0) = $0 { return true } else { return false } })
        let ends = closed(events)
        #expect(ends.map { ($0.context as! Tag).name } == ["refused", "refused too"])
        #expect(ends.allSatisfy { $0.errorCode == 7 && !$0.complete }, "REFUSED_STREAM: safe to retry")
        try receive(session, Self.frame(1, flags: 5, stream: 1, [0x88]))
        #expect(closed(self.events(session)).map(\.status) == [200], "the stream below the last ID completes")
        // A request after the GOAWAY is never sent: refused too.
        _ = try request(session, "after")
        #expect(try sent(session).filter { $0.type == 1 }.isEmpty)
        #expect(closed(self.events(session)).map { "\(($0.context as! Tag).name) \($0.errorCode)" } == ["after 7"])
    }

    @Test func pingsAreAcknowledged() throws {
        let session = try HTTP2ClientSession()
        _ = try sent(session, preface: true)
        session.ping(42)
        #expect(try sent(session) == [Sent(type: 6, flags: 0, stream: 0)])
        try receive(session, Self.serverSettings + Self.frame(6, flags: 1, [0, 0, 0, 0, 0, 0, 0, 42]))
        #expect(events(session).contains { if case .pingAcknowledged = $0 { return true } else { return false } })
    }

    @Test func garbageEndsTheSessionAndAbandonEndsEveryStreamOnce() throws {
        let session = try HTTP2ClientSession()
        _ = try sent(session, preface: true)
        _ = try request(session, "a")
        _ = try request(session, "b")
        _ = try sent(session)
        // Not HTTP/2 (a proxy's HTTP/1.1 answer): a connection error. libnghttp2 says why in a GOAWAY
        // and is done; the driver sees `isAlive` false and closes the connection.
        try? receive(session, Array("HTTP/1.1 400 Bad Request\r\n\r\n".utf8))
        #expect(try sent(session).contains { $0.type == 7 }, "GOAWAY sent")
        #expect(!session.isAlive)
        session.abandonStreams()
        let ends = closed(events(session))
        #expect(ends.map { ($0.context as! Tag).name } == ["a", "b"])
        #expect(ends.allSatisfy { !$0.complete && $0.errorCode == 8 })
        #expect(session.openStreams == 0)
        try receive(session, Self.frame(1, flags: 5, stream: 1, [0x88]))
        #expect(closed(events(session)).isEmpty, "nothing after the connection is given up")
    }
}
