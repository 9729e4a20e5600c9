import ChannelProtocol
@testable import ChannelStore
import Foundation
import Testing

extension StoreContractTests {
    @Test(arguments: StoreBackend.allCases) func theFirstServerKeyWins(_ backend: StoreBackend) async throws {
        let fixture = try await StoreFixture(backend)
        let first = try await fixture.open(), second = try await fixture.open()
        #expect(try await first.serverKey(named: "reset") == nil)
        #expect(try await first.storeServerKeyIfAbsent(named: "reset", value: [1, 2, 3]) == [1, 2, 3])
        #expect(try await second.storeServerKeyIfAbsent(named: "reset", value: [9, 9]) == [1, 2, 3])
        #expect(try await second.serverKey(named: "reset") == [1, 2, 3])
        #expect(try await second.storeServerKeyIfAbsent(named: "token", value: [7]) == [7])
        #expect(await storeError { _ = try await first.storeServerKeyIfAbsent(named: "empty", value: []) } != nil)
    }

    @Test(arguments: StoreBackend.allCases) func aRecordedServerKeyIsReplacedAtEachStart(_ backend: StoreBackend) async throws {
        let fixture = try await StoreFixture(backend)
        let first = try await fixture.open(), second = try await fixture.open()
        try await first.setServerKey(named: "token-public-key", value: [1])
        try await second.setServerKey(named: "token-public-key", value: [2, 3])
        #expect(try await first.serverKey(named: "token-public-key") == [2, 3])
        #expect(await storeError { try await first.setServerKey(named: "", value: [1]) } != nil)
    }

    @Test(arguments: StoreBackend.allCases) func transmissionsNewestFirstAndKeptAfterDeletion(_ backend: StoreBackend) async throws {
        let fixture = try await StoreFixture(backend)
        let store = try await fixture.open()
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
    @Test(arguments: StoreBackend.allCases) func aBurstsProgressUpdatesItsRowAndOutlivesAKill(_ backend: StoreBackend) async throws {
        let fixture = try await StoreFixture(backend)
        let store = try await fixture.open()
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
    @Test(arguments: StoreBackend.allCases) func aBurstLoggedAtItsStartIsReplacedByItsEndOrMarkedInterrupted(_ backend: StoreBackend) async throws {
        let fixture = try await StoreFixture(backend)
        let store = try await fixture.open()
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
    @Test(arguments: StoreBackend.allCases) func pruningDeletesOnlyOldTransmissionsInBatches(_ backend: StoreBackend) async throws {
        let fixture = try await StoreFixture(backend)
        let store = try await fixture.open()
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
    @Test(arguments: StoreBackend.allCases) func theAuditTrailIsKeptReadAndPruned(_ backend: StoreBackend) async throws {
        let fixture = try await StoreFixture(backend)
        var store = try await fixture.open()
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
        store = try await fixture.open()
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
    @Test(arguments: StoreBackend.allCases) func touchesAndTheAliveRecordCreditDowntimeOnce(_ backend: StoreBackend) async throws {
        let fixture = try await StoreFixture(backend)
        let store = try await fixture.open()
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
}
