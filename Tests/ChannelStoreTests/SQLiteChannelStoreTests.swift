import ChannelProtocol
@testable import ChannelStore
@testable import ChannelStoreSQLite
import Foundation
import GRDB
import Testing

/// A date the store keeps exactly: it stores whole milliseconds.
private func ms(_ date: Date = Date()) -> Date {
    Date(timeIntervalSince1970: (date.timeIntervalSince1970 * 1000).rounded() / 1000)
}

/// Runs `body` and returns the `StoreError` it threw, or nil; any other error fails the test.
private func storeError(_ body: () async throws -> Void) async -> StoreError? {
    do { try await body(); return nil } catch let error as StoreError { return error } catch {
        Issue.record("expected a StoreError, got \(error)")
        return nil
    }
}

private func message(_ error: StoreError?) -> String {
    switch error {
    case .invalid(let text)?, .database(let text)?: return text
    default: return ""
    }
}

/// Each test gets its own empty directory and its own SQLite file.
@Suite final class SQLiteChannelStoreTests: Sendable {
    let directory: String
    var path: String { directory + "/" + SQLiteChannelStore.defaultFileName }

    init() throws {
        directory = FileManager.default.temporaryDirectory.appendingPathComponent("channel-store-\(UUID())").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
    }

    deinit { try? FileManager.default.removeItem(atPath: directory) }

    func open() throws -> SQLiteChannelStore { try SQLiteChannelStore(directory: directory) }

    func makeChannel(_ name: String = "Ops", mode: TransmissionMode = .halfDuplex) -> ChannelRecord {
        let now = ms()
        return ChannelRecord(name: name, image: "https://example.com/ops.png", mode: mode, maxBurstSeconds: 45,
                             createdAt: now, updatedAt: now)
    }

    // MARK: Channels

    @Test func channelCreateReadUpdateDelete() async throws {
        let store = try open()
        let channel = makeChannel()
        try await store.createChannel(channel)
        #expect(try await store.channel(channel.id) == channel)
        #expect(try await store.channels() == [channel])

        var edited = channel
        edited.name = "Ops 2"
        edited.image = nil
        edited.mode = .fullDuplex
        edited.maxBurstSeconds = 600
        edited.createdAt = ms(Date(timeIntervalSince1970: 0))  // an edit cannot move the creation time
        try await Task.sleep(for: .milliseconds(5))
        let updated = try await store.updateChannel(edited)
        #expect(updated.name == "Ops 2" && updated.image == nil && updated.mode == .fullDuplex && updated.maxBurstSeconds == 600)
        #expect(updated.createdAt == channel.createdAt)
        #expect(updated.updatedAt > channel.updatedAt)
        #expect(try await store.channel(channel.id) == updated)

        try await store.deleteChannel(channel.id)
        #expect(try await store.channel(channel.id) == nil)
        #expect(try await store.channels().isEmpty)
        #expect(await storeError { try await store.deleteChannel(channel.id) } == .channelNotFound(channel.id))
        #expect(await storeError { _ = try await store.updateChannel(channel) } == .channelNotFound(channel.id))
    }

    @Test func channelsAreListedByName() async throws {
        let store = try open()
        for name in ["bravo", "Alpha", "charlie"] { try await store.createChannel(makeChannel(name)) }
        #expect(try await store.channels().map(\.name) == ["Alpha", "bravo", "charlie"])
    }

    @Test(arguments: [
        (ChannelRecord(name: "  "), "channel name"),
        (ChannelRecord(name: "Ops", maxBurstSeconds: 0), "maximum burst"),
        (ChannelRecord(name: "Ops", image: "ftp://example.com/a.png"), "http(s) URL"),
        (ChannelRecord(name: "Ops", image: "data:image/png;base64," + String(repeating: "A", count: ChannelRecord.maxImageBytes)),
         "at most"),
        (ChannelRecord(name: "Ops\u{1B}[2J"), "control characters"),
        (ChannelRecord(name: "Ops\nNight"), "control characters"),
        (ChannelRecord(name: "Ops \u{202E}thgin"), "bidirectional"),
        // One character as people count them, 64 KB of combining marks: with an inline image it
        // no longer fit a control message, and nobody could join the channel.
        (ChannelRecord(name: "Z" + String(repeating: "\u{301}", count: 32_000)), "bytes of UTF-8"),
        (ChannelRecord(name: "Ops", image: "data:image/png;base64,not base64!"), "not base64"),
        (ChannelRecord(name: "Ops", image: "data:image/png;base64," + Data("GIF89a, not a PNG at all.".utf8).base64EncodedString()), "not a PNG"),
        (ChannelRecord(name: "Ops", image: "data:image/png;base64," + png(width: 4_000, height: 16).base64EncodedString()), "4000×16 pixels"),
        (ChannelRecord(name: "Ops", image: "https://"), "not a valid URL"),
        (ChannelRecord(name: "Ops", image: "https://example.com/a b.png"), "not a valid URL"),
    ])
    func invalidChannelsAreRefused(channel: ChannelRecord, expected: String) async throws {
        let store = try open()
        let created = await storeError { try await store.createChannel(channel) }
        #expect(message(created).contains(expected), "\(String(describing: created))")
        #expect(try await store.channels().isEmpty)

        var valid = channel
        valid.name = "Ops"
        valid.image = nil
        valid.maxBurstSeconds = 60
        try await store.createChannel(valid)
        let updated = await storeError { _ = try await store.updateChannel(channel) }
        #expect(message(updated).contains(expected), "\(String(describing: updated))")
        #expect(try await store.channel(channel.id)?.name == "Ops")
    }

    @Test func aRealIconAndURLsAreAccepted() async throws {
        let store = try open()
        let icon = "data:image/png;base64," + png(width: 64, height: 64).base64EncodedString()
        for image in [icon, "https://example.com/icons/ops.png", "http://intranet.local:8080/ops.png?v=2"] {
            let channel = ChannelRecord(name: "Ops — Night shift ☎", image: image)
            try await store.createChannel(channel)
            #expect(try await store.channel(channel.id)?.image == image)
        }
    }

