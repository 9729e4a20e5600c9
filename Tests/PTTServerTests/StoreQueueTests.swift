import ChannelHub
import ChannelStore
import ChannelStoreSQLite
import Foundation
import Logging
@testable import PTTServer
import Testing

/// The store writer's queue: which writes fold together, what may be shed, and (against two real
/// SQLite files) that folding never changes what ends up in the database.
@Suite struct StoreQueueTests {
    let channel = UUID()
    let t0 = Date(timeIntervalSince1970: 1_800_000_000)

    func record(_ user: String, name: String? = nil, token: String? = nil, unheard: [String] = []) -> MemberRecord {
        MemberRecord(channelID: channel, userID: user, displayName: name ?? user, joinedAt: t0, lastSeen: t0,
                     pushToken: token, pushEnvironment: token == nil ? nil : .production, pushRegisteredAt: token == nil ? nil : t0,
                     unheard: unheard)
    }

    func touch(_ user: String, _ seconds: Double) -> StoreOperation {
        .touchMember(channel: channel, user: user, lastSeen: t0 + seconds)
    }

    func log(_ user: String, _ seconds: Double) -> StoreOperation {
        .logTransmission(TransmissionRecord(channelID: channel, userID: user, startedAt: t0 + seconds, durationMilliseconds: 1_000,
                                            endReason: "released"))
    }

    func drain(_ queue: inout StoreQueue) -> [StoreOperation] {
        var out: [StoreOperation] = []
        while let operation = queue.pop() { out.append(operation) }
        return out
    }

    /// A burst's progress replaces its start (or earlier progress) while that waits; its end then
    /// replaces the progress. Once the start is handed out, progress queues behind it.
    @Test func aBurstsProgressFoldsIntoItsWaitingStartAndItsEndIntoThat() {
        func burst(_ duration: Int, _ reason: String = TransmissionRecord.inProgress) -> StoreOperation {
            .logTransmission(TransmissionRecord(channelID: channel, userID: "ann", startedAt: t0, durationMilliseconds: duration, endReason: reason))
        }
        var queue = StoreQueue()
        #expect(queue.push(burst(0)) == .queued)
        #expect(queue.push(burst(5_000)) == .folded)
        #expect(queue.push(burst(10_000)) == .folded)
        #expect(queue.count == 1 && queue.waitingLogRecords == 1)
        #expect(queue.push(burst(12_000, "released")) == .folded)
        #expect(drain(&queue) == [burst(12_000, "released")])
        #expect(queue.waitingLogRecords == 0)
        // Handed out, then progress: it waits on its own, and the end folds into it.
        #expect(queue.push(burst(0)) == .queued)
        #expect(queue.pop() == burst(0))
        #expect(queue.push(burst(5_000)) == .queued)
        #expect(queue.push(burst(7_000, "released")) == .folded)
        #expect(drain(&queue) == [burst(7_000, "released")])
    }

    @Test func repeatedLastSeenTimesOfOneMemberFoldIntoTheNewest() {
        var queue = StoreQueue()
        #expect(queue.push(touch("ann", 1)) == .queued)
        #expect(queue.push(touch("bob", 1)) == .queued)
        #expect(queue.push(touch("ann", 2)) == .folded)
        #expect(queue.push(touch("ann", 3)) == .folded)
        // Ann's write keeps its place ahead of Bob's; only its time is the newest.
        #expect(drain(&queue) == [touch("ann", 3), touch("bob", 1)])
    }

    @Test func aPushTokenSetOrClearedReplacesTheWaitingOne() {
        var queue = StoreQueue()
        let set = StoreOperation.setPushToken(channel: channel, user: "ann", token: "aa", environment: .sandbox, registeredAt: t0)
        let clear = StoreOperation.clearPushToken(channel: channel, user: "ann")
        let setAgain = StoreOperation.setPushToken(channel: channel, user: "ann", token: "bb", environment: .production, registeredAt: t0 + 5)
        #expect(queue.push(set) == .queued)
        #expect(queue.push(clear) == .folded)
        #expect(queue.push(setAgain) == .folded)
        #expect(drain(&queue) == [setAgain])
    }

