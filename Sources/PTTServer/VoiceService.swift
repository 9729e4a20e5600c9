import ChannelHub
import ChannelProtocol
import ChannelStore
import ChannelStorePostgres
import Crypto
import Foundation
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import ParticipantTokens
import ServiceLifecycle
import Wire
import WireNIO

/// The voice side of squelchd as a service: the UDP transport, the channel hub on its event loop,
/// the once-a-second chores (store revision poll, metrics), and a graceful stop that tells every
/// member the server is going away.
public final class VoiceService: Service, AdminHubHooks, Sendable {
    struct Running: Sendable {
        let server: WireServer
        let driver: NIOLoopBoundBox<HubDriver>
    }

    let configuration: ServerConfiguration
    let identity: ServerIdentity
    let store: any ChannelStore
    let tokens: TokenAuthority
    let writer: StoreWriter
    let metrics: ServerMetrics
    let logger: Logger
    let onListening: @Sendable (SocketAddress) async -> Void
    let pushes: PushDispatcher?
    /// This node's part in a cluster; nil on a single node.
    let cluster: ClusterNode?
    let running = NIOLockedValueBox<Running?>(nil)
    /// The revision poll's reloads and the admin API's channel hooks, one at a time (see
    /// `AsyncSerialQueue`): whichever runs last read the store last.
    let channelSync = AsyncSerialQueue()

    /// Store names of the transport keys that must outlive a restart: the reset key (so a restarted
    /// server resets its clients' old sessions at once) and the address-token key (so Retry tokens
    /// issued before a restart still validate).
    static let resetKeyName = "transport-reset-key"
    static let addressTokenKeyName = "transport-address-token-key"

    public init(configuration: ServerConfiguration, identity: ServerIdentity, store: any ChannelStore, tokens: TokenAuthority,
                writer: StoreWriter, metrics: ServerMetrics, logger: Logger, pushes: PushDispatcher? = nil,
                cluster: ClusterNode? = nil, onListening: @escaping @Sendable (SocketAddress) async -> Void = { _ in }) {
        self.pushes = pushes
        self.cluster = cluster
        self.configuration = configuration
        self.identity = identity
        self.store = store
        self.tokens = tokens
        self.writer = writer
        self.metrics = metrics
        self.logger = logger
        self.onListening = onListening
    }