    @Test func aDuplicateIDIsRefused() async throws {
        let store = try open()
        let channel = makeChannel()
        try await store.createChannel(channel)
        var twin = makeChannel("Twin")
        twin.id = channel.id
        let error = await storeError { try await store.createChannel(twin) }
        #expect(error == .invalid("a channel with id \(channel.id) exists"))
        #expect(try await store.channel(channel.id)?.name == "Ops")
    }

    // MARK: Members

    @Test func membersUpsertKeepPushTokensAndRemove() async throws {
        let store = try open()
        let channel = makeChannel()
        try await store.createChannel(channel)
        let joined = ms()
        let ann = MemberRecord(channelID: channel.id, userID: "u1", displayName: "Ann", joinedAt: joined, lastSeen: joined,
                               pushToken: "abcd", pushEnvironment: .sandbox, pushRegisteredAt: joined)
        try await store.upsertMember(ann)
        #expect(try await store.member(channel: channel.id, user: "u1") == ann)

        // A rejoin without a token renames but keeps the token.
        var renamed = MemberRecord(channelID: channel.id, userID: "u1", displayName: "Ann B", joinedAt: joined, lastSeen: ms())
        try await store.upsertMember(renamed)
        renamed.pushToken = "abcd"
        renamed.pushEnvironment = .sandbox
        renamed.pushRegisteredAt = joined
        #expect(try await store.member(channel: channel.id, user: "u1") == renamed)

        // A new token replaces the old one.
        var retokened = renamed
        retokened.pushToken = "ef01"
        retokened.pushEnvironment = .production
        try await store.upsertMember(retokened)
        #expect(try await store.member(channel: channel.id, user: "u1") == retokened)

        let bob = MemberRecord(channelID: channel.id, userID: "u2", displayName: "Bob", joinedAt: ms().addingTimeInterval(1))
        try await store.upsertMember(bob)
        #expect(try await store.members(of: channel.id).map(\.userID) == ["u1", "u2"])

        try await store.removeMember(channel: channel.id, user: "u1")
        #expect(try await store.member(channel: channel.id, user: "u1") == nil)
        #expect(try await store.members(of: channel.id).map(\.userID) == ["u2"])
        #expect(await storeError { try await store.removeMember(channel: channel.id, user: "u1") }
                == .memberNotFound(channel: channel.id, user: "u1"))

