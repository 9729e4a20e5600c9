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

/// squelchd end to end in this process: the real server (UDP transport on 127.0.0.1, SQLite in a
/// temporary data directory, the admin API) and real clients on their own UDP sockets.
final class ServerFixture: Sendable {
    let pki: TestPKI
    let identity: ServerIdentity
    let dataDirectory: String
    let channel: ChannelRecord

    init(mode: TransmissionMode = .halfDuplex) async throws {
        pki = try TestPKI()
        identity = try pki.identity()
        dataDirectory = FileManager.default.temporaryDirectory.appendingPathComponent("squelchd-test-\(UUID())").path
        try FileManager.default.createDirectory(atPath: dataDirectory, withIntermediateDirectories: true)
        channel = ChannelRecord(name: "Ops", mode: mode, maxBurstSeconds: 60)
        let store = try SQLiteChannelStore(directory: dataDirectory)
        try await store.createChannel(channel)
        try await store.close()
    }

    deinit { try? FileManager.default.removeItem(atPath: dataDirectory) }

    /// Starts squelchd on free ports; returns once both listeners are up.
    /// With `pushCertificates` (a directory made by certs/make-dev-certs.sh), pushes go to the embedded
    /// APNs simulator on free ports; without, pushes are off.
    func start(pushCertificates: String? = nil, wakeSilence: Double? = nil,
               transmissionLogDays: Int? = nil, memberRetentionDays: Int? = nil,
               shutdownLimit: Duration? = nil) async throws -> (task: Task<Void, any Error>, listening: SquelchServer.Listening) {
        var configuration = TestServer.configuration(dataDirectory: dataDirectory, pushCertificates: pushCertificates)
        if let wakeSilence { configuration.pushWakeSilenceSeconds = wakeSilence }
        if let transmissionLogDays { configuration.transmissionLogDays = transmissionLogDays }
        if let memberRetentionDays { configuration.memberRetentionDays = memberRetentionDays }
        return try await TestServer.start(configuration, identity: identity, shutdownLimit: shutdownLimit)
    }

    func token(_ user: String, capabilities: Set<Capability> = [.talk, .listen], priority: UInt8 = 0,
               channel: UUID? = nil, ttl: TimeInterval = 3600) async throws -> String {
        let authority = try await TokenAuthority.loadOrCreate(in: dataDirectory)
        return try await authority.issue(ParticipantClaims(
            userID: user, name: user.capitalized, channel: channel ?? self.channel.id, capabilities: capabilities,
            priority: priority, expiresAt: Date().addingTimeInterval(ttl)))
    }

    /// A connected member that has joined; fails the test if the join is refused.
    func member(_ user: String, port: Int, capabilities: Set<Capability> = [.talk, .listen], priority: UInt8 = 0) async throws -> TestMember {
        let member = try TestMember(port: port, configuration: pki.client())
        try await member.connect()
        let answer = try await member.join(token: try await token(user, capabilities: capabilities, priority: priority), channel: channel.id)
        guard case .joined? = answer else { throw FixtureError.notJoined(user, answer) }
        return member
    }

    enum FixtureError: Error { case notJoined(String, ServerMessage?) }

    /// The data directory's store for `body`, as another process would open it; closed after.
    func withStore<T>(_ body: (SQLiteChannelStore) async throws -> T) async throws -> T {
        let store = try SQLiteChannelStore(directory: dataDirectory)
        do {
            let result = try await body(store)
            try await store.close()
            return result
        } catch {
            try? await store.close()
            throw error
        }
    }

    /// An admin API call on this fixture's channel (`path` after `/v1/channels/<id>`).
    func admin(_ listening: SquelchServer.Listening, _ method: String, _ path: String, json: String? = nil) async throws -> (status: Int, body: String) {
        var request = URLRequest(url: try #require(URL(string: "http://127.0.0.1:\(listening.adminPort)/v1/channels/\(channel.id)\(path)")))
        request.httpMethod = method
        request.setValue("Bearer \(TestServer.adminKey)", forHTTPHeaderField: "Authorization")
        if let json {
            request.setValue("application/json", forHTTPHeaderField: "Content-Type")
            request.httpBody = Data(json.utf8)
        }
        let (body, response) = try await URLSession.shared.data(for: request)
        return ((response as? HTTPURLResponse)?.statusCode ?? 0, String(decoding: body, as: UTF8.self))
    }

    /// What `/healthz` says now, with its HTTP status.
    func health(_ listening: SquelchServer.Listening) async throws -> (status: Int, health: AdminAPI.Health) {
        let url = try #require(URL(string: "http://127.0.0.1:\(listening.adminPort)/healthz"))
        let (body, response) = try await URLSession.shared.data(from: url)
        let decoder = JSONDecoder()
        decoder.dateDecodingStrategy = .iso8601
        return ((response as? HTTPURLResponse)?.statusCode ?? 0, try decoder.decode(AdminAPI.Health.self, from: body))
    }

    /// What `/metrics` shows now.
    func metrics(_ listening: SquelchServer.Listening) async throws -> String {
        let url = try #require(URL(string: "http://127.0.0.1:\(listening.adminPort)/metrics"))
        return String(decoding: try await URLSession.shared.data(from: url).0, as: UTF8.self)
    }
}

/// The roster as a client holds it: every message applied in order, entries replaced by slot.
func rosterEntries(_ messages: [ServerMessage]) -> [UInt16: Participant] {
    var entries: [UInt16: Participant] = [:]
    for message in messages {
        switch message {
        case .joined(_, _, let chunk, _, _), .roster(let chunk): for entry in chunk { entries[entry.slot] = entry }
        case .participant(let entry): entries[entry.slot] = entry
        case .participantLeft(let slot, _): entries[slot] = nil
        default: break
        }
    }
    return entries
}

func slot(of member: TestMember) -> UInt16? {
    for message in member.messages { if case .joined(_, let you, _, _, _) = message { return you } }
    return nil
}

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
        func roster() -> [UInt16: Participant] { rosterEntries(ann.messages) }
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

