import APNsSimulatorEmbedding
import ChannelProtocol
import ChannelStore
import ChannelStoreSQLite
import Crypto
import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import GRDB
import ParticipantClaims
import ParticipantTokens
import PTTServer
import SeededRandom
import ServerTesting
import SquelchTesting
import Testing
import Wire
import WireTesting

extension VoiceServerTests {
    @Test(.timeLimit(.minutes(1))) func aHalfSentAdminRequestCannotHoldUpTheShutdown() async throws {
        let fixture = try await ServerFixture()
        let (task, listening) = try await fixture.start(shutdownLimit: .seconds(2))
        let bob = try await fixture.member("bob", port: listening.voicePort)
        // An admin client sends its headers and 10 of the 100 body bytes it announced, then stalls.
        let stalled = StalledRequest(port: listening.adminPort, authorization: "Bearer \(TestServer.adminKey)")
        #expect(stalled != nil)
        defer { withExtendedLifetime(stalled) {} }
        try await Task.sleep(for: .milliseconds(200))
        let start = ContinuousClock.now
        await listening.shutdown()
        try await task.value  // a stop cut short by the limit is still a clean exit for `serve`
        let took = ContinuousClock.now - start
        #expect(took < .seconds(10), "the shutdown took \(took)")
        // The voice service still said goodbye.
        let closed = await bob.waitForEvent {
            if case .connection(.closed(.peer(let code, _, true))) = $0 { return code == CloseCode.goingAway.rawValue } else { return false }
        }
        #expect(closed != nil, "no going-away close")
    }

    @Test func aRestartKeepsChannelsMembersAndPushTokens() async throws {
        let fixture = try await ServerFixture()
        var (task, listening) = try await fixture.start()
        let ann = try await fixture.member("ann", port: listening.voicePort)
        try await ann.send(.registerPushToken(token: "0a1b2c3d", environment: .sandbox))
        #expect(await ann.waitFor { $0 == .pushTokenRegistered } != nil)
        let bob = try await fixture.member("bob", port: listening.voicePort)
        try await ann.send(.floorRequest())
        let before = try #require(await ann.waitForFloor(.granted)?.burst)
        try await ann.send(.floorRelease)
        #expect(await bob.waitForFloor(.idle) != nil)

        await listening.shutdown()
        try await task.value
        let status = await bob.waitFor { if case .serviceStatus(.unavailable, _) = $0 { return true } else { return false } }
        #expect(status != nil, "members were not told the server is going away")
        let closed = await bob.waitForEvent {
            if case .connection(.closed(.peer(let code, _, true))) = $0 { return code == CloseCode.goingAway.rawValue } else { return false }
        }
        #expect(closed != nil, "no going-away close")

        (task, listening) = try await fixture.start()
        defer { task.cancel() }
        let again = try await fixture.member("bob", port: listening.voicePort)
        guard case .joined(_, _, let roster, _, _)? = again.messages.first else { Issue.record("no joined"); return }
        #expect(roster.first { $0.userID == "ann" }?.connection == .offline)
        // Were each channel's burst numbers to start again at 1, a talker given its old slot would have
        // its first burst taken by listeners for the one they finished before the restart (a random
        // start repeats it once in 65535 restarts).
        try await again.send(.floorRequest())
        let after = try #require(await again.waitForFloor(.granted)?.burst)
        #expect(after != before, "burst \(after) again after the restart")
        await listening.shutdown()
        try await task.value

        let store = try SQLiteChannelStore(directory: fixture.dataDirectory)
        let members = try await store.members(of: fixture.channel.id)
        #expect(Set(members.map(\.userID)) == ["ann", "bob"])
        #expect(members.first { $0.userID == "ann" }?.pushToken == "0a1b2c3d")
        #expect(members.first { $0.userID == "ann" }?.pushEnvironment == .sandbox)
        let log = try await store.transmissions(of: fixture.channel.id, limit: 10)
        #expect(log.map(\.userID) == ["bob", "ann"], "newest first: \(log)")
        #expect(log.last?.endReason == "released" && log.first?.endReason == "shutdown", "\(log)")
        try await store.close()
    }

    /// `squelchd token revoke` while the server is down: the offline member whose token it voids is gone
    /// once the server is back (not left in the roster, woken by every burst), and one with another
    /// token stays.
    @Test func aTokenRevokedWhileTheServerWasDownRemovesItsOfflineMember() async throws {
        let fixture = try await ServerFixture()
        let store = try SQLiteChannelStore(directory: fixture.dataDirectory)
        let now = Date()
        for (user, tokenID) in [("lost", "lost-1"), ("kept", "kept-1")] {
            try await store.upsertMember(MemberRecord(
                channelID: fixture.channel.id, userID: user, displayName: user.capitalized, pushToken: "0a1b", pushEnvironment: .sandbox,
                grant: MemberGrant(canTalk: true, canListen: true, role: nil, priority: 0, tokenID: tokenID,
                                   tokenIssuedAt: now.addingTimeInterval(-60), tokenExpiresAt: now.addingTimeInterval(3600))))
        }
        _ = try await store.revoke(.token("lost-1", channel: fixture.channel.id, user: "lost", expiresAt: now.addingTimeInterval(3600),
                                          at: now, reason: "phone lost"))
        try await store.close()

        let (task, listening) = try await fixture.start()
        let bob = try await fixture.member("bob", port: listening.voicePort)
        guard case .joined(_, _, let roster, _, _)? = bob.messages.first else { Issue.record("no joined"); return }
        #expect(Set(roster.map(\.userID)) == ["kept", "bob"])
        await listening.shutdown()
        try await task.value
        let reopened = try SQLiteChannelStore(directory: fixture.dataDirectory)
        #expect(Set(try await reopened.members(of: fixture.channel.id).map(\.userID)) == ["kept", "bob"])
        try await reopened.close()
    }