        let stranger = MemberRecord(channelID: UUID(), userID: "u3", displayName: "Cy")
        #expect(await storeError { try await store.upsertMember(stranger) } == .channelNotFound(stranger.channelID))
    }

    @Test func aMembersGrantIsStoredAndKeptByAWriteWithoutOne() async throws {
        let store = try open()
        let channel = makeChannel()
        try await store.createChannel(channel)
        let joined = ms()
        let grant = MemberGrant(canTalk: false, canListen: true, role: "dispatcher", priority: 200, tokenID: "jti-1",
                                tokenIssuedAt: joined, tokenExpiresAt: joined.addingTimeInterval(3600))
        var ann = MemberRecord(channelID: channel.id, userID: "u1", displayName: "Ann", joinedAt: joined, lastSeen: joined, grant: grant)
        try await store.upsertMember(ann)
        #expect(try await store.member(channel: channel.id, user: "u1")?.grant == grant)
        // A write that doesn't know the grant (or the push token) keeps what is stored.
        try await store.upsertMember(MemberRecord(channelID: channel.id, userID: "u1", displayName: "Ann", joinedAt: joined, lastSeen: joined))
        #expect(try await store.member(channel: channel.id, user: "u1")?.grant == grant)
        // A new token's grant replaces it.
        ann.grant = MemberGrant(canTalk: true, canListen: false, role: nil, priority: 0, tokenID: "jti-2",
                                tokenIssuedAt: joined, tokenExpiresAt: joined.addingTimeInterval(60))
        try await store.upsertMember(ann)
        #expect(try await store.member(channel: channel.id, user: "u1") == ann)
        // A row edited by hand into an impossible priority reads as having no grant, not as an error.
        try await DatabaseQueue(path: path).write { db in try db.execute(sql: "UPDATE member SET priority = 999") }
        #expect(try await store.member(channel: channel.id, user: "u1")?.grant == nil)
    }

    @Test func aMembersSubscriptionsAreStoredAndADamagedListReadsAsNone() async throws {
        let store = try open()
        let channel = makeChannel()
        try await store.createChannel(channel)
        let joined = ms()
        try await store.upsertMember(MemberRecord(channelID: channel.id, userID: "u1", displayName: "Ann", joinedAt: joined, lastSeen: joined))
        #expect(try await store.member(channel: channel.id, user: "u1")?.unheard == [])
        try await store.setSubscriptions(channel: channel.id, user: "u1", unheard: ["u3", "u2"])
        #expect(try await store.member(channel: channel.id, user: "u1")?.unheard == ["u2", "u3"])
        // A member record carries the whole list, as the hub keeps it.
        try await store.upsertMember(MemberRecord(channelID: channel.id, userID: "u1", displayName: "Ann", joinedAt: joined,
                                                  lastSeen: joined, unheard: ["u4"]))
        #expect(try await store.member(channel: channel.id, user: "u1")?.unheard == ["u4"])
        try await store.setSubscriptions(channel: channel.id, user: "u1", unheard: [])
        #expect(try await store.member(channel: channel.id, user: "u1")?.unheard == [])
        #expect(await storeError { try await store.setSubscriptions(channel: channel.id, user: "nobody", unheard: ["u1"]) }
                == .memberNotFound(channel: channel.id, user: "nobody"))
        // A value edited by hand into something else loses the list, not the member or its channel.
        try await DatabaseQueue(path: path).write { db in try db.execute(sql: "UPDATE member SET unheard = '{not a list'") }
        let members = try await store.members(of: channel.id)
        #expect(members.map(\.userID) == ["u1"] && members[0].unheard == [])
    }

    @Test func aVersion2MemberRowReadsWithoutAGrant() async throws {
        let channel = makeChannel()
        do {
            let pool = try DatabasePool(path: path)
            try SQLiteChannelStore.migrator.migrate(pool, upTo: "v2-revocations")
            try await pool.write { db in
                try db.execute(sql: "INSERT INTO channel (id, name, mode, max_burst_seconds, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?)",
                               arguments: [channel.id.uuidString, "Ops", "halfDuplex", 45, 0, 0])
                try db.execute(sql: "INSERT INTO member (channel_id, user_id, display_name, joined_at, last_seen, push_token) VALUES (?, 'ann', 'Ann', 0, 0, 'abcd')",
                               arguments: [channel.id.uuidString])
            }
            try pool.close()
        }
        let store = try open()
        let ann = try #require(try await store.member(channel: channel.id, user: "ann"))
        #expect(ann.grant == nil && ann.pushToken == "abcd")
    }

    @Test func deletingAChannelDeletesItsMembers() async throws {
        let store = try open()
        let channel = makeChannel(), other = makeChannel("Other")
        try await store.createChannel(channel)
        try await store.createChannel(other)
        try await store.upsertMember(MemberRecord(channelID: channel.id, userID: "u1", displayName: "Ann", pushToken: "aa", pushEnvironment: .sandbox))
        try await store.upsertMember(MemberRecord(channelID: other.id, userID: "u1", displayName: "Ann"))
        try await store.deleteChannel(channel.id)
        #expect(try await store.members(of: channel.id).isEmpty)
        #expect(try await store.members(of: other.id).count == 1)
        let rows = try await store.pool.read { db in
            try Int.fetchOne(db, sql: "SELECT count(*) FROM member WHERE channel_id = ?", arguments: [channel.id.uuidString])
        }
        #expect(rows == 0)
    }

    @Test func pushTokensAndLastSeen() async throws {
        let store = try open()
        let channel = makeChannel()
        try await store.createChannel(channel)
        try await store.upsertMember(MemberRecord(channelID: channel.id, userID: "u1", displayName: "Ann"))

        let registered = ms()
        try await store.setPushToken(channel: channel.id, user: "u1", token: "00ff", environment: .production, registeredAt: registered)
        var member = try #require(try await store.member(channel: channel.id, user: "u1"))
        #expect(member.pushToken == "00ff" && member.pushEnvironment == .production && member.pushRegisteredAt == registered)

        let seen = ms().addingTimeInterval(60)
        try await store.touchMember(channel: channel.id, user: "u1", lastSeen: seen)
        member = try #require(try await store.member(channel: channel.id, user: "u1"))
        #expect(member.lastSeen == seen && member.pushToken == "00ff")

        try await store.clearPushToken(channel: channel.id, user: "u1")
        member = try #require(try await store.member(channel: channel.id, user: "u1"))
        #expect(member.pushToken == nil && member.pushEnvironment == nil && member.pushRegisteredAt == nil)

        let missing = StoreError.memberNotFound(channel: channel.id, user: "nobody")
        #expect(await storeError { try await store.setPushToken(channel: channel.id, user: "nobody", token: "aa", environment: .sandbox, registeredAt: Date()) } == missing)
        #expect(await storeError { try await store.clearPushToken(channel: channel.id, user: "nobody") } == missing)
        #expect(await storeError { try await store.touchMember(channel: channel.id, user: "nobody", lastSeen: Date()) } == missing)
    }

    // MARK: Server keys, transmissions

    @Test func theFirstServerKeyWins() async throws {
        let first = try open(), second = try open()
        #expect(try await first.serverKey(named: "reset") == nil)
        #expect(try await first.storeServerKeyIfAbsent(named: "reset", value: [1, 2, 3]) == [1, 2, 3])
        #expect(try await second.storeServerKeyIfAbsent(named: "reset", value: [9, 9]) == [1, 2, 3])
        #expect(try await second.serverKey(named: "reset") == [1, 2, 3])
        #expect(try await second.storeServerKeyIfAbsent(named: "token", value: [7]) == [7])
        #expect(await storeError { _ = try await first.storeServerKeyIfAbsent(named: "empty", value: []) } != nil)
    }

    @Test func aRecordedServerKeyIsReplacedAtEachStart() async throws {
        let first = try open(), second = try open()
        try await first.setServerKey(named: "token-public-key", value: [1])
        try await second.setServerKey(named: "token-public-key", value: [2, 3])
        #expect(try await first.serverKey(named: "token-public-key") == [2, 3])
        #expect(await storeError { try await first.setServerKey(named: "", value: [1]) } != nil)
    }

    @Test func transmissionsNewestFirstAndKeptAfterDeletion() async throws {
        let store = try open()
        let channel = makeChannel(), other = makeChannel("Other")
        try await store.createChannel(channel)
        let start = ms()
        for i in 0..<5 {
            try await store.logTransmission(TransmissionRecord(channelID: channel.id, userID: "u\(i)", startedAt: start.addingTimeInterval(Double(i)),
                                                               durationMilliseconds: 1000 + i, endReason: "released"))
        }
        try await store.logTransmission(TransmissionRecord(channelID: other.id, userID: "x", startedAt: start, durationMilliseconds: 1, endReason: "maxBurst"))

        let latest = try await store.transmissions(of: channel.id, limit: 3)
        #expect(latest.map(\.userID) == ["u4", "u3", "u2"])
        #expect(latest.first == TransmissionRecord(channelID: channel.id, userID: "u4", startedAt: start.addingTimeInterval(4),
                                                   durationMilliseconds: 1004, endReason: "released"))
        #expect(try await store.transmissions(of: channel.id, limit: 0).isEmpty)

        try await store.deleteChannel(channel.id)
        #expect(try await store.transmissions(of: channel.id, limit: 100).count == 5)
    }

    /// A burst's progress (in progress, with its length so far) updates its start's row; one the
    /// server was killed during keeps that length when it is marked interrupted.
    @Test func aBurstsProgressUpdatesItsRowAndOutlivesAKill() async throws {
        let store = try open()
        let channel = makeChannel()
        try await store.createChannel(channel)
        let start = ms()
        func record(_ duration: Int, _ reason: String = TransmissionRecord.inProgress) -> TransmissionRecord {
            TransmissionRecord(channelID: channel.id, userID: "ann", startedAt: start, durationMilliseconds: duration, endReason: reason)
        }
        try await store.logTransmission(record(0))
        try await store.logTransmission(record(5_000))
        try await store.logTransmission(record(10_000))
        #expect(try await store.transmissions(of: channel.id, limit: 10) == [record(10_000)], "one row, its length so far")
        #expect(try await store.closeInterruptedTransmissions() == 1)
        #expect(try await store.transmissions(of: channel.id, limit: 10) == [record(10_000, TransmissionRecord.interrupted)])
        // Progress whose start never got written (shed in a stall) is a row of its own.
        let other = start.addingTimeInterval(60)
        try await store.logTransmission(TransmissionRecord(channelID: channel.id, userID: "bob", startedAt: other, durationMilliseconds: 5_000,
                                                           endReason: TransmissionRecord.inProgress))
        #expect(try await store.transmissions(of: channel.id, limit: 10).map(\.userID) == ["bob", "ann"])
    }

    /// A burst is logged as it starts (`inProgress`) and its end replaces that record; one a dead
    /// server never ended is `interrupted` at the next start; an end without a start is added.
    @Test func aBurstLoggedAtItsStartIsReplacedByItsEndOrMarkedInterrupted() async throws {
        let store = try open()
        let channel = makeChannel()
        try await store.createChannel(channel)
        let start = ms()
        func record(_ user: String, _ at: Date, _ duration: Int, _ reason: String) -> TransmissionRecord {
            TransmissionRecord(channelID: channel.id, userID: user, startedAt: at, durationMilliseconds: duration, endReason: reason)
        }
        try await store.logTransmission(record("ann", start, 0, TransmissionRecord.inProgress))
        #expect(try await store.transmissions(of: channel.id, limit: 10) == [record("ann", start, 0, TransmissionRecord.inProgress)])
        try await store.logTransmission(record("ann", start, 2_500, "released"))
        #expect(try await store.transmissions(of: channel.id, limit: 10) == [record("ann", start, 2_500, "released")])
        // Another user's, or another start's, record is not touched; an end alone is added.
        try await store.logTransmission(record("bob", start.addingTimeInterval(5), 0, TransmissionRecord.inProgress))
        try await store.logTransmission(record("cat", start.addingTimeInterval(6), 900, "maxBurst"))
        try await store.logTransmission(record("ann", start.addingTimeInterval(7), 0, TransmissionRecord.inProgress))
        #expect(try await store.closeInterruptedTransmissions() == 2)
        #expect(try await store.closeInterruptedTransmissions() == 0)
        #expect(try await store.transmissions(of: channel.id, limit: 10).map(\.endReason) == ["interrupted", "maxBurst", "interrupted", "released"])
        // Two bursts of one user starting in the same millisecond: each end replaces one start.
        let same = start.addingTimeInterval(20)
        try await store.logTransmission(record("dan", same, 0, TransmissionRecord.inProgress))
        try await store.logTransmission(record("dan", same, 0, TransmissionRecord.inProgress))
        try await store.logTransmission(record("dan", same, 100, "preempted"))
        #expect(try await store.transmissions(of: channel.id, limit: 2).map(\.endReason).sorted() == ["inProgress", "preempted"])
    }

    /// Retention: records that started before the cut-off go, oldest first and at most `limit` a
    /// call, from every channel (deleted ones included); the rest stay.
    @Test func pruningDeletesOnlyOldTransmissionsInBatches() async throws {
        let store = try open()
        let channel = makeChannel(), gone = makeChannel("Gone")
        try await store.createChannel(channel)
        let now = ms()
        for (index, days) in [40.0, 35, 31, 29, 1].enumerated() {
            for id in [channel.id, gone.id] {
                try await store.logTransmission(TransmissionRecord(channelID: id, userID: "u\(index)", startedAt: now.addingTimeInterval(-days * 86_400),
                                                                   durationMilliseconds: 1_000, endReason: "released"))
            }
        }
        let cutoff = now.addingTimeInterval(-30 * 86_400)
        #expect(try await store.pruneTransmissions(startedBefore: cutoff, limit: 4) == 4)
        // The oldest four went (u0 and u1 of both channels); u2, 31 days old, is next.
        #expect(try await store.transmissions(of: channel.id, limit: 10).map(\.userID) == ["u4", "u3", "u2"])
        #expect(try await store.pruneTransmissions(startedBefore: cutoff, limit: 4) == 2)
        #expect(try await store.pruneTransmissions(startedBefore: cutoff, limit: 4) == 0)
        #expect(try await store.transmissions(of: channel.id, limit: 10).map(\.userID) == ["u4", "u3"])
        #expect(try await store.transmissions(of: gone.id, limit: 10).map(\.userID) == ["u4", "u3"])
    }

    /// The audit trail: newest first, by channel or all, limited, kept across a reopen and after
    /// its channel is deleted, and pruned by age in batches.
    @Test func theAuditTrailIsKeptReadAndPruned() async throws {
        var store = try open()
        let channel = makeChannel(), other = makeChannel("Other")
        try await store.createChannel(channel)
        let now = ms()
        for (index, days) in [40.0, 31, 29, 1].enumerated() {
            try await store.recordAudit(AuditRecord(at: now.addingTimeInterval(-days * 86_400), source: AuditRecord.Source.cli,
                                                    actor: "ops@host", action: "token issued", channelID: channel.id,
                                                    userID: "u\(index)", details: ["token_id": "t\(index)", "note": "a=b \"quoted\""]))
        }
        try await store.recordAudit(AuditRecord(at: now, source: AuditRecord.Source.api, action: "channel deleted", channelID: other.id))
        try await store.deleteChannel(channel.id)
        try await store.close()
        store = try open()
        let all = try await store.auditRecords(channel: nil, limit: 10)
        #expect(all.map(\.action) == ["channel deleted", "token issued", "token issued", "token issued", "token issued"])
        #expect(all.map(\.sequence) == [5, 4, 3, 2, 1])
        #expect(all[0].actor == nil && all[0].source == "api" && all[0].details.isEmpty && all[0].userID == nil)
        let mine = try await store.auditRecords(channel: channel.id, limit: 2)
        #expect(mine.map(\.userID) == ["u3", "u2"])
        #expect(mine[0].details == ["token_id": "t3", "note": "a=b \"quoted\""] && mine[0].actor == "ops@host")
        #expect(mine[0].at == now.addingTimeInterval(-86_400))
        let cutoff = now.addingTimeInterval(-30 * 86_400)
        #expect(try await store.pruneAudit(before: cutoff, limit: 1) == 1)
        #expect(try await store.pruneAudit(before: cutoff, limit: 5) == 1)
        #expect(try await store.pruneAudit(before: cutoff, limit: 5) == 0)
        #expect(try await store.auditRecords(channel: channel.id, limit: 10).map(\.userID) == ["u3", "u2"])
        try await store.close()
    }

    /// The hourly touch never moves a time back and creates no row; the alive record credits the
    /// downtime once, from the later of itself and the newest last-seen time, capped at now.
    @Test func touchesAndTheAliveRecordCreditDowntimeOnce() async throws {
        let store = try open()
        let channel = makeChannel()
        try await store.createChannel(channel)
        let t0 = ms().addingTimeInterval(-100 * 86_400)
        func at(_ days: Double) -> Date { t0.addingTimeInterval(days * 86_400) }
        for (user, days) in [("old", 0.0), ("newer", 10)] {
            try await store.upsertMember(MemberRecord(channelID: channel.id, userID: user, displayName: user, joinedAt: t0, lastSeen: at(days)))
        }
        try await store.touchMembers([MemberKey(channel: channel.id, user: "newer"), MemberKey(channel: channel.id, user: "nobody")], lastSeen: at(5))
        #expect(try await store.member(channel: channel.id, user: "newer")?.lastSeen == at(10), "never back")
        #expect(try await store.member(channel: channel.id, user: "nobody") == nil)
        try await store.touchMembers([MemberKey(channel: channel.id, user: "newer")], lastSeen: at(20))
        #expect(try await store.member(channel: channel.id, user: "newer")?.lastSeen == at(20))

        #expect(try await store.recordServerAlive(at: at(15), creditingDowntime: true) == nil, "no record yet: nothing credited")
        #expect(try await store.member(channel: channel.id, user: "old")?.lastSeen == at(0))
        // Down from day 20 (the newest last-seen time, later than the record of day 15) to day 50.
        #expect(try await store.recordServerAlive(at: at(50), creditingDowntime: true) == at(15))
        #expect(try await store.member(channel: channel.id, user: "old")?.lastSeen == at(30))
        #expect(try await store.member(channel: channel.id, user: "newer")?.lastSeen == at(50), "capped at now")
        // Once only: straight after, nothing more.
        #expect(try await store.recordServerAlive(at: at(50), creditingDowntime: true) == at(50))
        #expect(try await store.member(channel: channel.id, user: "old")?.lastSeen == at(30))
        // A clock behind the record credits nothing.
        _ = try await store.recordServerAlive(at: at(40), creditingDowntime: true)
        #expect(try await store.member(channel: channel.id, user: "old")?.lastSeen == at(30))
    }

    // MARK: Several processes, reopening, schema

    @Test func revisionSeesEditsFromAnotherConnection() async throws {
        let server = try open(), cli = try open()
        var seen = try await server.revision()

        func expectBumped(_ what: Comment) async throws {
            let now = try await server.revision()
            #expect(now > seen, what)
            seen = now
        }
        let channel = makeChannel()
        try await cli.createChannel(channel)
        try await expectBumped("create")
        var edited = channel
        edited.name = "Renamed"
        _ = try await cli.updateChannel(edited)
        try await expectBumped("update")
        try await cli.upsertMember(MemberRecord(channelID: channel.id, userID: "u1", displayName: "Ann"))
        try await cli.touchMember(channel: channel.id, user: "u1", lastSeen: Date())
        #expect(try await server.revision() == seen, "joins and presence must not make the server reload channels")
        try await cli.removeMember(channel: channel.id, user: "u1")
        try await expectBumped("remove member")
        try await cli.deleteChannel(channel.id)
        try await expectBumped("delete")
        #expect(try await server.channel(channel.id) == nil)
    }

    @Test func dataIsBackAfterCloseAndReopen() async throws {
        let channel = makeChannel()
        let member = MemberRecord(channelID: channel.id, userID: "u1", displayName: "Ann", joinedAt: ms(), lastSeen: ms(),
                                  pushToken: "beef", pushEnvironment: .sandbox, pushRegisteredAt: ms())
        do {
            let store = try open()
            try await store.createChannel(channel)
            try await store.upsertMember(member)
            _ = try await store.storeServerKeyIfAbsent(named: "reset", value: [4, 2])
            try await store.close()
        }
        // The TRUNCATE checkpoint leaves the main file complete on its own.
        let wal = (try? FileManager.default.attributesOfItem(atPath: path + "-wal")[.size] as? Int) ?? 0
        #expect(wal == 0)

        let reopened = try open()
        #expect(try await reopened.channel(channel.id) == channel)
        #expect(try await reopened.member(channel: channel.id, user: "u1") == member)
        #expect(try await reopened.serverKey(named: "reset") == [4, 2])
    }

    @Test func aClosedStoreReportsADatabaseError() async throws {
        let store = try open()
        try await store.close()
        let error = await storeError { _ = try await store.channels() }
        guard case .database? = error else { Issue.record("expected a database error, got \(String(describing: error))"); return }
    }

    // MARK: Revocations

    /// squelchd's token ids are upper-case UUIDs; typed in lower case, or pasted with spaces, the id
    /// still names the token. (It used to be stored as given, reported as revoked, and match nothing.)
    @Test func aTokenIDInLowerCaseOrWithSpacesNamesTheSameToken() async throws {
        let store = try open()
        let channel = makeChannel()
        try await store.createChannel(channel)
        let now = ms()
        let id = UUID().uuidString
        let revocation = RevocationRecord.token(" \(id.lowercased())\n", channel: channel.id, user: nil, expiresAt: nil, at: now, reason: "lost")
        #expect(revocation.tokenID == id)
        #expect(revocation.voids(channel: channel.id, user: "ann", tokenID: id, issuedAt: now))
        _ = try await store.revoke(revocation)
        #expect(try await store.revocation(channel: channel.id, user: "ann", tokenID: id, issuedAt: now) != nil)
        #expect(try await store.revocation(channel: channel.id, user: "ann", tokenID: id.lowercased(), issuedAt: now) != nil,
                "a token whose own id is in lower case")
        #expect(try await store.revocation(channel: channel.id, user: "ann", tokenID: UUID().uuidString, issuedAt: now) == nil)
        // An id that is no UUID is kept as it is, trimmed.
        #expect(RevocationRecord.token(" jti-7 ", channel: channel.id, user: nil, expiresAt: nil, at: now, reason: "x").tokenID == "jti-7")
        try await store.close()
    }

    @Test func aRevokedTokenIsVoidAndOthersAreNot() async throws {
        let store = try open()
        let channel = makeChannel()
        try await store.createChannel(channel)
        let now = ms()
        let stored = try await store.revoke(.token("jti-1", channel: channel.id, user: "ann", expiresAt: now.addingTimeInterval(3600),
                                                   at: now, reason: "phone lost"))
        #expect(stored.sequence > 0 && stored.tokenID == "jti-1" && stored.reason == "phone lost")
        let hit = try await store.revocation(channel: channel.id, user: "ann", tokenID: "jti-1", issuedAt: now.addingTimeInterval(-60))
        #expect(hit == stored)
        // Another token of the same user, the same id on another channel: both good.
        #expect(try await store.revocation(channel: channel.id, user: "ann", tokenID: "jti-2", issuedAt: now.addingTimeInterval(-60)) == nil)
        #expect(try await store.revocation(channel: UUID(), user: "ann", tokenID: "jti-1", issuedAt: now) == nil)
        // Listing by channel leaves out the other channel's.
        let other = makeChannel("Other")
        try await store.createChannel(other)
        let elsewhere = try await store.revoke(.member(channel: other.id, user: "bob", at: now, reason: "removed"))
        #expect(try await store.revocations(after: 0, channel: channel.id) == [stored])
        #expect(try await store.revocations(after: 0, channel: nil) == [stored, elsewhere])
        // Revoked again: the first revocation stands, with no second row.
        let again = try await store.revoke(.token("jti-1", channel: channel.id, user: "ann", expiresAt: now.addingTimeInterval(3600),
                                                  at: now.addingTimeInterval(5), reason: "retry"))
        #expect(again == stored)
        #expect(try await store.revocations(after: 0, channel: channel.id) == [stored])
        // One made by id alone learns the token's expiry and user when the whole token is revoked.
        let byID = try await store.revoke(.token("jti-3", channel: channel.id, user: nil, expiresAt: nil, at: now, reason: "by id"))
        // The revoked member's terminal shows the reason: no escape sequences, and an id is not blank.
        for (bad, expected) in [(RevocationRecord.token("jti-4", channel: channel.id, user: nil, expiresAt: nil, at: now, reason: "\u{1B}[2Jfake"),
                                 "control characters"),
                                (.token("   ", channel: channel.id, user: nil, expiresAt: nil, at: now, reason: "x"), "token id")] {
            let error = await storeError { _ = try await store.revoke(bad) }
            #expect(message(error).contains(expected), "\(String(describing: error))")
        }
        let whole = try await store.revoke(.token("jti-3", channel: channel.id, user: "cy", expiresAt: now.addingTimeInterval(60),
                                                  at: now, reason: "whole"))
        #expect(whole.sequence == byID.sequence && whole.reason == "by id" && whole.userID == "cy" && whole.expiresAt == now.addingTimeInterval(60))
        #expect(try await store.revocations(after: 0, channel: channel.id).count == 2)
    }

    @Test func removingAMemberVoidsItsEarlierTokensOnly() async throws {
        let store = try open()
        let channel = makeChannel()
        try await store.createChannel(channel)
        let removal = ms()
        let first = try await store.revoke(.member(channel: channel.id, user: "bob", at: removal, reason: "removed"))
        #expect(first.userID == "bob" && first.tokenID == nil && first.expiresAt == nil)
        let before = try await store.revocation(channel: channel.id, user: "bob", tokenID: "old", issuedAt: removal.addingTimeInterval(-1))
        #expect(before?.sequence == first.sequence)
        #expect(try await store.revocation(channel: channel.id, user: "bob", tokenID: "new", issuedAt: removal.addingTimeInterval(1)) == nil)
        #expect(try await store.revocation(channel: channel.id, user: "carol", tokenID: "old", issuedAt: removal.addingTimeInterval(-1)) == nil)
        // Within the removal's millisecond it can't be told which came first: refused, in the store
        // and in the record's own check (which the hub applies to live members).
        for offset in [-0.0004, 0, 0.0004] {
            let issued = removal.addingTimeInterval(offset)
            #expect(try await store.revocation(channel: channel.id, user: "bob", tokenID: "same-ms", issuedAt: issued)?.sequence == first.sequence,
                    "issued \(offset) s from the removal")
            #expect(first.voids(channel: channel.id, user: "bob", tokenID: "same-ms", issuedAt: issued))
        }
        #expect(try await store.revocation(channel: channel.id, user: "bob", tokenID: "next-ms", issuedAt: removal.addingTimeInterval(0.001)) == nil)
        #expect(!first.voids(channel: channel.id, user: "bob", tokenID: "next-ms", issuedAt: removal.addingTimeInterval(0.001)))

        // A second removal moves the cut-off; the first record goes, and the list shows the order.
        let later = removal.addingTimeInterval(10)
        let second = try await store.revoke(.member(channel: channel.id, user: "bob", at: later, reason: "removed again"))
        #expect(try await store.revocation(channel: channel.id, user: "bob", tokenID: "new", issuedAt: removal.addingTimeInterval(1))?.sequence
                == second.sequence)
        let all = try await store.revocations(after: 0, channel: nil)
        #expect(all.map(\.sequence) == [second.sequence], "\(all)")
        #expect(try await store.revocations(after: second.sequence, channel: nil).isEmpty)
    }

    @Test func expiredTokenRevocationsArePrunedAndBadOnesRefused() async throws {
        let store = try open()
        let channel = makeChannel()
        try await store.createChannel(channel)
        let now = ms()
        let expired = try await store.revoke(.token("gone", channel: channel.id, user: nil, expiresAt: now.addingTimeInterval(-5), at: now,
                                                    reason: "r"))
        let kept = try await store.revoke(.token("kept", channel: channel.id, user: nil, expiresAt: nil, at: now, reason: "r"))
        #expect(try await store.revocations(after: 0, channel: nil).map(\.sequence) == [kept.sequence], "the next revocation prunes \(expired.sequence)")

        #expect(await storeError { _ = try await store.revoke(.token("x", channel: UUID(), user: nil, expiresAt: nil, at: now, reason: "r")) }
                .map { if case .channelNotFound = $0 { true } else { false } } == true)
        let nobody = RevocationRecord(sequence: 0, channelID: channel.id, userID: nil, tokenID: nil, revokedAt: now, expiresAt: nil, reason: "r")
        #expect(message(await storeError { _ = try await store.revoke(nobody) }).contains("token id, a user"))
        #expect(message(await storeError {
            _ = try await store.revoke(.token(String(repeating: "j", count: 129), channel: channel.id, user: nil, expiresAt: nil, at: now, reason: "r"))
        }).contains("1-128"))
    }

    /// Two administrators (or a retry racing the first try) revoking the same token at once: one is
    /// told it revoked the token, the others that it was already revoked, with the one record.
    @Test func ofIdenticalRevocationsAtOnceExactlyOneIsNew() async throws {
        let store = try open()
        let channel = makeChannel()
        try await store.createChannel(channel)
        for round in 0 ..< 5 {
            let token = UUID().uuidString
            let outcomes = try await withThrowingTaskGroup(of: TokenRevocation.self) { group in
                for attempt in 0 ..< 8 {
                    group.addTask {
                        try await store.revokeToken(.token(token, channel: channel.id, user: nil, expiresAt: nil, at: ms(),
                                                           reason: "attempt \(attempt)"), byIDAlone: true)
                    }
                }
                return try await group.reduce(into: [TokenRevocation]()) { $0.append($1) }
            }
            let records = outcomes.compactMap { if case .revoked(let record, let isNew, _) = $0 { (record, isNew) } else { nil } }
            #expect(records.count == 8 && records.filter(\.1).count == 1, "round \(round): \(records.map(\.1))")
            #expect(Set(records.map(\.0.sequence)).count == 1, "one stored revocation, returned to all")
            // Each attempt gave its own reason: the repeats are answered with the stored one's, not theirs.
            #expect(Set(records.map(\.0.reason)).count == 1, "round \(round): \(records.map(\.0.reason))")
        }
        // Revoked again later: not new either; an expired revocation pruned and made again is.
        let token = UUID().uuidString
        guard case .revoked(_, true, _) = try await store.revokeToken(.token(token, channel: channel.id, user: nil, expiresAt: nil, at: ms(), reason: "r"),
                                                                      byIDAlone: true) else { Issue.record("first revocation not new"); return }
        guard case .revoked(_, false, _) = try await store.revokeToken(.token(token, channel: channel.id, user: nil, expiresAt: nil, at: ms(), reason: "r"),
                                                                       byIDAlone: true) else { Issue.record("repeat told new"); return }
        let lapsed = UUID().uuidString
        _ = try await store.revoke(.token(lapsed, channel: channel.id, user: nil, expiresAt: ms().addingTimeInterval(-5), at: ms(), reason: "r"))
        guard case .revoked(_, true, _) = try await store.revokeToken(.token(lapsed, channel: channel.id, user: nil, expiresAt: nil, at: ms(), reason: "r"),
                                                                      byIDAlone: true) else { Issue.record("a pruned revocation made again is new"); return }
    }

    @Test func revocationsMadeByAnotherConnectionMoveTheRevision() async throws {
        let store = try open()
        let channel = makeChannel()
        try await store.createChannel(channel)
        let before = try await store.revision()
        let other = try open()
        _ = try await other.revoke(.member(channel: channel.id, user: "ann", at: ms(), reason: "removed"))
        try await other.close()
        #expect(try await store.revision() > before)
        #expect(try await store.revocations(after: 0, channel: nil).count == 1)
    }

    @Test func aVersion1DatabaseIsUpgradedWithItsData() async throws {
        // A data directory written by a squelchd that only knew v1.
        let channel = makeChannel()
        do {
            let pool = try DatabasePool(path: path)
            try SQLiteChannelStore.migrator.migrate(pool, upTo: "v1")
            try await pool.write { db in
                try db.execute(sql: "INSERT INTO channel (id, name, mode, max_burst_seconds, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?)",
                               arguments: [channel.id.uuidString, "Ops", "halfDuplex", 45, 0, 0])
            }
            try pool.close()
        }
        let store = try open()
        #expect(try await store.channel(channel.id)?.name == "Ops")
        _ = try await store.revoke(.member(channel: channel.id, user: "ann", at: ms(), reason: "removed"))
        #expect(try await store.revocations(after: 0, channel: nil).count == 1)
    }

    /// Revocations an older squelchd stored as typed (lower case, a trailing newline) void their
    /// token after the upgrade; two rows that turn out to be one token leave the first.
    @Test func revocationsStoredAsTypedStillVoidTheirTokenAfterTheUpgrade() async throws {
        let channel = makeChannel()
        let token = UUID()
        let other = UUID()
        do {
            let pool = try DatabasePool(path: path)
            try SQLiteChannelStore.migrator.migrate(pool, upTo: "v6-transmissions-in-progress")
            try await pool.write { db in
                try db.execute(sql: "INSERT INTO channel (id, name, mode, max_burst_seconds, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?)",
                               arguments: [channel.id.uuidString, "Ops", "halfDuplex", 45, 0, 0])
                for (id, reason) in [(token.uuidString.lowercased() + "\n", "phone lost"),
                                     (" " + other.uuidString.lowercased(), "left the crew"), ("not-a-uuid", "typo")] {
                    try db.execute(sql: "INSERT INTO revocation (channel_id, token_id, revoked_at, reason) VALUES (?, ?, ?, ?)",
                                   arguments: [channel.id.uuidString, id, 1_000, reason])
                }
                // The same token revoked again, whole, by a build that stored it canonically.
                try db.execute(sql: "INSERT INTO revocation (channel_id, user_id, token_id, revoked_at, expires_at, reason) VALUES (?, ?, ?, ?, ?, ?)",
                               arguments: [channel.id.uuidString, "ann", token.uuidString, 2_000, 4_000_000_000_000, "again"])
            }
            try pool.close()
        }
        let store = try open()
        let issued = Date(timeIntervalSince1970: 0)
        let hit = try await store.revocation(channel: channel.id, user: "ann", tokenID: token.uuidString, issuedAt: issued)
        #expect(hit?.reason == "phone lost")
        // The first revocation stands and learned the later one's user and expiry, so it is pruned in time.
        #expect(hit?.userID == "ann" && hit?.expiresAt == Date(timeIntervalSince1970: 4_000_000_000))
        #expect(try await store.revocation(channel: channel.id, user: "bob", tokenID: other.uuidString, issuedAt: issued)?.reason == "left the crew")
        let all = try await store.revocations(after: 0, channel: channel.id)
        #expect(all.map(\.tokenID) == [token.uuidString, other.uuidString, "not-a-uuid"])
    }

    @Test func schemaVersionIsRecorded() async throws {
        try await open().close()
        let applied = try await DatabaseQueue(path: path).read { db in
            try String.fetchAll(db, sql: "SELECT identifier FROM grdb_migrations ORDER BY identifier")
        }
        #expect(applied == ["v1", "v2-revocations", "v3-member-grants", "v4-transmission-by-time", "v5-member-subscriptions",
                            "v6-transmissions-in-progress", "v7-canonical-token-ids", "v8-audit"])
    }

    @Test func filesArePrivateAndCommitsAreFullySynced() async throws {
        let store = try open()
        try await store.createChannel(makeChannel())
        for file in [path, path + "-wal", path + "-shm"] {
            let mode = try #require(try FileManager.default.attributesOfItem(atPath: file)[.posixPermissions] as? Int)
            #expect(mode & 0o077 == 0, "\(file) has mode \(String(mode, radix: 8))")
        }
        let synchronous = try await store.pool.write { db in try Int.fetchOne(db, sql: "PRAGMA synchronous") }
        #expect(synchronous == 2)  // FULL
        let journal = try await store.pool.read { db in try String.fetchOne(db, sql: "PRAGMA journal_mode") }
        #expect(journal == "wal")
    }

    @Test func processesOpeningANewFileAtOnceAgree() async throws {
        let directory = self.directory
        let results = await withTaskGroup(of: StoreError?.self) { group in
            // Eight at once: with two migrations, each its own transaction, an opener can find another
            // half-way through (CI caught that with four).
            for _ in 0..<8 {
                group.addTask {
                    do throws(StoreError) { _ = try SQLiteChannelStore(directory: directory); return nil } catch { return error }
                }
            }
            return await group.reduce(into: [StoreError?]()) { $0.append($1) }
        }
        #expect(results.compactMap { $0 }.isEmpty, "\(results)")
        #expect(try await open().revision() == 0)
    }

    @Test func aCorruptFileIsRefusedClearly() throws {
        var bytes = [UInt8](repeating: 0, count: 8192)
        for i in bytes.indices { bytes[i] = .random(in: 0...255) }
        #expect(FileManager.default.createFile(atPath: path, contents: Data(bytes)))
        var thrown: StoreError?
        do { _ = try open() } catch let error as StoreError { thrown = error }
        guard case .database(let text)? = thrown else { Issue.record("expected a database error, got \(String(describing: thrown))"); return }
        #expect(text.contains(path) && text.contains("not a database"), "\(text)")
        #expect(text.contains("restore a backup"), "\(text)")
    }

    @Test func aNewerSchemaIsRefused() async throws {
        try await open().close()
        try await DatabaseQueue(path: path).write { db in try db.execute(sql: "INSERT INTO grdb_migrations (identifier) VALUES ('v9-future')") }
        var thrown: StoreError?
        do { _ = try open() } catch let error as StoreError { thrown = error }
        guard case .database(let text)? = thrown else { Issue.record("expected a database error, got \(String(describing: thrown))"); return }
        #expect(text.contains("newer squelchd") && text.contains("v9-future"), "\(text)")
    }
}

/// The first bytes of a PNG of this size: the signature and the IHDR chunk (8-bit RGBA), then an
/// IEND chunk. Enough for the store's check, which reads only the header.
func png(width: UInt32, height: UInt32) -> Data {
    func word(_ value: UInt32) -> [UInt8] { [24, 16, 8, 0].map { UInt8(truncatingIfNeeded: value >> $0) } }
    var bytes: [UInt8] = [0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A]
    bytes += word(13) + Array("IHDR".utf8) + word(width) + word(height) + [8, 6, 0, 0, 0] + word(0)
    bytes += word(0) + Array("IEND".utf8) + [0xAE, 0x42, 0x60, 0x82]
    return Data(bytes)
}