    @Test func aNewerRecordWithoutATokenKeepsTheWaitingRecordsToken() {
        var queue = StoreQueue()
        #expect(queue.push(.upsertMember(record("ann", name: "Ann", token: "aa"))) == .queued)
        #expect(queue.push(.upsertMember(record("ann", name: "Ann B."))) == .folded)
        var expected = record("ann", name: "Ann B.", token: "aa")
        expected.pushRegisteredAt = t0
        #expect(drain(&queue) == [.upsertMember(expected)])
        // Likewise the token's grant.
        var granted = record("cy", name: "Cy")
        granted.grant = MemberGrant(canTalk: true, canListen: false, role: "lead", priority: 3, tokenID: "cy-1",
                                    tokenIssuedAt: t0, tokenExpiresAt: t0.addingTimeInterval(60))
        #expect(queue.push(.upsertMember(granted)) == .queued)
        #expect(queue.push(.upsertMember(record("cy", name: "Cy B."))) == .folded)
        guard case .upsertMember(let folded)? = drain(&queue).first else { Issue.record("nothing folded"); return }
        #expect(folded.grant == granted.grant && folded.displayName == "Cy B.")
    }

    @Test func writesOfDifferentKindsWaitInOrder() {
        var queue = StoreQueue()
        let remove = StoreOperation.removeMember(channel: channel, user: "ann")
        #expect(queue.push(touch("bob", 1)) == .queued)
        #expect(queue.push(touch("ann", 1)) == .queued)
        #expect(queue.push(remove) == .folded, "the row goes either way")
        #expect(queue.push(remove) == .folded)
        // The member's last write is now the removal, so this last-seen time must not reach back
        // past it into the first one.
        #expect(queue.push(touch("ann", 2)) == .queued)
        #expect(queue.push(.setPushToken(channel: channel, user: "ann", token: "aa", environment: .sandbox, registeredAt: t0)) == .queued)
        #expect(drain(&queue) == [touch("bob", 1), remove, touch("ann", 2),
                                  .setPushToken(channel: channel, user: "ann", token: "aa", environment: .sandbox, registeredAt: t0)])
    }

    /// A member alternating two kinds of write (at the control rate limit, while the database stalls)
    /// used to queue one write per message, each up to a 64 KB subscription list: memory in proportion
    /// to the events. Writes to different columns commute, so each folds into its own kind.
    @Test func alternatingTokenAndSubscriptionWritesKeepOneOfEachWaiting() {
        var queue = StoreQueue()
        for step in 0..<1_000 {
            let operation: StoreOperation = switch step % 3 {
            case 0: .setPushToken(channel: channel, user: "ann", token: "t\(step)", environment: .sandbox, registeredAt: t0 + Double(step))
            case 1: .setSubscriptions(channel: channel, user: "ann", unheard: ["u\(step)"])
            default: touch("ann", Double(step))
            }
            _ = queue.push(operation)
        }
        #expect(queue.count == 3)
        #expect(drain(&queue) == [.setPushToken(channel: channel, user: "ann", token: "t999", environment: .sandbox, registeredAt: t0 + 999),
                                  .setSubscriptions(channel: channel, user: "ann", unheard: ["u997"]), touch("ann", 998)])
        // A record or a removal is a barrier: nothing after it folds into a write before it.
        _ = queue.push(.setSubscriptions(channel: channel, user: "ann", unheard: ["a"]))
        _ = queue.push(.removeMember(channel: channel, user: "ann"))
        #expect(queue.push(.setSubscriptions(channel: channel, user: "ann", unheard: ["b"])) == .queued)
    }

    /// A client reconnecting in a loop writes its record on each join and its last-seen time on each
    /// close: all of it folds into one record.
    @Test func aReconnectLoopFoldsIntoOneRecord() {
        var queue = StoreQueue()
        #expect(queue.push(.upsertMember(record("ann"))) == .queued)
        for cycle in 1...100 {
            #expect(queue.push(touch("ann", Double(cycle))) == .folded)
            #expect(queue.push(.upsertMember(record("ann", name: "Ann \(cycle)"))) == .folded)
        }
        #expect(queue.push(touch("ann", 500)) == .folded)
        var expected = record("ann", name: "Ann 100")
        expected.lastSeen = t0 + 500
        #expect(drain(&queue) == [.upsertMember(expected)])
    }

    /// A member joining and leaving in a loop during a stall (each round a record, a 64 KB list and
    /// a removal) used to queue a record with its list per round: memory in proportion to the events.
    /// The removal takes the round's writes and the removal before it.
    @Test func aJoinAndLeaveLoopKeepsOneRemovalWaiting() {
        var queue = StoreQueue()
        let list = (0 ..< 4_000).map { "user-\($0)" }
        _ = queue.push(.upsertMember(record("bob")))
        for round in 0 ..< 500 {
            _ = queue.push(.upsertMember(record("ann", name: "Ann \(round)")))
            _ = queue.push(.setSubscriptions(channel: channel, user: "ann", unheard: list))
            _ = queue.push(touch("ann", Double(round)))
            _ = queue.push(.removeMember(channel: channel, user: "ann"))
            #expect(queue.count <= 2, "round \(round): \(queue.count) waiting")
        }
        // The next round's record waits behind the removal; the other member's write is untouched.
        _ = queue.push(.upsertMember(record("ann", name: "Ann again")))
        #expect(drain(&queue) == [.upsertMember(record("bob")), .removeMember(channel: channel, user: "ann"),
                                  .upsertMember(record("ann", name: "Ann again"))])
    }

    @Test func aWriteAlreadyHandedOutIsNeverFoldedInto() {
        var queue = StoreQueue()
        #expect(queue.push(touch("ann", 1)) == .queued)
        #expect(queue.pop() == touch("ann", 1))
        #expect(queue.push(touch("ann", 2)) == .queued)
        #expect(drain(&queue) == [touch("ann", 2)])
    }

    @Test func onlyTransmissionLogRecordsAreShedPastTheLimit() {
        var queue = StoreQueue(maxWaitingLogRecords: 2)
        #expect(queue.push(log("ann", 1)) == .queued)
        #expect(queue.push(log("ann", 2)) == .queued)
        #expect(queue.push(log("ann", 3)) == .refused)
        // Member state is never refused, however much waits.
        for user in 0..<10 { #expect(queue.push(touch("user\(user)", 1)) == .queued) }
        #expect(queue.pop() == log("ann", 1))
        #expect(queue.push(log("ann", 4)) == .queued)
        #expect(queue.count == 12)
        #expect(queue.waitingLogRecords == 2)
    }

    func start(_ user: String, _ seconds: Double) -> StoreOperation {
        .logTransmission(TransmissionRecord(channelID: channel, userID: user, startedAt: t0 + seconds, durationMilliseconds: 0,
                                            endReason: TransmissionRecord.inProgress))
    }

    /// A burst's end replaces its start while the start waits; a start is shed from half the limit,
    /// so that an end whose start got in has room.
    @Test func aBurstsEndReplacesItsWaitingStartAndStartsAreShedFirst() {
        var queue = StoreQueue(maxWaitingLogRecords: 4)
        #expect(queue.push(start("ann", 1)) == .queued)
        #expect(queue.push(touch("bob", 1)) == .queued)
        #expect(queue.push(log("ann", 1)) == .folded)
        #expect(drain(&queue) == [log("ann", 1), touch("bob", 1)])
        // Handed out already: the end is a write of its own (the store replaces the row).
        #expect(queue.push(start("ann", 2)) == .queued)
        #expect(queue.pop() == start("ann", 2))
        #expect(queue.push(log("ann", 2)) == .queued)
        // Two log records wait: a third start is refused (half of 4), an end still gets in.
        #expect(queue.push(start("bob", 3)) == .queued)
        #expect(queue.push(start("cy", 4)) == .refused)
        #expect(queue.push(log("dan", 5)) == .queued)
        #expect(queue.push(log("bob", 3)) == .folded)
        #expect(drain(&queue) == [log("ann", 2), log("bob", 3), log("dan", 5)])
    }

    /// Against a plain array searched from the end: the same writes handed out in the same order,
    /// through many compactions of the queue's array with writes still waiting.
    @Test func foldingFindsTheRightWriteAcrossCompactions() {
        var queue = StoreQueue(maxWaitingLogRecords: 50)
        var reference: [StoreOperation] = []
        for i in 0..<20_000 {
            let operation = i % 3 == 0 ? log("user\(i % 7)", Double(i)) : touch("user\(i % 11)", Double(i))
            let pushed = queue.push(operation)
            if let key = StoreQueue.key(of: operation) {
                if let last = reference.lastIndex(where: { StoreQueue.key(of: $0) == key }),
                   let folded = StoreQueue.fold(reference[last], operation) {
                    reference[last] = folded
                    #expect(pushed == .folded)
                } else {
                    reference.append(operation)
                    #expect(pushed == .queued)
                }
            } else if reference.filter({ StoreQueue.key(of: $0) == nil }).count < 50 {
                reference.append(operation)
                #expect(pushed == .queued)
            } else {
                #expect(pushed == .refused)
            }
            // Hand out about as many as come in, in uneven runs, so some always wait.
            if i % 4 != 0, !reference.isEmpty {
                #expect(queue.pop() == reference.removeFirst())
            }
        }
        #expect(drain(&queue) == reference)
    }

    /// The writer running: writes queued while it works all arrive, and one that comes after it has
    /// stopped is not written (it is counted as a failure instead).
    @Test func writesQueuedWhileTheWriterRunsAllArriveAndNoneAfterItStops() async throws {
        let base = FileManager.default.temporaryDirectory.appendingPathComponent("store-writer-\(UUID())").path
        defer { try? FileManager.default.removeItem(atPath: base) }
        let store = try SQLiteChannelStore(directory: base)
        try await store.createChannel(ChannelRecord(id: channel, name: "Ops"))
        let writer = StoreWriter(store: store, metrics: ServerMetrics(), logger: Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() }))
        let running = Task { await writer.run() }
        for user in ["ann", "bob", "cy"] { writer.enqueue(.upsertMember(record(user))) }
        for step in 1...50 {
            writer.enqueue(touch(["ann", "bob", "cy"][step % 3], Double(step)))
            writer.enqueue(log("ann", Double(step)))
            if step % 10 == 0 { try await Task.sleep(for: .milliseconds(5)) }
        }
        writer.finish()
        await running.value
        writer.enqueue(.removeMember(channel: channel, user: "ann"))
        let members = try await store.members(of: channel).sorted { $0.userID < $1.userID }
        #expect(members.map(\.userID) == ["ann", "bob", "cy"])
        #expect(members.map(\.lastSeen) == [t0 + 48, t0 + 49, t0 + 50])
        #expect(try await store.transmissions(of: channel, limit: 100).count == 50)
        try await store.close()
    }

    /// The same random writes, applied one by one to one SQLite file and through the writer (queued
    /// before it starts, so as much as possible folds) to another, leave both files the same.
    @Test(arguments: [1, 2, 3, 4, 5])
    func foldingLeavesTheDatabaseAsWritingEveryOperationWould(seed: UInt64) async throws {
        let base = FileManager.default.temporaryDirectory.appendingPathComponent("store-queue-\(UUID())").path
        defer { try? FileManager.default.removeItem(atPath: base) }
        let direct = try SQLiteChannelStore(directory: base + "/direct")
        let folded = try SQLiteChannelStore(directory: base + "/folded")
        let channelRecord = ChannelRecord(id: channel, name: "Ops")
        try await direct.createChannel(channelRecord)
        try await folded.createChannel(channelRecord)

        var random = seed &* 0x9E37_79B9_7F4A_7C15
        func next(_ bound: Int) -> Int {
            random = random &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
            return Int((random >> 33) % UInt64(bound))
        }
        var operations: [StoreOperation] = []
        var open: [String: Double] = [:]
        for step in 0..<400 {
            let user = ["ann", "bob", "cy"][next(3)]
            let seconds = Double(step)
            switch next(8) {
            case 0: operations.append(.upsertMember(record(user, name: "\(user) \(step)", token: next(2) == 0 ? nil : "t\(step)",
                                                           unheard: next(2) == 0 ? [] : ["cy"])))
            case 1: operations.append(touch(user, seconds))
            case 2: operations.append(.setPushToken(channel: channel, user: user, token: "p\(step)", environment: .sandbox,
                                                    registeredAt: t0 + seconds))
            case 3: operations.append(.clearPushToken(channel: channel, user: user))
            case 4: operations.append(.removeMember(channel: channel, user: user))
            case 5:
                // A burst: its start, and its end some writes later (or never, as after a crash).
                if let started = open.removeValue(forKey: user) {
                    operations.append(log(user, started))
                } else {
                    open[user] = seconds
                    operations.append(start(user, seconds))
                }
            case 6: operations.append(.setSubscriptions(channel: channel, user: user,
                                                        unheard: [["ann"], ["bob", "cy"], []][next(3)]))
            default: operations.append(touch(user, seconds))
            }
        }
        // One write per transaction, as they come, against the writer's folding and its batches
        // (many writes to a transaction); the writes that find no member are refused alike in both.
        let logger = Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() })
        for operation in operations { _ = try await direct.apply([operation]) }
        let writer = StoreWriter(store: folded, metrics: nil, logger: logger)
        for operation in operations { writer.enqueue(operation) }
        writer.finish()
        await writer.run()

        #expect(try await folded.members(of: channel) == direct.members(of: channel))
        #expect(try await folded.transmissions(of: channel, limit: 1_000) == direct.transmissions(of: channel, limit: 1_000))
        try await direct.close()
        try await folded.close()
    }
}
