import NIOConcurrencyHelpers
import NIOCore
import Synchronization
import Wire

#if canImport(Glibc)
import Glibc
#endif

/// The relay's fan-out on more than one core (issue 41 item 4). The server's loop still reads every
/// datagram and runs every decision (the endpoint and the hub are one state machine on one loop);
/// what a relayed frame costs per listener (writing its envelope and the kernel's `sendmmsg`, most
/// of the relay's time) goes to the worker a talker is spread to, on a loop of its own, through a
/// duplicate of the socket's descriptor. Talkers are spread by their connection, so the channels
/// they talk in are too.
///
/// A talker's packet becomes a `FanoutJob` on the server's loop (the media once, and each listener's
/// connection ID and `sockaddr`, everything already counted as sent there), handed to the worker
/// with one `execute`; the worker writes and sends it and returns the job to its free list.
public final class FanoutWorkers: Sendable {
    let workers: [FanoutWorker]

    /// One worker per loop of `loops`. `sent` is called on the worker's loop with the time the
    /// job's talker packet was read, after its copies went to the kernel.
    public init(loops: [any EventLoop], sent: @escaping @Sendable (WireInstant) -> Void = { _ in }) {
        workers = loops.map { FanoutWorker(loop: $0, sent: sent) }
    }

    public var count: Int { workers.count }

    /// Copies the kernel refused, or that found its send buffer full (dropped: a worker has no
    /// NIO write path to wait on), since the last call.
    func takeFailures() -> Int { workers.reduce(0) { $0 + $1.failures.exchange(0, ordering: .relaxed) } }

    /// Gives each worker a duplicate of the server's socket (after each bind), or closes theirs (nil).
    func useSocket(_ descriptor: CInt?, slot: Int) {
        for worker in workers {
            let own = descriptor.map { dup($0) }
            worker.loop.execute { worker.state.value.use(own.flatMap { $0 >= 0 ? $0 : nil }, slot: slot) }
        }
    }
}

/// One talker packet's copies for one worker. Owned by one thread at a time: the server's loop
/// fills it, `execute` hands it to the worker's loop (a happens-before edge), the worker sends it and
/// puts it back on its free list under the list's lock; nobody keeps a reference meanwhile. That
/// hand-over is what makes `@unchecked Sendable` safe here.
final class FanoutJob: @unchecked Sendable {
    var media: [UInt8] = []
    var destinations: [ConnectionID] = []
    var paths: [PathAddress] = []
    /// Each destination's `sockaddr`, written on the server's loop (which knows link-local scopes).
    var sockaddrs: [FanoutSockaddr] = []
    var started = WireInstant(nanoseconds: 0)

    init() {
        media.reserveCapacity(1_200)
        destinations.reserveCapacity(256)
        paths.reserveCapacity(256)
        sockaddrs.reserveCapacity(256)
    }

    func clear() {
        media.removeAll(keepingCapacity: true)
        destinations.removeAll(keepingCapacity: true)
        paths.removeAll(keepingCapacity: true)
        sockaddrs.removeAll(keepingCapacity: true)
    }
}

/// Room for a `sockaddr_in6` and its length.
struct FanoutSockaddr {
    var bytes: (UInt64, UInt64, UInt64, UInt64) = (0, 0, 0, 0)
    var length: Int = 0
}

final class FanoutWorker: Sendable {
    struct State {
        var batch: BatchSender?
        mutating func use(_ descriptor: CInt?, slot: Int) {
            batch?.close()
            batch = descriptor.map { BatchSender(descriptor: $0, slot: slot) }
        }
    }

    let loop: any EventLoop
    /// Touched only on `loop` (`useSocket`, `send`).
    let state: NIOLoopBoundBox<State>
    let free = NIOLockedValueBox<[FanoutJob]>([])
    let failures = Atomic<Int>(0)
    let sent: @Sendable (WireInstant) -> Void

    init(loop: any EventLoop, sent: @escaping @Sendable (WireInstant) -> Void) {
        self.loop = loop
        self.sent = sent
        state = NIOLoopBoundBox.makeBoxSendingValue(State(), as: State.self, eventLoop: loop)
    }

    /// A job to fill, from the free list if it has one.
    func takeJob() -> FanoutJob {
        free.withLockedValue { $0.popLast() } ?? FanoutJob()
    }

    func submit(_ job: FanoutJob) {
        loop.execute { [self] in
            send(job)
            job.clear()
            free.withLockedValue { $0.append(job) }
        }
    }

    private func send(_ job: FanoutJob) {
        var dropped = 0
        if let batch = state.value.batch, batch.isOpen {
            job.media.withUnsafeBytes { media in
                for index in job.destinations.indices {
                    if batch.isFull { dropped += flush(batch) }
                    guard let length = MediaEnvelope.write(media, to: job.destinations[index], into: batch.nextSlot) else {
                        dropped += 1
                        continue
                    }
                    withUnsafeBytes(of: job.sockaddrs[index].bytes) { batch.nextAddress.copyMemory(from: $0.baseAddress!, byteCount: job.sockaddrs[index].length) }
                    batch.commit(length: length, path: job.paths[index], addressLength: job.sockaddrs[index].length)
                }
            }
            dropped += flush(batch)
        } else {
            dropped = job.destinations.count
        }
        if dropped > 0 { failures.add(dropped, ordering: .relaxed) }
        sent(job.started)
    }

    /// Sends what the batch holds; returns how many copies did not go.
    private func flush(_ batch: BatchSender) -> Int {
        let outcome = batch.send()
        let blocked = outcome.blockedFrom.map { batch.count - $0 } ?? 0
        batch.reset()
        return outcome.failures + blocked
    }
}
