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
}
