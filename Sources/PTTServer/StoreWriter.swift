import ChannelHub
import ChannelStore
import Logging
import NIOConcurrencyHelpers

/// Carries the hub's store writes to the database in order, off the event loop: the relay never
/// waits for SQLite. `enqueue` is cheap and callable from the event loop; `run` drains the queue
/// until `finish`, so a graceful shutdown writes everything before the database closes.
///
/// The writes wait in a `StoreQueue`, which folds a member's repeated writes together, so a slow or
/// stalled database holds one write per member and change, not one per event. A write that fails for
/// a reason that passes (lock, full disk, I/O error) is tried again, in order, as `StoreRetryPolicy`
/// says; one the database refuses outright is logged and dropped.
public final class StoreWriter: Sendable {
    let store: any ChannelStore
    let metrics: ServerMetrics?
    let logger: Logger
    let retry: StoreRetryPolicy
    private struct State {
        var queue: StoreQueue
        var finished = false
        /// When `finish` was called, for the retry policy's shutdown budget.
        var finishedAt: ContinuousClock.Instant?
        /// The drain has ended: later writes can only be counted as lost.
        var drained = false
        /// Log records refused since no log record last waited (the current stall); reported at powers
        /// of two, so a stalled database logs a handful of lines, not one per burst.
        var refusals = 0
        /// Since the last write the database failed, until one succeeds.
        var failing: WriteFailure?
        /// When the writes in hand were first tried; nil between batches.
        var writingSince: ContinuousClock.Instant?
        /// How many writes are in hand: taken off the queue, not in the database yet.
        var inHand = 0
        /// Writes the database failed for good (not a reason that passes), the last one's time and
        /// error; reported for `lostWritesReported` after the last.
        var lost: (count: Int, last: ContinuousClock.Instant, error: String)?
    }
    private let state: NIOLockedValueBox<State>
    /// Rung when a write is queued or on `finish`; one pending ring is enough.
    private let doorbell: AsyncStream<Void>
    private let ring: AsyncStream<Void>.Continuation

    public init(store: any ChannelStore, metrics: ServerMetrics?, logger: Logger, maxWaitingLogRecords: Int = 100_000,
                retry: StoreRetryPolicy = StoreRetryPolicy()) {
        self.store = store
        self.metrics = metrics
        self.logger = logger
        self.retry = retry
        state = NIOLockedValueBox(State(queue: StoreQueue(maxWaitingLogRecords: maxWaitingLogRecords)))
        (doorbell, ring) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
    }

    /// The database failing the writer's writes: since when, how often in a row, and the last error.
    struct WriteFailure: Sendable, Equatable {
        var since: ContinuousClock.Instant
        var attempts: Int
        var error: String
    }

    /// What `/healthz` says of the writes: nil while the database takes them. A write that has failed
    /// and is being tried again, or one that has waited on the database for `stuckAfter` (a hung disk
    /// or network file system fails nothing, it just never returns), makes the server unhealthy: talk
    /// goes on, but what changes is kept only in memory and a restart now would lose it. So does a
    /// write the database failed for good, for `lostWritesReported` after the last one.
    public func unhealthyReason(now: ContinuousClock.Instant = .now, stuckAfter: Duration = .seconds(15)) -> String? {
        // The writes in hand count: taken off the queue, they are not in the database either.
        let (failing, writingSince, waiting, lost) = state.withLockedValue {
            ($0.failing, $0.writingSince, $0.queue.count + $0.inHand, $0.lost)
        }
        let held = "\(waiting) \(waiting == 1 ? "write waits" : "writes wait") in memory and will be written once it recovers, but a restart now loses them"
        let next = "check the data directory's disk (space, I/O errors, permissions) and whether another process holds the database locked"
        if let failing {
            return "database writes have failed for \(Self.seconds(now - failing.since)) (\(failing.attempts) \(failing.attempts == 1 ? "attempt" : "attempts")): \(failing.error); \(held); \(next)"
        }
        if let writingSince, now - writingSince >= stuckAfter {
            return "a database write has not returned for \(Self.seconds(now - writingSince)); \(held); \(next)"
        }
        if let lost, now - lost.last < Self.lostWritesReported {
            return "the database refused \(lost.count) \(lost.count == 1 ? "write" : "writes") for good, the last \(Self.seconds(now - lost.last)) ago: \(lost.error); what \(lost.count == 1 ? "it" : "they") changed is not saved (the live state is right until a restart); check the data directory (file permissions, a damaged file) and the server log"
        }
        return nil
    }

    /// Writes taken off the queue and not in the database yet.
    var writesInHand: Int { state.withLockedValue { $0.inHand } }

    /// How long `/healthz` reports writes the database failed for good (SQLITE_READONLY, data that
    /// reads back damaged): long enough for a monitor's few probes to see it, after which a quiet
    /// server, with nothing left to write, is not held unhealthy for hours by a write long gone.
    static let lostWritesReported: Duration = .seconds(300)