    /// Another process holds the database's write lock for longer than squelchd waits: talk goes on,
    /// `/healthz` says the writes are failing and why, and recovers once the writes go through.
    @Test func healthzReportsDatabaseWritesThatFailAndRecovers() async throws {
        let fixture = try await ServerFixture()
        let (task, listening) = try await fixture.start()
        defer { task.cancel() }
        func health() async throws -> (status: Int, body: String) {
            var request = URLRequest(url: try #require(URL(string: "http://127.0.0.1:\(listening.adminPort)/healthz")))
            request.setValue("Bearer \(TestServer.adminKey)", forHTTPHeaderField: "Authorization")  // the reason is for the admin
            let (body, response) = try await URLSession.shared.data(for: request)
            return ((response as? HTTPURLResponse)?.statusCode ?? 0, String(decoding: body, as: UTF8.self))
        }
        #expect(try await health().status == 200)
        let lock = try WriteLockHolder(path: "\(fixture.dataDirectory)/\(SQLiteChannelStore.defaultFileName)")
        // Joining reads the store (revocations), which the lock allows, and queues the member's row.
        let ann = try await fixture.member("ann", port: listening.voicePort)
        let bob = try await fixture.member("bob", port: listening.voicePort)
        // The first write fails once squelchd's busy timeout (5 s) passes.
        var answer = try await health()
        #expect(try await eventually(seconds: 20, every: .milliseconds(200)) {
            answer = try await health()
            return answer.status == 503
        })
        #expect(answer.body.contains("database writes have failed"), "\(answer.body)")
        #expect(answer.body.contains("locked"), "\(answer.body)")
        try await ann.send(.floorRequest())
        #expect(await ann.waitForFloor(.granted) != nil, "talk goes on while the database is failing")
        #expect(await bob.waitForFloor(.taken) != nil)
        lock.unlock()
        #expect(try await eventually(seconds: 20, every: .milliseconds(100)) {
            answer = try await health()
            return answer.status == 200
        }, "\(answer.body)")
    }

    /// A service group is cancelled, not shut down, when one of its services fails. The hub's last
    /// writes (members' last-seen times, the burst in progress) must still reach the database.
    @Test func aCancelledServerStillWritesItsLastUpdates() async throws {
        let fixture = try await ServerFixture()
        let (task, listening) = try await fixture.start()
        let ann = try await fixture.member("ann", port: listening.voicePort)
        let bob = try await fixture.member("bob", port: listening.voicePort)
        try await ann.send(.floorRequest())
        #expect(await ann.waitForFloor(.granted) != nil)
        #expect(await bob.waitForFloor(.taken) != nil)
        let cancelledAt = Date()

        task.cancel()
        _ = await task.result

        let store = try SQLiteChannelStore(directory: fixture.dataDirectory)
        let log = try await store.transmissions(of: fixture.channel.id, limit: 10)
        #expect(log.first?.userID == "ann" && log.first?.endReason == "shutdown", "\(log)")
        let members = try await store.members(of: fixture.channel.id)
        for user in ["ann", "bob"] {
            let seen = try #require(members.first { $0.userID == user }?.lastSeen)
            #expect(seen >= cancelledAt.addingTimeInterval(-0.001), "\(user) last seen \(seen), cancelled at \(cancelledAt)")
        }
        try await store.close()
    }

    /// Transport trouble shows in /metrics: handshakes by outcome (a member's completes, a client that
    /// distrusts the certificate fails), and a datagram that names no connection.
    @Test func handshakesAndStrayDatagramsAreCountedInMetrics() async throws {
        let fixture = try await ServerFixture()
        let (task, listening) = try await fixture.start()
        let ann = try await fixture.member("ann", port: listening.voicePort)
        let stranger = try TestMember(port: listening.voicePort, configuration: TestPKI(name: "Another CA").client())
        await #expect(throws: ConnectionError.self) { try await stranger.connect() }
        // One byte to the voice port, from a plain socket: too short to name a connection.
        let socket = Glibc.socket(AF_INET, Int32(SOCK_DGRAM.rawValue), 0)
        #expect(socket >= 0)
        defer { close(socket) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(listening.voicePort).bigEndian)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let sent = withUnsafePointer(to: &address) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { target in
                [UInt8](repeating: 0x40, count: 1).withUnsafeBytes { bytes in
                    sendto(socket, bytes.baseAddress, 1, 0, target, socklen_t(MemoryLayout<sockaddr_in>.size))
                }
            }
        }
        #expect(sent == 1)
        let wanted = ["squelch_handshakes_total{outcome=\"completed\"} 1\n", "squelch_handshakes_total{outcome=\"failed\"} 1\n",
                      "squelch_transport_datagrams_dropped_total{reason=\"unroutable\"} 1\n"]
        var text = ""
        let counted = try await eventually(seconds: 15) {
            text = try await fixture.metrics(listening)
            return wanted.allSatisfy { text.contains($0) }
        }
        #expect(counted, "\(text.split(separator: "\n").filter { $0.contains("handshakes") || $0.contains("transport_") })")
        await ann.client.close()
        await listening.shutdown()
        _ = await task.result
    }
}