    /// The transmission log keeps `transmissionLogDays`: a server starting with older records
    /// deletes them (and counts them in /metrics); newer ones, and the log with retention 0, stay.
    @Test func theTransmissionLogKeepsItsRetentionPeriod() async throws {
        let fixture = try await ServerFixture()
        let now = Date()
        try await fixture.withStore { store in
            for (user, days) in [("old", 31.0), ("older", 400), ("recent", 29)] {
                try await store.logTransmission(TransmissionRecord(channelID: fixture.channel.id, userID: user, startedAt: now.addingTimeInterval(-days * 86_400),
                                                                   durationMilliseconds: 2_000, endReason: "released"))
            }
        }
        func logged() async throws -> [String] {
            try await fixture.withStore { try await $0.transmissions(of: fixture.channel.id, limit: 10).map(\.userID) }
        }
        // 0 keeps everything (the first pruning runs as soon as the server listens).
        var (task, listening) = try await fixture.start(transmissionLogDays: 0)
        try await Task.sleep(for: .milliseconds(300))
        #expect(try await logged() == ["recent", "old", "older"])
        await listening.shutdown()
        _ = await task.result
        (task, listening) = try await fixture.start(transmissionLogDays: 30)
        defer { task.cancel() }
        #expect(try await eventually { try await logged() == ["recent"] })
        let metrics = try await fixture.metrics(listening)
        #expect(metrics.contains("squelch_transmissions_pruned_total 2"), "\(metrics)")
        await listening.shutdown()
        _ = await task.result
    }

    /// Stores members joined 90 days ago and last seen `daysAgo` before `now`.
    func storeMembers(_ fixture: ServerFixture, lastSeen members: [(user: String, daysAgo: Double)], now: Date) async throws {
        try await fixture.withStore { store in
            for (user, days) in members {
                try await store.upsertMember(MemberRecord(channelID: fixture.channel.id, userID: user, displayName: user.capitalized,
                                                          joinedAt: now.addingTimeInterval(-90 * 86_400), lastSeen: now.addingTimeInterval(-days * 86_400)))
            }
        }
    }

    func storedMembers(_ fixture: ServerFixture) async throws -> [String] {
        try await fixture.withStore { try await $0.members(of: fixture.channel.id).map(\.userID).sorted() }
    }

    /// With memberRetentionDays, a server forgets the members that stayed away longer (row and
    /// roster entry, counted in /metrics) and keeps the rest; the default keeps everyone.
    @Test func membersAwayLongerThanTheRetentionAreForgotten() async throws {
        let fixture = try await ServerFixture()
        try await storeMembers(fixture, lastSeen: [("gone", 45), ("recent", 5)], now: Date())
        var (task, listening) = try await fixture.start()
        try await Task.sleep(for: .milliseconds(300))
        #expect(try await storedMembers(fixture) == ["gone", "recent"], "the default keeps members")
        await listening.shutdown()
        _ = await task.result
        (task, listening) = try await fixture.start(memberRetentionDays: 30)
        defer { task.cancel() }
        #expect(try await eventually { try await storedMembers(fixture) == ["recent"] })
        let metrics = try await fixture.metrics(listening)
        #expect(metrics.contains("squelch_members_forgotten_total 1"), "\(metrics)")
        await listening.shutdown()
        _ = await task.result
    }

    /// The time the server was down counts as presence: 44 days down, a member last seen 45 days
    /// ago counts as seen 1 day ago and stays; one last seen 80 days ago (36) goes.
    @Test func downtimeDoesNotCountAsAbsence() async throws {
        let fixture = try await ServerFixture()
        let now = Date()
        try await storeMembers(fixture, lastSeen: [("kept", 45), ("gone", 80)], now: now)
        // The server last said it was running 44 days ago.
        _ = try await fixture.withStore { try await $0.recordServerAlive(at: now.addingTimeInterval(-44 * 86_400), creditingDowntime: false) }
        var (task, listening) = try await fixture.start(memberRetentionDays: 30)
        #expect(await eventually { (try? await storedMembers(fixture)) == ["kept"] })
        await listening.shutdown()
        _ = await task.result
        // The credit is in the store: a restart straight after doesn't take it back.
        (task, listening) = try await fixture.start(memberRetentionDays: 30)
        defer { task.cancel() }
        try await Task.sleep(for: .milliseconds(500))
        #expect(try await storedMembers(fixture) == ["kept"])
        await listening.shutdown()
        _ = await task.result
    }