    public func run() async throws {
        // However this ends (a failed start included), no more writes come from here: the store
        // writer can drain and the database close without waiting for its cancellation grace.
        defer { writer.finish() }
        let tokenKey = SymmetricKey(data: try await persistentKey(Self.addressTokenKeyName))
        // In a cluster the address-token key is every node's (it is in the database), and so is the
        // key of the entry passes derived from it: one node issues them with its redirects, the
        // home honours them.
        let secrets = ServerSecrets(
            identity: identity,
            resetKey: SymmetricKey(data: try await persistentKey(Self.resetKeyName)),
            tokenKey: tokenKey,
            clockEpoch: WireNIO.monotonicClockEpoch(),
            entryPasses: cluster.map { EntryPasses(sharedKey: tokenKey, audience: $0.id.rawValue) })
        var hubConfiguration = HubConfiguration()
        hubConfiguration.fullDuplexMaxTalkers = configuration.fullDuplexMaxTalkers
        hubConfiguration.disconnectGrace = UInt64(configuration.disconnectGraceSeconds * 1e9)
        hubConfiguration.maxQueue = configuration.maxQueue
        hubConfiguration.controlMessagesPerSecond = configuration.controlMessagesPerSecond
        hubConfiguration.controlMessageBurst = 2 * configuration.controlMessagesPerSecond
        hubConfiguration.floorGrantsPerMinute = configuration.floorGrantsPerMinute
        hubConfiguration.floorGrantBurst = max(3, configuration.floorGrantsPerMinute / 5)
        hubConfiguration.firstBurst = HubConfiguration.randomFirstBurst
        hubConfiguration.pushKinds = pushes?.kinds ?? []
        hubConfiguration.clustered = cluster != nil
        let hub = ChannelHub(configuration: hubConfiguration)
        let initialRevision = try await store.revision()
        // Joins check the store. Stored members carry the token they last joined with, so the
        // revocations already stored (some made by the CLI while the server was down) are applied to
        // them now: a revoked offline member leaves, and is told to by push. `apply` spares a member
        // that joined with a newer token, so replaying all of them is safe. Later ones, by any
        // process, reach the hub through the revision poll.
        let storedRevocations = try await store.revocations(after: 0, channel: nil)
        let initialRevocation = storedRevocations.last?.sequence ?? 0
        // The time the server was down counts as presence: every stored last-seen time moves on by
        // it, in the store and once, so a long outage (or a crash, after which connected members'
        // rows are up to an hour old) doesn't make everyone look long gone to `memberRetentionDays`.
        // (In a cluster the other nodes were up meanwhile: nothing to credit.)
        _ = try await store.recordServerAlive(at: Date(), creditingDowntime: cluster == nil)
        // Bursts the last server logged as starting and never ended: it died during them. In a
        // cluster other nodes' bursts go on; each channel's next home closes its own (its claim).
        let interrupted = cluster == nil ? try await store.closeInterruptedTransmissions() : 0
        if interrupted > 0 {
            logger.notice("the transmission log had bursts without an end (the server was killed during them, or could not write their end); they are marked interrupted",
                          metadata: ["bursts": "\(interrupted)"])
        }
        for channel in try await store.channels() {
            hub.upsertChannel(channel, members: try await store.members(of: channel.id), at: HubDriver.now())
        }
        for revocation in storedRevocations { hub.apply(revocation, at: HubDriver.now()) }
        let channelCount = hub.channelCount
        // The relay has loops of its own, so that NIO can report each of their ticks (RelayLoopTicks):
        // the first runs the transport and the hub; the others send copies for it (FanoutWorkers).
        let relayLoops = MultiThreadedEventLoopGroup(numberOfThreads: configuration.relayThreads,
                                                     metricsDelegate: RelayLoopTicks(ticks: metrics.loopTicks, stalls: metrics.loopStalls))
        defer { relayLoops.shutdownGracefully { _ in } }
        let loops = Array(relayLoops.makeIterator())
        let eventLoop = loops[0]
        let relayFanout = metrics.relayFanout
        let fanout = loops.count > 1
            ? FanoutWorkers(loops: Array(loops.dropFirst())) { started in relayFanout.recordNanoseconds(Int64(WireNIO.now().since(started))) }
            : nil
        let driver = HubDriver(hub: hub, eventLoop: eventLoop, tokens: tokens, writer: writer, metrics: metrics, logger: logger)
        driver.pushes = pushes
        driver.cluster = cluster
        driver.entryPasses = secrets.entryPasses
        driver.livenessWindow = UInt64(configuration.pushWakeSilenceSeconds * 1e9)
        let box = NIOLoopBoundBox.makeBoxSendingValue(driver, as: HubDriver.self, eventLoop: eventLoop)
        var endpointConfiguration = EndpointConfiguration()
        endpointConfiguration.maxConnections = configuration.maxConnections
        endpointConfiguration.handshakesPerSecondPerAddress = configuration.handshakesPerSecondPerAddress
        endpointConfiguration.maxConnectionsPerAddress = configuration.maxConnectionsPerAddress
        // A source may have as many connections joining as four seconds of its handshakes (a whole
        // crew behind one NAT address reconnecting at once joins within one), and at least 64.
        endpointConfiguration.maxUnadmittedPerAddress = max(64, 4 * configuration.handshakesPerSecondPerAddress)
        endpointConfiguration.maxUnadmitted = max(1_000, configuration.maxConnections / 10)
        let server: WireServer
        do {
            server = try await WireServer.start(host: configuration.host, port: configuration.port,
                                                endpoint: Endpoint(secrets: secrets, configuration: endpointConfiguration),
                                                delegate: ForwardingDelegate(driver: box), on: eventLoop, fanout: fanout)
        } catch where ListenError.isBindFailure(error) {
            throw ListenError.voice(host: configuration.host, port: configuration.port, error)
        }
        try await eventLoop.submit {
            box.value.server = server
            box.value.startSweeping()
        }.get()
        running.withLockedValue { $0 = Running(server: server, driver: box) }
        logger.notice("voice transport listening", metadata: ["address": "\(server.localAddress)", "channels": "\(channelCount)"])
        await onListening(server.localAddress)

        // The cluster node's heartbeat and leases outlive the graceful shutdown's start: a drain
        // hands channels over while they are still held.
        var clusterTask: Task<Void, any Error>?
        if let cluster {
            let hooks = HubDriver.clusterHooks(box, on: eventLoop)
            let host = configuration.advertisedHost, port = server.localAddress.port ?? configuration.port
            let admin = configuration.adminPort == 0 ? nil : "http://\(ServerConfiguration.urlHost(configuration.adminHost)):\(configuration.adminPort)"
            await cluster.setDrainHooks(HubDriver.drainHooks(box, on: eventLoop))
            clusterTask = Task { try await cluster.run(voiceHost: host, voicePort: port, adminURL: admin, hooks: hooks) }
        }
        defer { clusterTask?.cancel() }

        await cancelWhenGracefulShutdown {
            await withThrowingTaskGroup(of: Void.self) { chores in
                // The hourly chores run beside the poll: a prune of millions of records (after
                // `transmissionLogDays` was lowered) takes minutes, and revocations, deletions and new
                // channels must not wait for it.
                chores.addTask {
                    while !Task.isCancelled {
                        await self.pruneTransmissionLog()
                        await self.pruneAuditTrail()
                        // Not once shutdown began: the last record is written after the transport stops.
                        guard !Task.isCancelled else { break }
                        await self.recordAlive()
                        try await Task.sleep(for: Self.pruneInterval)
                    }
                }
                defer { chores.cancelAll() }
                var revision = initialRevision
                var revocation = initialRevocation
                var nextForget = ContinuousClock.now
                // The poll runs every second; in a cluster also as soon as the database says another
                // node (or a command) changed something (LISTEN/NOTIFY: the hint; the read: the truth).
                let (polls, poll) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
                chores.addTask {
                    while !Task.isCancelled {
                        try await Task.sleep(for: .seconds(1))
                        poll.yield()
                    }
                }
                if let shared = self.store as? PostgresChannelStore {
                    chores.addTask { for await _ in shared.changes() { poll.yield() } }
                }
                for await _ in polls {
                    if ContinuousClock.now >= nextForget {
                        nextForget = .now + Self.forgetInterval
                        await self.forgetIdleMembers()
                    }
                    try? await eventLoop.submit { box.value.publish(to: self.metrics) }.get()
                    do {
                        let latest = try await self.store.revision()
                        let recheck = await self.onLoop { $0.hub.takeChannelsLoadedByChecks() } ?? false
                        if latest != revision || recheck {
                            try await self.reloadChannels()
                            revocation = try await self.applyRevocations(after: revocation)
                            // Only now: after a failed read the next poll tries this revision again,
                            // rather than leaving a deleted channel or a revoked member live.
                            revision = latest
                        }
                    } catch {
                        self.logger.error("could not read channels from the store", metadata: ["error": "\(error)"])
                    }
                }
            }
        }

        if let cluster {
            logger.notice("draining: handing this node's channels to the other nodes")
            let moved = await cluster.drain(within: cluster.drainWait, hooks: HubDriver.drainHooks(box, on: eventLoop))
            logger.notice("drained", metadata: ["channels moved": "\(moved)"])
        }
        logger.notice("voice transport stopping: telling members the server is going away")
        running.withLockedValue { $0 = nil }
        try? await eventLoop.submit {
            box.value.hub.shutdown(reason: "the server is shutting down", at: HubDriver.now())
            box.value.flush()
            box.value.publish(to: self.metrics)
        }.get()
        await server.stop(closingConnections: true, code: CloseCode.goingAway.rawValue, reason: "server shutting down")
        try? await eventLoop.submit {
            box.value.stopped = true
            box.value.armTimer()
        }.get()
        await recordAlive()
    }