    private static func seconds(_ duration: Duration) -> String {
        "\(Int(duration.components.seconds)) s"
    }

    func enqueue(_ operation: StoreOperation) {
        // Nil once the drain has ended.
        let result = state.withLockedValue { state -> (pushed: StoreQueue.Pushed, waiting: Int, refusals: Int)? in
            guard !state.drained else { return nil }
            let pushed = state.queue.push(operation)
            if pushed == .refused { state.refusals += 1 }
            // Under the lock, so the drain's own updates can't be overwritten by an older count.
            metrics?.storeWaiting.set(Int64(state.queue.count))
            return (pushed, state.queue.count, state.refusals)
        }
        guard let (pushed, waiting, refusals) = result else {
            metrics?.storeFailures.increment()
            logger.error("store write after the writer stopped: not written", metadata: ["operation": "\(operation)"])
            return
        }
        switch pushed {
        case .queued: ring.yield()
        case .folded: metrics?.storeFolded.increment()
        case .refused:
            metrics?.storeRefused.increment()
            // Powers of two: the first refusal is reported at once, then ever more rarely.
            if refusals & (refusals - 1) == 0 {
                logger.error("the database is not keeping up: transmission-log records are being dropped",
                             metadata: ["dropped": "\(refusals)", "waiting": "\(waiting)",
                                        "next": "check the data directory's disk (space, I/O errors); member state is kept and written once it recovers"])
            }
        }
    }

    /// No more writes will come; `run` returns once the queue is empty.
    public func finish() {
        state.withLockedValue { state in
            if !state.finished { state.finishedAt = .now }
            state.finished = true
        }
        ring.finish()
    }

    /// Drains the queue until `finish`, whether or not the calling task is cancelled.
    ///
    /// A service group is cancelled rather than shut down when one of its services fails. The hub
    /// still queues its last writes then (every connected member's last-seen time, the end of a burst
    /// in progress), and GRDB refuses work from a cancelled task, so those writes would be lost. The
    /// queue is therefore drained by a task of its own, which the caller's cancellation doesn't reach;
    /// after it, `finish` is called `cancelledGrace` later in case nobody else does (the voice service
    /// calls it as soon as its transport has stopped).
    public func run(cancelledGrace: Duration = .seconds(10)) async {
        let drain = Task.detached { [self] in await drainQueue() }
        await withTaskCancellationHandler {
            await drain.value
        } onCancel: {
            Task.detached { [self] in
                try? await Task.sleep(for: cancelledGrace)
                finish()
            }
        }
    }

    /// The most writes committed together. A channel's members reconnecting after a restart queue
    /// a few writes each; one transaction for them costs one disk flush instead of one per write
    /// (`synchronous = FULL`), which on a virtual disk took 0.3 ms of wall time and 0.12 ms of CPU
    /// each. Bounded so that one transaction holds the database's write lock only briefly (the CLI
    /// edits the same file).
    static let maxBatch = 256

    private func drainQueue() async {
        var bell = doorbell.makeAsyncIterator()
        var abandoned = 0
        while true {
            while true {
                let batch = state.withLockedValue { state -> [StoreOperation] in
                    var batch: [StoreOperation] = []
                    while batch.count < Self.maxBatch, let operation = state.queue.pop() { batch.append(operation) }
                    metrics?.storeWaiting.set(Int64(state.queue.count))
                    // A stall that is over starts the next one's reports from the first refusal again.
                    if state.queue.waitingLogRecords == 0 { state.refusals = 0 }
                    return batch
                }
                if batch.isEmpty { break }
                if abandoned > 0 {
                    abandoned += batch.count
                    continue
                }
                state.withLockedValue {
                    $0.writingSince = .now
                    $0.inHand = batch.count
                }
                let given = await write(batch)
                state.withLockedValue {
                    $0.writingSince = nil
                    $0.inHand = 0
                }
                abandoned = given
            }
            let done = state.withLockedValue { state in
                state.drained = state.finished && state.queue.isEmpty
                return state.drained
            }
            if done {
                if abandoned > 0 {
                    metrics?.storeFailures.increment(by: Int64(abandoned))
                    logger.critical("the database failed for the whole shutdown: writes were not saved",
                                    metadata: ["lost": "\(abandoned)",
                                               "next": "check the data directory's disk (space, I/O errors) before starting squelchd again"])
                }
                return
            }
            // Nil once finished: the loop then takes what is left and returns.
            _ = await bell.next()
        }
    }

