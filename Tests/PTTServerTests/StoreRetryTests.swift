import ChannelHub
import ChannelStore
import ChannelStoreSQLite
import Foundation
import GRDB
import Logging
import SquelchTesting
import Synchronization
@testable import PTTServer
import Testing

@Suite struct StoreRetryTests {
    let channel = UUID()
    let t0 = Date(timeIntervalSince1970: 1_800_000_000)
    let quiet = Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() })

    func record(_ user: String) -> MemberRecord {
        MemberRecord(channelID: channel, userID: user, displayName: user, joinedAt: t0, lastSeen: t0)
    }

    func log(_ user: String, _ seconds: Double) -> StoreOperation {
        .logTransmission(TransmissionRecord(channelID: channel, userID: user, startedAt: t0 + seconds, durationMilliseconds: 1_000,
                                            endReason: "released"))
    }

    /// A counter's value as `/metrics` shows it.
    func value(_ name: String, in metrics: ServerMetrics) -> Int {
        var bytes: [UInt8] = []
        metrics.registry.emit(into: &bytes)
        let line = String(decoding: bytes, as: UTF8.self).split(separator: "\n").first { $0.hasPrefix(name + " ") }
        return line.flatMap { Int($0.split(separator: " ")[1]) } ?? -1
    }

    func temporaryDirectory() -> String {
        FileManager.default.temporaryDirectory.appendingPathComponent("store-retry-\(UUID())").path
    }

    /// A real SQLite store in `directory` holding this suite's channel.
    func storeWithChannel(in directory: String, busyTimeout: TimeInterval = SQLiteChannelStore.busyTimeoutSeconds) async throws -> SQLiteChannelStore {
        let store = try SQLiteChannelStore(directory: directory, busyTimeout: busyTimeout)
        try await store.createChannel(ChannelRecord(id: channel, name: "Ops"))
        return store
    }

    /// A store with a short busy timeout and a channel, a writer with short retry delays, and another
    /// connection holding the write lock.
    func lockedWriter(in directory: String, shutdownBudget: Duration) async throws
        -> (SQLiteChannelStore, ServerMetrics, StoreWriter, WriteLockHolder) {
        let store = try await storeWithChannel(in: directory, busyTimeout: 0.02)
        let metrics = ServerMetrics()
        let writer = StoreWriter(store: store, metrics: metrics, logger: quiet,
                                 retry: StoreRetryPolicy(firstDelay: .milliseconds(10), maxDelay: .milliseconds(50),
                                                         shutdownBudget: shutdownBudget))
        return (store, metrics, writer, try WriteLockHolder(path: store.path))
    }

    @Test func delaysDoubleUpToTheCapAndOnlyPassingFailuresAreRetried() {
        let policy = StoreRetryPolicy(firstDelay: .milliseconds(50), maxDelay: .seconds(2), shutdownBudget: .seconds(10))
        let busy = StoreError.unavailable("locked")
        #expect((1...7).map { policy.decide(busy, failures: $0, stoppingFor: nil) }
                == [50, 100, 200, 400, 800, 1_600, 2_000].map { .retry(after: .milliseconds($0)) })
        #expect(policy.decide(busy, failures: 10_000, stoppingFor: nil) == .retry(after: .seconds(2)), "no overflow after many failures")
        #expect(policy.decide(.database("constraint"), failures: 1, stoppingFor: nil) == .drop)
        #expect(policy.decide(.channelNotFound(channel), failures: 1, stoppingFor: nil) == .drop)
        #expect(policy.decide(.invalid("too long"), failures: 1, stoppingFor: nil) == .drop)
        // Stopping: never past the budget, and then every write is given up.
        #expect(policy.decide(busy, failures: 7, stoppingFor: .milliseconds(9_500)) == .retry(after: .milliseconds(500)))
        #expect(policy.decide(busy, failures: 1, stoppingFor: .seconds(10)) == .abandon)
        #expect(policy.decide(.database("constraint"), failures: 1, stoppingFor: .seconds(60)) == .drop)
    }

    @Test func sqliteWordsALockHeldTooLongAsUnavailable() async throws {
        let directory = temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let store = try await storeWithChannel(in: directory, busyTimeout: 0.05)
        let lock = try WriteLockHolder(path: store.path)
        var thrown: StoreError?
        do { try await store.upsertMember(record("ann")) } catch { thrown = error }
        lock.unlock()
        #expect(thrown?.isTransient == true, "\(String(describing: thrown))")
        #expect(thrown?.description.contains("locked") == true, "\(String(describing: thrown))")
        try await store.upsertMember(record("ann"))
        #expect(try await store.member(channel: channel, user: "ann") != nil, "the same write succeeds once the lock is gone")
        try await store.close()
    }

    /// While another connection holds the lock, the writer keeps the writes, tries again, and writes
    /// them in order once it can: nothing is lost.
    @Test func writesThatMeetALockedDatabaseAreKeptAndWrittenInOrderOnceItIsFree() async throws {
        let directory = temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let (store, metrics, writer, lock) = try await lockedWriter(in: directory, shutdownBudget: .seconds(10))
        let running = Task { await writer.run() }
        writer.enqueue(.upsertMember(record("ann")))
        writer.enqueue(log("ann", 1))
        writer.enqueue(.upsertMember(record("bob")))
        writer.enqueue(.removeMember(channel: channel, user: "bob"))
        #expect(await eventually(seconds: 5) { value("squelch_store_retries_total", in: metrics) >= 3 })
        #expect(try await store.members(of: channel).isEmpty, "nothing can be written while the lock is held")
        lock.unlock()
        writer.finish()
        await running.value
        #expect(try await store.members(of: channel).map(\.userID) == ["ann"], "bob's removal came after his row")
        #expect(try await store.transmissions(of: channel, limit: 10).count == 1)
        #expect(value("squelch_store_failures_total", in: metrics) == 0)
        try await store.close()
    }

    /// A gauge's value as `/metrics` shows it (the registry prints gauges as floating point).
    func gauge(_ name: String, in metrics: ServerMetrics) -> Double? {
        var bytes: [UInt8] = []
        metrics.registry.emit(into: &bytes)
        let line = String(decoding: bytes, as: UTF8.self).split(separator: "\n").first { $0.hasPrefix(name + " ") }
        return line.flatMap { Double($0.split(separator: " ")[1]) }
    }

    /// While the database fails writes the writer says why (for `/healthz`) and the gauge is 1; the
    /// first write that succeeds clears both.
    @Test func aFailingDatabaseIsReportedUntilAWriteSucceeds() async throws {
        let directory = temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let (store, metrics, writer, lock) = try await lockedWriter(in: directory, shutdownBudget: .seconds(10))
        #expect(writer.unhealthyReason() == nil)
        let running = Task { await writer.run() }
        writer.enqueue(.upsertMember(record("ann")))
        writer.enqueue(log("ann", 1))
        #expect(await eventually(seconds: 5) { value("squelch_store_retries_total", in: metrics) >= 2 })
        let reason = try #require(writer.unhealthyReason())
        #expect(reason.contains("database writes have failed"), "\(reason)")
        #expect(reason.contains("locked"), "the database's own error: \(reason)")
        #expect(reason.contains("2 writes wait in memory"), "\(reason)")
        #expect(gauge("squelch_store_failing", in: metrics) == 1)
        lock.unlock()
        #expect(await eventually(seconds: 5) { writer.unhealthyReason() == nil }, "a write went through")
        #expect(gauge("squelch_store_failing", in: metrics) == 0)
        writer.finish()
        await running.value
        #expect(try await store.members(of: channel).map(\.userID) == ["ann"])
        try await store.close()
    }

    /// A write the database fails for good is lost, not waiting: `/healthz` says so for a while, and
    /// the gauge (writes being tried again) stays 0. A trigger makes SQLite itself refuse the row.
    @Test func aWriteLostForGoodIsReportedForAWhile() async throws {
        let directory = temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let store = try await storeWithChannel(in: directory)
        let other = try DatabaseQueue(path: store.path)
        try await other.write { db in
            try db.execute(sql: "CREATE TRIGGER refuse BEFORE INSERT ON member BEGIN SELECT RAISE(ABORT, 'refused by test trigger'); END")
        }
        let metrics = ServerMetrics()
        let writer = StoreWriter(store: store, metrics: metrics, logger: quiet)
        let running = Task { await writer.run() }
        writer.enqueue(.upsertMember(record("ann")))
        #expect(await eventually(seconds: 5) { value("squelch_store_failures_total", in: metrics) >= 1 })
        let reason = try #require(writer.unhealthyReason())
        #expect(reason.contains("refused 1 write for good") && reason.contains("refused by test trigger"), "\(reason)")
        #expect(!reason.contains("wait in memory"), "nothing waits: \(reason)")
        #expect(gauge("squelch_store_failing", in: metrics) == 0)
        #expect(writer.unhealthyReason(now: .now + .seconds(301)) == nil, "a quiet server is healthy again after five minutes")
        try await other.write { db in try db.execute(sql: "DROP TRIGGER refuse") }
        writer.finish()
        await running.value
        try await store.close()
    }

    /// A write that neither fails nor returns (a hung disk) is reported once it has waited too long.
    @Test func aWriteThatHangsIsReported() async throws {
        let directory = temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        // A busy timeout far longer than the test: the write waits on the lock and never fails.
        let store = try await storeWithChannel(in: directory, busyTimeout: 60)
        let metrics = ServerMetrics()
        let writer = StoreWriter(store: store, metrics: metrics, logger: quiet)
        let lock = try WriteLockHolder(path: store.path)
        let running = Task { await writer.run() }
        writer.enqueue(.upsertMember(record("ann")))
        // From when the write is in hand (on a loaded machine the writer may take a while to wake).
        while writer.writesInHand == 0 { try await Task.sleep(for: .milliseconds(5)) }
        try await Task.sleep(for: .milliseconds(300))
        #expect(writer.unhealthyReason(stuckAfter: .seconds(30)) == nil, "waiting less than the limit is not reported")
        let reason = try #require(writer.unhealthyReason(stuckAfter: .milliseconds(200)))
        #expect(reason.contains("a database write has not returned"), "\(reason)")
        #expect(gauge("squelch_store_failing", in: metrics) == 0, "nothing has failed")
        lock.unlock()
        writer.finish()
        await running.value
        #expect(writer.unhealthyReason(stuckAfter: .milliseconds(200)) == nil)
        #expect(try await store.members(of: channel).map(\.userID) == ["ann"])
        try await store.close()
    }

    /// A write the database refuses outright (its channel is gone) is dropped and counted; the writes
    /// behind it go on.
    @Test func aWriteTheDatabaseRefusesIsDroppedAndTheRestGoOn() async throws {
        let directory = temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let store = try await storeWithChannel(in: directory)
        let metrics = ServerMetrics()
        let writer = StoreWriter(store: store, metrics: metrics, logger: quiet)
        let running = Task { await writer.run() }
        let elsewhere = MemberRecord(channelID: UUID(), userID: "ghost", displayName: "Ghost", joinedAt: t0, lastSeen: t0)
        writer.enqueue(.upsertMember(elsewhere))
        writer.enqueue(.upsertMember(record("ann")))
        writer.finish()
        await running.value
        #expect(try await store.members(of: channel).map(\.userID) == ["ann"])
        #expect(value("squelch_store_failures_total", in: metrics) == 1)
        #expect(value("squelch_store_retries_total", in: metrics) == 0)
        try await store.close()
    }

    /// Stopping while the database stays locked: the writer tries for the shutdown budget, then gives
    /// up what is left, counted, instead of holding the shutdown forever.
    @Test func aDatabaseLockedThroughTheShutdownCostsTheBudgetNotForever() async throws {
        let directory = temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let (store, metrics, writer, lock) = try await lockedWriter(in: directory, shutdownBudget: .milliseconds(300))
        let running = Task { await writer.run() }
        for step in 1...5 { writer.enqueue(log("ann", Double(step))) }
        writer.enqueue(.upsertMember(record("ann")))
        let stopped = ContinuousClock.now
        writer.finish()
        await running.value
        let took = ContinuousClock.now - stopped
        #expect(took >= .milliseconds(300) && took < .seconds(5), "\(took)")
        #expect(value("squelch_store_failures_total", in: metrics) == 6, "every write given up is counted")
        writer.enqueue(.upsertMember(record("bob")))
        #expect(value("squelch_store_failures_total", in: metrics) == 7, "and one that comes after the writer stopped")
        lock.unlock()
        #expect(try await store.members(of: channel).isEmpty)
        try await store.close()
    }

    /// A crowd's writes are committed together: 300 members' records and last-seen times, queued at
    /// once, take a couple of transactions (each a disk flush), not 600. A write refused in a batch
    /// (another channel's member, a last-seen time of nobody) is undone alone; the rest stand.
    @Test func writesThatWaitTogetherAreCommittedTogether() async throws {
        let directory = temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let store = try await storeWithChannel(in: directory)
        let metrics = ServerMetrics()
        let writer = StoreWriter(store: store, metrics: metrics, logger: quiet)
        // Queued before the writer runs, as when a restarted server's members reconnect all at once.
        let users = (0..<300).map { "user\($0)" }
        for user in users {
            writer.enqueue(.upsertMember(record(user)))
            writer.enqueue(.setPushToken(channel: channel, user: user, token: "t-\(user)", environment: .sandbox, registeredAt: t0))
        }
        writer.enqueue(.upsertMember(MemberRecord(channelID: UUID(), userID: "ghost", displayName: "Ghost", joinedAt: t0, lastSeen: t0)))
        writer.enqueue(.touchMember(channel: channel, user: "nobody", lastSeen: t0))
        writer.enqueue(log("user7", 1))
        let running = Task { await writer.run() }
        writer.finish()
        await running.value
        let members = try await store.members(of: channel)
        #expect(members.count == 300 && members.allSatisfy { $0.pushToken == "t-\($0.userID)" })
        #expect(try await store.transmissions(of: channel, limit: 10).map(\.userID) == ["user7"])
        let commits = value("squelch_store_commits_total", in: metrics)
        #expect((1...4).contains(commits), "603 writes in \(commits) transactions")
        #expect(value("squelch_store_failures_total", in: metrics) == 1, "the other channel's member only; a last-seen time of nobody loses nothing")
        try await store.close()
    }

    /// A batch that fails for a reason that passes (the database locked) is applied whole later,
    /// never in part: nothing of it is in the database meanwhile, and nothing twice after.
    @Test func aBatchIsAppliedWholeOrNotAtAll() async throws {
        let directory = temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let store = try await storeWithChannel(in: directory, busyTimeout: 0.05)
        let lock = try WriteLockHolder(path: store.path)
        let batch: [StoreOperation] = [.upsertMember(record("ann")), log("ann", 0), .touchMember(channel: channel, user: "nobody", lastSeen: t0)]
        var thrown: StoreError?
        do { _ = try await store.apply(batch) } catch { thrown = error }
        #expect(thrown?.isTransient == true, "\(String(describing: thrown))")
        lock.unlock()
        #expect(try await store.members(of: channel).isEmpty)
        #expect(try await store.transmissions(of: channel, limit: 10).isEmpty)
        let outcomes = try await store.apply(batch)
        #expect(outcomes.count == 3 && outcomes[0] == nil && outcomes[1] == nil, "\(outcomes)")
        #expect(outcomes[2] == .memberNotFound(channel: channel, user: "nobody"), "\(outcomes)")
        #expect(try await store.members(of: channel).map(\.userID) == ["ann"])
        #expect(try await store.transmissions(of: channel, limit: 10).count == 1)
        try await store.close()
    }

    /// An error that rolls back the whole transaction, whichever write met it (SQLite does so for
    /// some: out of memory, a page that reads back damaged; here a trigger's `RAISE(ROLLBACK)` stands
    /// in for them), costs only that write: the batch is tried again one write at a time.
    @Test func aWriteThatRollsBackItsWholeBatchCostsOnlyItself() async throws {
        let directory = temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let store = try await storeWithChannel(in: directory)
        let other = try DatabaseQueue(path: store.path)
        try await other.write { db in
            try db.execute(sql: """
                CREATE TRIGGER refuse BEFORE INSERT ON member WHEN NEW.user_id = 'bad'
                BEGIN SELECT RAISE(ROLLBACK, 'rolled back by test trigger'); END
                """)
        }
        let metrics = ServerMetrics()
        let writer = StoreWriter(store: store, metrics: metrics, logger: quiet)
        for user in ["ann", "bad", "bob"] { writer.enqueue(.upsertMember(record(user))) }
        let running = Task { await writer.run() }
        writer.finish()
        await running.value
        #expect(try await store.members(of: channel).map(\.userID).sorted() == ["ann", "bob"])
        #expect(value("squelch_store_failures_total", in: metrics) == 1, "only the write that met the error")
        let reason = try #require(writer.unhealthyReason())
        #expect(reason.contains("refused 1 write for good") && reason.contains("rolled back by test trigger"), "\(reason)")
        try await store.close()
    }
}