    /// Writes the connected members' last-seen times and records that the server is running (see
    /// `ChannelStore.recordServerAlive`): hourly, and once more when the transport has stopped.
    /// Detached, so that a cancelled service group (GRDB refuses work from a cancelled task) still
    /// leaves a record that is up to date.
    func recordAlive() async {
        let connected = await onLoop { $0.hub.connectedMembers } ?? []
        let store = store, logger = logger
        await Task.detached {
            let now = Date()
            do {
                try await store.touchMembers(connected, lastSeen: now)
                _ = try await store.recordServerAlive(at: now, creditingDowntime: false)
            } catch {
                logger.warning("could not record that the server is running; after a crash, members' absence may count from before it",
                               metadata: ["error": "\(error)"])
            }
        }.value
    }

    /// `days` before `now`; nil for 0, which the retention settings use for "keep for good".
    static func cutoff(days: Int, before now: Date) -> Date? {
        days > 0 ? now.addingTimeInterval(-Double(days) * 86_400) : nil
    }

    static let pruneInterval = Duration.seconds(3_600)
    /// Records one prune statement deletes: small enough that the write lock is back within
    /// milliseconds for the store writer and the CLI.
    static let pruneBatch = 5_000

    /// Deletes transmission records older than `transmissionLogDays` (0: none), in batches; returns
    /// how many went. A failure is logged, and the next hour tries again.
    @discardableResult
    func pruneTransmissionLog(now: Date = Date()) async -> Int {
        await prune("transmission log", days: configuration.transmissionLogDays, now: now) { cutoff throws(StoreError) in
            let deleted = try await store.pruneTransmissions(startedBefore: cutoff, limit: Self.pruneBatch)
            metrics.transmissionsPruned.increment(by: Int64(deleted))
            return deleted
        }
    }