    /// Applies a batch of writes in one transaction, trying it again while it fails for a reason
    /// that passes. A write the database refuses alone is settled (`settle`) and the others stand.
    /// Returns how many of the batch were given up because the server is stopping and the retry
    /// budget is spent (every later write is given up too); 0 when all are settled.
    private func write(_ batch: [StoreOperation]) async -> Int {
        var failures = 0
        while true {
            do {
                let outcomes = try await store.apply(batch)
                metrics?.storeCommits.increment()
                noteDatabaseAnswered()
                if failures > 0 {
                    logger.notice("database writes resumed", metadata: ["attempts": "\(failures + 1)"])
                }
                for (operation, outcome) in zip(batch, outcomes) {
                    if let outcome { settle(operation, refusedWith: outcome) }
                }
                return 0
            } catch {
                failures += 1
                let stoppingFor = state.withLockedValue { $0.finishedAt }.map { ContinuousClock.now - $0 }
                let decision = retry.decide(error, failures: failures, stoppingFor: stoppingFor)
                switch (error, decision) {
                case (_, .drop) where batch.count > 1:
                    break  // tried one at a time below, each reporting for itself
                case (.database(let why), .drop):
                    // Nothing waits on them any more: the failure is a loss now, reported for a while.
                    noteWriteLost(why, count: batch.count)
                case (.database(let why), _), (.unavailable(let why), _):
                    noteDatabaseFailed(why)
                case (.invalid, _), (.channelNotFound, _), (.memberNotFound, _), (.fenced, _):
                    // The database answered; the writes themselves are refused.
                    noteDatabaseAnswered()
                }
                switch decision {
                case .retry(let delay):
                    metrics?.storeRetries.increment()
                    // Powers of two, then every 30th (about a minute at the longest delay): a disk full
                    // for an hour logs about seventy lines, not one per attempt, and still shows it is
                    // not over.
                    if failures & (failures - 1) == 0 || failures % 30 == 0 {
                        logger.warning("store write failed; it is kept and tried again",
                                       metadata: ["error": "\(error)", "attempts": "\(failures)", "next in": "\(delay)",
                                                  "writes": "\(batch.count)", "waiting": "\(state.withLockedValue { $0.queue.count })"])
                    }
                    try? await Task.sleep(for: delay)
                case .drop where batch.count > 1:
                    // Some errors (out of memory, a page that reads back damaged) abort the whole
                    // transaction whichever write met them: each write alone, so that only those the
                    // database can't take are lost.
                    logger.warning("a batch of store writes failed; trying them one at a time",
                                   metadata: ["writes": "\(batch.count)", "error": "\(error)"])
                    for (index, operation) in batch.enumerated() {
                        if await write([operation]) > 0 { return batch.count - index }
                    }
                    return 0
                case .drop:
                    // Refused outright (a database it cannot write, a damaged file): trying again
                    // cannot help. The live state is still right.
                    metrics?.storeFailures.increment()
                    logger.error("store write failed", metadata: ["operation": "\(batch[0])", "error": "\(error)"])
                    return 0
                case .abandon:
                    logger.error("store write failed while stopping; giving up",
                                 metadata: ["writes": "\(batch.count)", "first": "\(batch[0])", "error": "\(error)"])
                    return batch.count
                }
            }
        }
    }

    /// One write of a batch that the database refused alone. A member removed meanwhile (an
    /// administrator's removal, whose own write follows) needs no last-seen time, push token or
    /// subscriptions, and is removed already: nothing is lost. Anything else is refused outright
    /// (its channel deleted meanwhile, a value refused, a write the database fails): trying again
    /// cannot help, and the live state is still right.
    private func settle(_ operation: StoreOperation, refusedWith error: StoreError) {
        switch (operation, error) {
        case (.touchMember, .memberNotFound), (.setPushToken, .memberNotFound), (.removeMember, .memberNotFound),
             (.clearPushToken, .memberNotFound), (.setSubscriptions, .memberNotFound):
            return
        case (_, .database(let why)):
            noteWriteLost(why, count: 1)
        case (_, .fenced):
            // A write of a channel another node holds now (this node was paused past its lease): the
            // new home keeps its own records; this one must not overwrite them.
            metrics?.fencedWrites.increment()
            logger.warning("store write refused: the channel moved to another node", metadata: ["operation": "\(operation)", "error": "\(error)"])
            return
        default:
            break
        }
        metrics?.storeFailures.increment()
        logger.error("store write failed", metadata: ["operation": "\(operation)", "error": "\(error)"])
    }

    private func noteDatabaseFailed(_ why: String) {
        let started = state.withLockedValue { state -> Bool in
            let started = state.failing == nil
            state.failing = WriteFailure(since: state.failing?.since ?? .now, attempts: (state.failing?.attempts ?? 0) + 1, error: why)
            return started
        }
        if started { metrics?.storeFailing.set(Int64(1)) }
    }

    private func noteWriteLost(_ why: String, count: Int) {
        noteDatabaseAnswered()
        state.withLockedValue { state in
            let now = ContinuousClock.now
            let earlier = state.lost.flatMap { now - $0.last < Self.lostWritesReported ? $0.count : nil } ?? 0
            state.lost = (earlier + count, now, why)
        }
    }

    private func noteDatabaseAnswered() {
        let ended = state.withLockedValue { state -> Bool in
            defer { state.failing = nil }
            return state.failing != nil
        }
        if ended { metrics?.storeFailing.set(Int64(0)) }
    }
}
