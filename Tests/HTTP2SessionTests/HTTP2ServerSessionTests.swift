import CNGHTTP2
import HTTP2Session
import Testing

/// The server session against the client session, both without I/O, bytes carried between them here.
@Suite struct HTTP2ServerSessionTests {
    final class Tag {
        let name: String
        init(_ name: String) { self.name = name }
    }

    static let maxStreams = Int32(NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS.rawValue)

    /// A client and a server with what each side has seen.
    final class Pair {
        let client: HTTP2ClientSession
        let server: HTTP2ServerSession
        var requests: [HTTP2ServerSession.Request] = []
        var serverClosed: [(id: Int32, code: UInt32)] = []
        var mostOpen = 0
        var clientEvents: [HTTP2ClientSession.Event] = []

        init(limit: UInt32 = 100, maximumBodyBytes: Int = 1_024) throws {
            client = try HTTP2ClientSession()
            server = try HTTP2ServerSession(settings: [(HTTP2ServerSessionTests.maxStreams, limit)], maximumBodyBytes: maximumBodyBytes)
        }

        /// Carries bytes both ways until neither side has any.
        func pump() throws {
            for _ in 0..<100 {
                var toServer: [UInt8] = [], toClient: [UInt8] = []
                try client.send { toServer += $0 }
                try toServer.withUnsafeBytes { try server.receive($0) }
                server.drainEvents { event in
                    switch event {
                    case .opened(_, let open): mostOpen = max(mostOpen, open)
                    case .request(let request): requests.append(request)
                    case .closed(let id, let code, _): serverClosed.append((id, code))
                    }
                }
                try server.send { toClient += $0 }
                try toClient.withUnsafeBytes { try client.receive($0) }
                client.drainEvents { clientEvents.append($0) }
                if toServer.isEmpty && toClient.isEmpty { return }
            }
            Issue.record("the sessions never went quiet")
        }

        var closed: [HTTP2ClientSession.Closed] {
            clientEvents.compactMap { if case .closed(let closed) = $0 { return closed } else { return nil } }
        }

        @discardableResult
        func request(_ name: String, body: [UInt8] = Array("{}".utf8), contentLength: Int? = nil) throws -> Int32 {
            var headers = HTTP2HeaderList()
            headers.add(":method", "POST")
            headers.add(":scheme", "https")
            headers.add(":path", "/3/device/", name)
            headers.add(":authority", "localhost")
            headers.add("apns-topic", "org.example.voip-ptt")
            headers.add("content-length", String(contentLength ?? body.count))
            return try client.submitRequest(headers: headers, body: body, context: Tag(name))
        }

        func respond(_ id: Int32, status: Int, body: [UInt8]? = nil) throws {
            var headers = HTTP2HeaderList()
            headers.add(":status", String(status))
            headers.add("apns-id", "00000000-0000-4000-8000-00000000000\(id % 10)")
            if let body { headers.add("content-length", String(body.count)) }
            try server.respond(streamID: id, headers: headers, body: body)
        }
    }

    @Test func requestsArriveWholeAndAreAnswered() throws {
        let pair = try Pair()
        try pair.request("a1")
        try pair.request("b2", body: Array(#"{"aps":{}}"#.utf8))
        try pair.pump()
        #expect(pair.requests.count == 2)
        let first = try #require(pair.requests.first)
        #expect(first.headers.map(\.name) == [":method", ":scheme", ":path", ":authority", "apns-topic", "content-length"])
        #expect(first.headers.first { $0.name == ":path" }?.value == "/3/device/a1")
        #expect(pair.requests.map(\.body) == [Array("{}".utf8), Array(#"{"aps":{}}"#.utf8)])
        try pair.respond(1, status: 200)
        try pair.respond(3, status: 400, body: Array(#"{"reason":"BadDeviceToken"}"#.utf8))
        try pair.pump()
        #expect(pair.closed.map { ($0.context as! Tag).name } == ["a1", "b2"])
        #expect(pair.closed.map(\.status) == [200, 400])
        #expect(pair.closed.map(\.body) == [[], Array(#"{"reason":"BadDeviceToken"}"#.utf8)])
        #expect(pair.closed.allSatisfy { $0.complete })
        #expect(pair.serverClosed.map(\.id) == [1, 3])
        #expect(pair.server.openStreams == 0)
        #expect(pair.server.highestStreamID == 3)
    }

    @Test func theAnnouncedLimitHoldsUntilRaised() throws {
        let pair = try Pair(limit: 1)
        try pair.pump()
        for index in 0..<5 { try pair.request("t\(index)") }
        try pair.pump()
        #expect(pair.requests.count == 1, "one stream until the limit is raised")
        try pair.server.submitSettings([(Self.maxStreams, 1_000)])
        try pair.respond(1, status: 200)
        try pair.pump()
        #expect(pair.requests.count == 5)
        #expect(pair.mostOpen == 4)
    }

    @Test func aLongBodyIsKeptInPartAndMeasuredWhole() throws {
        let pair = try Pair(maximumBodyBytes: 8)
        try pair.request("long", body: [UInt8](repeating: 0x61, count: 5_000))
        try pair.pump()
        #expect(pair.requests.first?.body.count == 8)
        #expect(pair.requests.first?.bodyLength == 5_000)
    }

    @Test func aBodyThatBeliesItsContentLengthIsReset() throws {
        let pair = try Pair()
        try pair.request("liar", body: Array("{}".utf8), contentLength: 40)
        try pair.pump()
        #expect(pair.requests.isEmpty, "never handed over")
        #expect(pair.closed.map(\.errorCode) == [NGHTTP2_PROTOCOL_ERROR.rawValue])
    }

    @Test func goAwayLetsTheOpenStreamsFinish() throws {
        let pair = try Pair()
        try pair.request("kept")
        try pair.pump()
        pair.server.goAway(lastStreamID: pair.server.highestStreamID, errorCode: 0, debugData: Array(#"{"reason":"Shutdown"}"#.utf8))
        try pair.pump()
        #expect(pair.clientEvents.contains { if case .goAway(1, 0) = $0 { return true } else { return false } })
        try pair.respond(1, status: 200)
        try pair.pump()
        #expect(pair.closed.map(\.status) == [200])
        #expect(pair.server.openStreams == 0)
    }

    @Test func bytesThatAreNotHTTP2AreRefused() throws {
        let server = try HTTP2ServerSession(settings: [], maximumBodyBytes: 16)
        #expect(throws: HTTP2ProtocolError.self) {
            try Array("GET / HTTP/1.1\r\nHost: x\r\n\r\n".utf8).withUnsafeBytes { try server.receive($0) }
        }
    }
}