    /// Deletes audit records older than `auditDays` (0: none), as the transmission log's prune does.
    @discardableResult
    func pruneAuditTrail(now: Date = Date()) async -> Int {
        await prune("audit trail", days: configuration.auditDays, now: now) { cutoff throws(StoreError) in
            try await store.pruneAudit(before: cutoff, limit: Self.pruneBatch)
        }
    }

    /// Runs `batch` (which deletes at most `pruneBatch` records older than its cut-off) until a batch
    /// comes back short; logs what went, or why it stopped.
    private func prune(_ what: String, days: Int, now: Date,
                       _ batch: (Date) async throws(StoreError) -> Int) async -> Int {
        guard let cutoff = Self.cutoff(days: days, before: now) else { return 0 }
        var total = 0
        do {
            while !Task.isCancelled {
                let deleted = try await batch(cutoff)
                total += deleted
                if deleted < Self.pruneBatch { break }
            }
        } catch {
            logger.warning("could not prune the \(what); trying again in an hour",
                           metadata: ["error": "\(error)", "deleted": "\(total)", "next": "check the data directory's disk (space, I/O errors)"])
        }
        if total > 0 {
            logger.notice("\(what) pruned", metadata: ["deleted": "\(total)", "older than days": "\(days)"])
        }
        return total
    }

    /// How often members away too long are looked for, and how many go at a time: each costs a
    /// `participantLeft` to everyone connected, so a backlog of thousands (the setting just turned
    /// on) leaves over hours in small steps rather than in one long stall of the event loop.
    static let forgetInterval = Duration.seconds(60)
    static let forgetBatch = 20