    /// A joiner that sends nothing after `joined` still gets the last roster chunk: nothing else
    /// happening on the server must be needed to send it.
    @Test func aQuietJoinerGetsItsWholeRoster() async throws {
        let fixture = try await ServerFixture()
        try await fixture.withStore { store in
            for index in 0..<200 {
                try await store.upsertMember(MemberRecord(channelID: fixture.channel.id, userID: "m\(index)", displayName: "M\(index)"))
            }
        }
        let (task, listening) = try await fixture.start()
        defer { task.cancel() }
        let quiet = try await fixture.member("quiet", port: listening.voicePort)
        #expect(await eventually(seconds: 5) { rosterEntries(quiet.messages).count == 201 })
        await listening.shutdown()
        _ = await task.result
    }

    /// A phone that dies leaves its connection open on the server until the transport's idle timeout
    /// (minutes). The roster must not show it `connected` all that while.
    @Test func aMemberGoneSilentShowsReconnectingUntilHeardAgain() async throws {
        let fixture = try await ServerFixture()
        let (task, listening) = try await fixture.start(wakeSilence: 1.5)
        defer { task.cancel() }
        let ann = try await fixture.member("ann", port: listening.voicePort)
        let eve = try await fixture.member("eve", port: listening.voicePort)
        func eveIs(_ state: ConnectionState, after mark: Int) async -> Bool {
            await ann.waitFor(after: mark, seconds: 5) {
                if case .participant(let p) = $0 { return p.userID == "eve" && p.connection == state } else { return false }
            } != nil
        }
        // Both stay quiet (their keepalive is 15 s), but Ann keeps talking to the server; Eve doesn't.
        var mark = ann.messages.count
        let started = ContinuousClock.now
        var shown = false
        while !shown, ContinuousClock.now - started < .seconds(8) {
            try await ann.send(.setMuted(false))
            try await Task.sleep(for: .milliseconds(200))
            shown = ann.messages[mark...].contains {
                if case .participant(let p) = $0 { return p.userID == "eve" && p.connection == .reconnecting } else { return false }
            }
        }
        #expect(shown, "Eve went silent past the 1.5 s window")
        #expect(!ann.messages[mark...].contains {
            if case .participant(let p) = $0 { return p.userID == "ann" && p.connection != .connected } else { return false }
        }, "Ann kept being heard")
        // The counters reach /metrics once a second: the roster can be ahead of them.
        var text = try await fixture.metrics(listening)
        for _ in 0 ..< 30 where !text.contains("squelch_members_silent_total 1") {
            try await Task.sleep(for: .milliseconds(100))
            text = try await fixture.metrics(listening)
        }
        #expect(text.contains("squelch_members_silent_total 1"),
                "\(text.split(separator: "\n").filter { $0.contains("silent") })")
        // Eve speaks up: everyone sees her connected again.
        mark = ann.messages.count
        try await eve.send(.setMuted(true))
        #expect(await eveIs(.connected, after: mark))
        await listening.shutdown()
        _ = await task.result
    }

    @Test func aLateJoinerHearsTheBurstFromItsFirstPacket() async throws {
        let fixture = try await ServerFixture()
        let (task, listening) = try await fixture.start()
        defer { task.cancel() }
        let ann = try await fixture.member("ann", port: listening.voicePort)
        try await ann.send(.floorRequest())
        let burst = try #require(await ann.waitForFloor(.granted)?.burst)
        for sequence in 0..<30 { await ann.sendAudio(burst: burst, sequence: UInt16(sequence), payload: [UInt8(sequence), 0xAA]) }
        try await Task.sleep(for: .milliseconds(50))
        let late = try await fixture.member("late", port: listening.voicePort)
        for sequence in 30..<40 {
            await ann.sendAudio(burst: burst, sequence: UInt16(sequence), payload: [UInt8(sequence), 0xAA])
            try await Task.sleep(for: .milliseconds(20))
        }
        let received = await late.waitForAudio(count: 40)
        let parsed = received.compactMap { packet in packet.withUnsafeBytes { AudioHeader(parsing: $0) } }
        #expect(parsed.prefix(30).map(\.sequence) == (0..<30).map { UInt16($0) })
        #expect(parsed.prefix(30).allSatisfy { $0.flags.contains(.catchUp) })
        #expect(Set(parsed.map(\.sequence)) == Set((0..<40).map { UInt16($0) }))
        #expect(received.first.map { Array($0[AudioHeader.size...]) } == [0, 0xAA])
        await listening.shutdown()
        _ = await task.result
    }

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
            let url = try #require(URL(string: "http://127.0.0.1:\(listening.adminPort)/healthz"))
            let (body, response) = try await URLSession.shared.data(from: url)
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

