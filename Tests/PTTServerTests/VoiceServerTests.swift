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

@Suite(.serialized, .timeLimit(.minutes(2))) struct VoiceServerTests {
    @Test func membersJoinSeeTheRosterAndAudioReachesListenersByteForByte() async throws {
        let fixture = try await ServerFixture()
        let (task, listening) = try await fixture.start()
        defer { task.cancel() }
        let ann = try await fixture.member("ann", port: listening.voicePort)
        let bob = try await fixture.member("bob", port: listening.voicePort)
        let cat = try await fixture.member("cat", port: listening.voicePort, capabilities: [.listen])
        guard case .joined(let info, _, let roster, _, _)? = cat.messages.first else { Issue.record("no joined"); return }
        #expect(info.name == "Ops" && info.id == fixture.channel.id)
        #expect(roster.map(\.userID) == ["cat", "ann", "bob"], "its own entry first, then the rest in slot order")
        #expect(await ann.waitFor { if case .participant(let p) = $0 { return p.userID == "cat" } else { return false } } != nil)

        try await ann.send(.floorRequest())
        let granted = try #require(await ann.waitForFloor(.granted))
        let burst = try #require(granted.burst)
        #expect(await bob.waitForFloor(.taken)?.slot == slot(of: ann))

        var generator = SplitMix64(seed: 7)
        let payloads = (0..<20).map { _ in (0..<80).map { _ in UInt8.random(in: 0...255, using: &generator) } }
        for (sequence, payload) in payloads.enumerated() {
            #expect(await ann.sendAudio(burst: burst, sequence: UInt16(sequence), payload: payload))
        }
        for listener in [bob, cat] {
            let received = await listener.waitForAudio(count: 20)
            #expect(received.count == 20)
            let headers = received.map { packet in packet.withUnsafeBytes { AudioHeader(parsing: $0) } }
            #expect(headers.allSatisfy { $0?.slot == slot(of: ann) && $0?.burst == burst && $0?.flags == [] })
            #expect(Set(received.map { Array($0[AudioHeader.size...]) }) == Set(payloads))
        }
        try await Task.sleep(for: .milliseconds(100))
        #expect(ann.audio.isEmpty, "audio went back to the talker")

        // A listen-only member cannot take the floor.
        try await cat.send(.floorRequest())
        let denied = try #require(await cat.waitForFloor(.denied))
        #expect(denied.cause == .notAllowed)
        try await ann.send(.floorRelease)
        #expect(await bob.waitForFloor(.idle) != nil)
        await listening.shutdown()
        _ = await task.result
    }

    /// Over real UDP: a client's close with code 0 (on purpose) shows its member offline at once; one
    /// with `goingAway` (a reconnect) shows it reconnecting for the grace, as a dropped connection.
    @Test func aCloseOnPurposeIsOfflineAtOnceAndAReconnectsCloseKeepsTheGrace() async throws {
        let fixture = try await ServerFixture()
        let (task, listening) = try await fixture.start()
        defer { task.cancel() }
        let ann = try await fixture.member("ann", port: listening.voicePort)
        let bob = try await fixture.member("bob", port: listening.voicePort)
        let cat = try await fixture.member("cat", port: listening.voicePort)
        func seen(_ user: String) -> [ConnectionState] {
            ann.messages.compactMap { if case .participant(let p) = $0, p.userID == user { p.connection } else { nil } }
        }
        await bob.close(code: CloseCode.normal.rawValue)
        #expect(await ann.waitFor { if case .participant(let p) = $0 { p.userID == "bob" && p.connection == .offline } else { false } } != nil)
        #expect(!seen("bob").contains(.reconnecting), "\(seen("bob"))")
        await cat.close(code: CloseCode.goingAway.rawValue)
        #expect(await ann.waitFor { if case .participant(let p) = $0 { p.userID == "cat" && p.connection == .reconnecting } else { false } } != nil,
                "\(seen("cat"))")
        await listening.shutdown()
        _ = await task.result
    }

    @Test func contentionQueuesAndPriorityPreempts() async throws {
        let fixture = try await ServerFixture()
        let (task, listening) = try await fixture.start()
        defer { task.cancel() }
        let ann = try await fixture.member("ann", port: listening.voicePort)
        let bob = try await fixture.member("bob", port: listening.voicePort)
        let chief = try await fixture.member("chief", port: listening.voicePort, priority: 200)
        try await ann.send(.floorRequest())
        #expect(await ann.waitForFloor(.granted) != nil)
        try await bob.send(.floorRequest())
        #expect(await bob.waitForFloor(.queued)?.position == 1)
        try await ann.send(.floorRelease)
        #expect(await bob.waitForFloor(.granted) != nil)
        try await chief.send(.floorRequest())
        let revoked = try #require(await bob.waitForFloor(.revoked))
        #expect(revoked.cause == .preempted)
        #expect(revoked.reason?.contains("Chief") == true)
        #expect(await chief.waitForFloor(.granted) != nil)
        await listening.shutdown()
        _ = await task.result
    }

    @Test func badTokensAreRefusedWithTheirOwnCodes() async throws {
        let fixture = try await ServerFixture()
        let (task, listening) = try await fixture.start()
        defer { task.cancel() }
        let otherChannel = try await fixture.token("ann", channel: UUID())
        let expired = try await fixture.token("ann", ttl: -60)
        let stranger = try await TokenAuthority(privateKeyPEM: P256.Signing.PrivateKey().pemRepresentation).issue(ParticipantClaims(
            userID: "ann", name: "Ann", channel: fixture.channel.id, capabilities: [.talk], expiresAt: Date().addingTimeInterval(600)))
        for (token, code) in [(otherChannel, RefusalCode.tokenWrongChannel), (expired, .tokenExpired), (stranger, .tokenForged),
                              ("not.a.token", .tokenMalformed)] {
            let member = try TestMember(port: listening.voicePort, configuration: fixture.pki.client())
            try await member.connect()
            let answer = try await member.join(token: token, channel: fixture.channel.id)
            guard case .refused(let got, let reason)? = answer else { Issue.record("not refused: \(String(describing: answer))"); continue }
            #expect(got == code, "\(reason)")
            #expect(await member.waitForEvent { if case .connection(.closed) = $0 { return true } else { return false } } != nil)
        }
        await listening.shutdown()
        _ = await task.result
    }

    /// A channel deleted by another process (the CLI) is gone for joins at once, not only after the
    /// server's next revision poll: a join in that second would land in a channel with no rows.
    @Test func aJoinRightAfterTheChannelIsDeletedElsewhereIsRefused() async throws {
        let fixture = try await ServerFixture()
        let (task, listening) = try await fixture.start()
        defer { task.cancel() }
        let token = try await fixture.token("ann")
        let member = try TestMember(port: listening.voicePort, configuration: fixture.pki.client())
        try await member.connect()
        try await fixture.withStore { try await $0.deleteChannel(fixture.channel.id) }
        let answer = try await member.join(token: token, channel: fixture.channel.id)
        guard case .refused(let code, let reason)? = answer else { Issue.record("not refused: \(String(describing: answer))"); return }
        #expect(code == .channelNotFound && reason.contains("does not exist"), "\(reason)")
        await listening.shutdown()
        _ = await task.result
    }

    /// A channel made by another process (`squelchd channel create`) is joinable at once, not only
    /// after the next revision poll; and a join to it sees it, under its name.
    @Test func aJoinRightAfterAChannelIsCreatedElsewhereIsAdmitted() async throws {
        let fixture = try await ServerFixture()
        let (task, listening) = try await fixture.start()
        defer { task.cancel() }
        try await Task.sleep(for: .milliseconds(1_500))  // past the first polls: only a change would load it
        let fresh = ChannelRecord(name: "Made elsewhere", mode: .halfDuplex, maxBurstSeconds: 30)
        try await fixture.withStore { try await $0.createChannel(fresh) }
        let member = try TestMember(port: listening.voicePort, configuration: fixture.pki.client())
        try await member.connect()
        let answer = try await member.join(token: try await fixture.token("ann", channel: fresh.id), channel: fresh.id)
        guard case .joined(let info, _, _, _, _)? = answer else { Issue.record("not joined: \(String(describing: answer))"); return }
        #expect(info.id == fresh.id && info.name == "Made elsewhere" && info.maxBurstSeconds == 30)
        await listening.shutdown()
        _ = await task.result
    }

    /// An admin's removal and revocation end the member's live session and keep its old token out; a
    /// token issued after the removal gets back in.
    @Test func removedMembersAndRevokedTokensAreKeptOut() async throws {
        let fixture = try await ServerFixture()
        let (task, listening) = try await fixture.start()
        defer { task.cancel() }
        func admin(_ method: String, _ path: String, json: String? = nil) async throws -> (status: Int, body: String) {
            try await fixture.admin(listening, method, path, json: json)
        }
        func join(_ token: String) async throws -> (TestMember, ServerMessage?) {
            let member = try TestMember(port: listening.voicePort, configuration: fixture.pki.client())
            try await member.connect()
            return (member, try await member.join(token: token, channel: fixture.channel.id))
        }
        func refusal(_ message: ServerMessage?) -> RefusalCode? { if case .refused(let code, _)? = message { code } else { nil } }

        // Bob is removed: his session ends with the reason, and the token he holds no longer joins.
        let bobToken = try await fixture.token("bob")
        let (bob, bobJoined) = try await join(bobToken)
        guard case .joined? = bobJoined else { Issue.record("bob not admitted: \(String(describing: bobJoined))"); return }
        // At once: the join's row may not be written yet, and the API asks the hub as well.
        #expect(try await admin("DELETE", "/members/bob").status == 204)
        let told = await bob.waitFor { if case .refused(.removedByAdmin, _) = $0 { true } else { false } }
        #expect(told != nil, "\(bob.messages)")
        // His row is gone for good, even if the join's own write reached the database after the API
        // deleted it: the hub queued a removal behind that write.
        var polls = 0
        while try await admin("GET", "/members").body.contains("\"bob\""), polls < 200 {
            try await Task.sleep(for: .milliseconds(10))
            polls += 1
        }
        #expect(try await !admin("GET", "/members").body.contains("\"bob\""))
        let (_, again) = try await join(bobToken)
        #expect(refusal(again) == .tokenRevoked, "\(String(describing: again))")
        try await Task.sleep(for: .milliseconds(20))  // a token issued after the removal, not in its millisecond
        let (bob2, fresh) = try await join(try await fixture.token("bob"))
        guard case .joined? = fresh else { Issue.record("a new token did not admit bob: \(String(describing: fresh))"); return }

        // Ann's token is revoked by its id while she is connected: she is told why and leaves the roster.
        let issued = try await admin("POST", "/tokens", json: #"{"user":"ann","name":"Ann"}"#)
        let annToken = try #require((try JSONSerialization.jsonObject(with: Data(issued.body.utf8)) as? [String: Any])?["token"] as? String)
        let tokenID = try #require((try JSONSerialization.jsonObject(with: Data(issued.body.utf8)) as? [String: Any])?["tokenID"] as? String)
        let (ann, annJoined) = try await join(annToken)
        guard case .joined(_, let annSlot, _, _, _)? = annJoined else { Issue.record("ann not admitted: \(String(describing: annJoined))"); return }
        let before = bob2.messages.count
        let revoked = try await admin("POST", "/revocations", json: #"{"tokenID":"\#(tokenID)","reason":"phone lost"}"#)
        #expect(revoked.status == 201, "\(revoked.body)")
        let annTold = await ann.waitFor { if case .refused(.tokenRevoked, let why) = $0 { why.contains("phone lost") } else { false } }
        #expect(annTold != nil, "\(ann.messages)")
        #expect(await bob2.waitFor(after: before) { $0 == .participantLeft(slot: annSlot, userID: "ann") } != nil)
        let (_, annAgain) = try await join(annToken)
        #expect(refusal(annAgain) == .tokenRevoked)
        await listening.shutdown()
        _ = await task.result
    }

    /// A channel's roster grows with everyone who ever joined it. 4,000 stored members with user ids,
    /// names and roles near their longest come to about 1.7 MB of roster, more than a connection's
    /// control stream buffers (1 MiB): the joiner still gets every entry, a chunk at a time as its
    /// stream has room, and a change made meanwhile is what its roster shows in the end. A member
    /// removed while its own roster is being sent gets its refusal.
    @Test func aRosterLargerThanTheControlStreamBufferArrivesWhole() async throws {
        let fixture = try await ServerFixture()
        let stored = 4_000
        let database = try DatabaseQueue(path: fixture.dataDirectory + "/" + SQLiteChannelStore.defaultFileName)
        try await database.write { db in
            for index in 0..<stored {
                try db.execute(sql: """
                    INSERT INTO member (channel_id, user_id, display_name, joined_at, last_seen, can_talk, can_listen, role, priority)
                    VALUES (?, ?, ?, 0, 0, 1, 1, ?, 0)
                    """, arguments: [fixture.channel.id.uuidString, String(format: "%05d-", index) + String(repeating: "u", count: 240),
                                     "Member " + String(repeating: "n", count: 50), String(repeating: "r", count: 60)])
            }
        }
        try database.close()
        let (task, listening) = try await fixture.start()
        defer { task.cancel() }
        let ann = try await fixture.member("ann", port: listening.voicePort)
        // At once, while most of the roster is still to come: the answer may arrive between roster
        // messages, and the roster, applied in order, must end up showing it.
        try await ann.send(.setMuted(true))
        func roster() -> [UInt16: RosterMember] { rosterEntries(ann.messages) }
        #expect(await eventually(seconds: 30) { roster().count == stored + 1 }, "\(roster().count) of \(stored + 1) roster entries")
        #expect(await eventually { roster().values.first { $0.userID == "ann" }?.muted == true })
        #expect(Set(roster().values.map(\.userID)).count == stored + 1)

        // Removed while the roster waits: what waited is dropped, and the refusal arrives before the close.
        let bob = try await fixture.member("bob", port: listening.voicePort)
        #expect(try await fixture.admin(listening, "DELETE", "/members/bob").status == 204)
        let refusal = await bob.waitFor { if case .refused = $0 { true } else { false } }
        guard case .refused(let code, _)? = refusal else { Issue.record("no refusal: \(bob.messages.count) messages"); return }
        #expect(code == .removedByAdmin)
        await bob.close()
        await listening.shutdown()
        _ = await task.result
    }
}