    /// Forgets members away longer than `memberRetentionDays` (0: none), at most `forgetBatch`;
    /// returns how many.
    @discardableResult
    func forgetIdleMembers(now: Date = Date()) async -> Int {
        let days = configuration.memberRetentionDays
        guard let cutoff = Self.cutoff(days: days, before: now) else { return 0 }
        let forgotten = await onLoop { $0.hub.forgetIdleMembers(seenBefore: cutoff, limit: Self.forgetBatch, at: HubDriver.now()) } ?? 0
        if forgotten > 0 {
            metrics.membersForgotten.increment(by: Int64(forgotten))
            logger.notice("members forgotten after staying away", metadata: ["forgotten": "\(forgotten)", "away longer than days": "\(days)"])
        }
        return forgotten
    }

    func persistentKey(_ name: String) async throws -> [UInt8] {
        var fresh = [UInt8](repeating: 0, count: 32)
        var generator = SystemRandomNumberGenerator()
        for index in fresh.indices { fresh[index] = generator.next() }
        return try await store.storeServerKeyIfAbsent(named: name, value: fresh)
    }

    /// Brings the hub in line with the store after another process (the `squelchd channel` CLI)
    /// changed channels. `afterRead` runs between the store read and the hub's update: tests use it
    /// to land an admin change in that gap.
    func reloadChannels(afterRead: @escaping @Sendable () async -> Void = {}) async throws {
        try await channelSync.run {
            guard let running = self.running.withLockedValue({ $0 }) else { return }
            // What the hub held before the read: only those can be missing from it because the store
            // deleted them. A channel loaded meanwhile by a join's token check (created after the
            // read) is not in the read either, and used to be deleted from the hub with its new
            // member refused as 'channel deleted'.
            let known = Set(try await running.server.submit { _ in running.driver.value.hub.channelIDs })
            let records = try await self.store.channels()
            var members: [UUID: [MemberRecord]] = [:]
            for record in records where !known.contains(record.id) { members[record.id] = try await self.store.members(of: record.id) }
            let fetched = members
            await afterRead()
            try await running.server.submit { _ in
                let driver = running.driver.value
                let now = HubDriver.now()
                let ids = Set(records.map(\.id))
                for id in driver.hub.channelIDs where known.contains(id) && !ids.contains(id) { driver.hub.deleteChannel(id, at: now) }
                for record in records { driver.hub.upsertChannel(record, members: fetched[record.id] ?? [], at: now) }
                driver.flush()
            }
        }
    }

    /// Applies revocations stored after `sequence` (by the CLI, or the admin API, whose own ones the
    /// hub has seen already and ignores); returns the last one's sequence.
    func applyRevocations(after sequence: Int64) async throws -> Int64 {
        let fresh = try await store.revocations(after: sequence, channel: nil)
        guard let last = fresh.last else { return sequence }
        _ = await onLoop { driver in
            for revocation in fresh { driver.hub.apply(revocation, at: HubDriver.now()) }
        }
        return last.sequence
    }

    // MARK: AdminHubHooks

    func onLoop<T: Sendable>(_ body: @escaping @Sendable (HubDriver) -> T) async -> T? {
        guard let running = running.withLockedValue({ $0 }) else { return nil }
        return try? await running.server.submit { _ in
            let result = body(running.driver.value)
            running.driver.value.flush()
            return result
        }
    }

    public func channelChanged(_ id: UUID) async {
        // The store is read inside the queue, so that of two changes in a row the later one is
        // applied last, whichever hook call ran first.
        await channelSync.run {
            guard let record = try? await self.store.channel(id) else { return }
            _ = await self.onLoop { $0.hub.upsertChannel(record, at: HubDriver.now()) }
        }
    }

    public func channelDeleted(_ id: UUID) async {
        await channelSync.run {
            _ = await self.onLoop { $0.hub.deleteChannel(id, at: HubDriver.now()) }
        }
    }

