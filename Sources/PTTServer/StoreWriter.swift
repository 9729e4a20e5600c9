import ChannelHub
import ChannelStore
import Logging

/// Carries the hub's store writes to the database in order, off the event loop: the relay never
/// waits for SQLite. `enqueue` is cheap and callable from the event loop; `run` drains the queue
/// until `finish`, so a graceful shutdown writes everything before the database closes.
public final class StoreWriter: Sendable {
    let store: any ChannelStore
    let metrics: ServerMetrics?
    let logger: Logger
    private let stream: AsyncStream<StoreOperation>
    private let continuation: AsyncStream<StoreOperation>.Continuation

    public init(store: any ChannelStore, metrics: ServerMetrics?, logger: Logger) {
        self.store = store
        self.metrics = metrics
        self.logger = logger
        (stream, continuation) = AsyncStream.makeStream(of: StoreOperation.self, bufferingPolicy: .unbounded)
    }

    func enqueue(_ operation: StoreOperation) { continuation.yield(operation) }

    /// No more writes will come; `run` returns once the queue is empty.
    public func finish() { continuation.finish() }

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

    private func drainQueue() async {
        for await operation in stream {
            do {
                try await apply(operation)
            } catch {
                // A failed write is logged and counted; the live state is still right, and the next
                // write for this member carries the same fields again.
                metrics?.storeFailures.increment()
                logger.error("store write failed", metadata: ["operation": "\(operation)", "error": "\(error)"])
            }
        }
    }

    func apply(_ operation: StoreOperation) async throws(StoreError) {
        switch operation {
        case .upsertMember(let member): try await store.upsertMember(member)
        case .touchMember(let channel, let user, let lastSeen):
            do { try await store.touchMember(channel: channel, user: user, lastSeen: lastSeen) } catch .memberNotFound {}
        case .setPushToken(let channel, let user, let token, let environment, let registeredAt):
            try await store.setPushToken(channel: channel, user: user, token: token, environment: environment, registeredAt: registeredAt)
        case .removeMember(let channel, let user):
            do { try await store.removeMember(channel: channel, user: user) } catch .memberNotFound {}
        case .clearPushToken(let channel, let user):
            do { try await store.clearPushToken(channel: channel, user: user) } catch .memberNotFound {}
        case .logTransmission(let record): try await store.logTransmission(record)
        }
    }
}