    public func memberRemoved(channel: UUID, user: String, revocation: RevocationRecord) async {
        _ = await onLoop {
            // A join being checked may have read the revocations just before this one was stored.
            $0.hub.noteRevocation(revocation)
            $0.hub.removeMember(channel: channel, user: user, at: HubDriver.now())
        }
    }

    public func isMember(channel: UUID, user: String) async -> Bool {
        await onLoop { $0.hub.isMember(channel: channel, user: user) } ?? false
    }

    public func tokenRevoked(_ revocation: RevocationRecord) async {
        _ = await onLoop { $0.hub.apply(revocation, at: HubDriver.now()) }
    }

    /// APNs called a member's token dead: forget it in the hub, which forgets it in the store.
    public func pushTokenRejected(channel: UUID, user: String, token: String) async {
        _ = await onLoop { $0.hub.pushTokenRejected(channel: channel, user: user, token: token) }
    }

    public func roster(of channel: UUID) async -> [LiveMember] {
        await onLoop { $0.hub.liveRoster(of: channel) } ?? []
    }

    public func connectionCount() async -> Int {
        await onLoop { $0.openConnections } ?? 0
    }

    /// Whether the transport is up.
    public var isRunning: Bool { running.withLockedValue { $0 != nil } }

    /// Why the running transport can't carry anything now (its socket was lost and is not bound
    /// again yet), for `/healthz`; nil when it can.
    public func transportProblem() async -> String? {
        guard let running = running.withLockedValue({ $0 }) else { return nil }
        return (try? await running.server.submit { $0.socketProblem }) ?? nil
    }
}

/// The `WireServer` takes its delegate by `sending`; the driver itself is also reached from the
/// service's tasks through its loop-bound box, so the server gets this forwarder, which holds the
/// same box. Every call comes on the event loop, where the box may be opened.
final class ForwardingDelegate: WireServerDelegate {
    let driver: NIOLoopBoundBox<HubDriver>
    init(driver: NIOLoopBoundBox<HubDriver>) { self.driver = driver }

    func wireServer(_ server: WireServer, handle: Endpoint.Handle, event: ConnectionEvent) {
        driver.value.wireServer(server, handle: handle, event: event)
    }

    func wireServer(_ server: WireServer, handle: Endpoint.Handle, datagram payload: UnsafeRawBufferPointer) {
        driver.value.wireServer(server, handle: handle, datagram: payload)
    }

    func wireServer(_ server: WireServer, didRebindAfter error: (any Error)?) {
        driver.value.wireServer(server, didRebindAfter: error)
    }
}

/// Runs the store writer until the voice service finishes it, then checkpoints and closes the
/// database. First in the service group, so it stops last.
public struct StoreService: Service {
    let writer: StoreWriter
    let store: any ChannelStore
    let logger: Logger

    public init(writer: StoreWriter, store: any ChannelStore, logger: Logger) {
        self.writer = writer
        self.store = store
        self.logger = logger
    }

    public func run() async throws {
        await writer.run()
        // The writer's stream ends when the voice transport stops, which is before the group asks the
        // services queued behind it (pushes, the simulator) to stop. Returning now would count as
        // finishing unexpectedly and fail the whole shutdown, so the database waits for its turn.
        // (Cancelled, the group has no turns: this returns at once.)
        try? await gracefulShutdown()
        // Closed from a task of its own, as the writer drains: a cancelled group (a service failed)
        // would otherwise leave the checkpoint undone, since GRDB refuses work from a cancelled task.
        let (store, logger) = (store, logger)
        let closed = await Task.detached { () -> Bool in
            do {
                try await store.close()
                return true
            } catch {
                logger.error("database did not close cleanly; its WAL will be replayed on the next start", metadata: ["error": "\(error)"])
                return false
            }
        }.value
        if closed { logger.notice("database flushed and closed") }
    }
}
