import ChannelProtocol
import ChannelStore
import ChannelStorePostgres
import ClusterPlacement
import Foundation
import Logging
import Prometheus
import Synchronization
import Wire
import WireNIO

/// This squelchd as a node of a cluster: it keeps its `node` row alive, holds its channels' leases
/// (ClusterPlacement's `LeaseKeeper`), answers where a join belongs (`place`), and fences the
/// channels it loses. The decisions are the placement core's; this is its driver: it runs them as
/// transactions (`PostgresChannelStore+Cluster`), keeps time, and tells the hub what it may serve.
///
/// The clock is the hub's (`WireNIO.now()`, CLOCK_MONOTONIC), so that the validity the keeper
/// computes is the one the hub compares each grant and packet with; it keeps running while the
/// process is stopped (SIGSTOP), which is what makes a paused node find its leases over on resuming.
public actor ClusterNode {
    /// What a join's placement came to.
    enum Placement: Sendable {
        /// This node is the channel's home until `validUntil` (hub clock). `takenUp`: it was not
        /// before this join (the hub loads the channel afresh from the store).
        case serve(validUntil: WireInstant, takenUp: Bool)
        case redirect(NodeAddress)
        case unavailable(String)
    }

    /// What the hub must hear, on its event loop.
    struct Hooks: Sendable {
        /// The leases renewed or taken, with their validity (hub clock).
        var held: @Sendable ([UUID: WireInstant]) async -> Void
        /// Leases lost: stop serving, send members away.
        var fenced: @Sendable ([UUID], String) async -> Void
    }

    let id: NodeID
    let store: PostgresChannelStore
    let policy: PlacementPolicy
    let logger: Logger
    let metrics: ClusterMetrics
    private var keeper: LeaseKeeper<UUID>
    private var state = NodeState.serving
    /// The epoch of each channel held, for the store's fencing (read off the actor).
    let epochs = HeldEpochs()
    /// Placements under way, so that joins arriving together for one channel make one claim.
    private var placing: [UUID: Task<Placement, Never>] = [:]
    /// How long a join may wait for a silent home's lease to run out before it is refused.
    let longestWait: Duration

    /// How long a drain waits for bursts in progress (`drainSeconds`).
    let drainWait: Duration

    init(id: NodeID, store: PostgresChannelStore, lease: Duration, drainWait: Duration, metrics: ClusterMetrics, logger: Logger) {
        self.id = id
        self.drainWait = drainWait
        self.store = store
        policy = PlacementPolicy(lease: lease, heartbeatStaleness: min(.seconds(3), lease * 0.6))
        keeper = LeaseKeeper(settings: .init(lease: lease))
        longestWait = lease * 2
        self.metrics = metrics
        self.logger = logger
        let epochs = self.epochs
        store.fence(PostgresChannelStore.Fencing(node: id) { channel in epochs.epoch(of: channel) })
    }

    static func localNow() -> LocalInstant { LocalInstant(nanoseconds: Int64(WireNIO.now().nanoseconds)) }
    static func hubInstant(_ local: LocalInstant) -> WireInstant { WireInstant(nanoseconds: UInt64(max(0, local.nanoseconds))) }

    // MARK: Joins

    /// Where a join for `channel` belongs: here (claimed now if not held), or at its home.
    func place(_ channel: UUID) async -> Placement {
        if let holding = keeper.holding(channel), keeper.isServing(channel, now: Self.localNow()) {
            return .serve(validUntil: Self.hubInstant(holding.validUntil), takenUp: false)
        }
        if let under = placing[channel] { return await under.value }
        let task = Task { await self.claim(channel) }
        placing[channel] = task
        let placement = await task.value
        placing[channel] = nil
        return placement
    }

    private func claim(_ channel: UUID) async -> Placement {
        let started = Self.localNow()
        while true {
            let sent = Self.localNow()
            let outcome: ClaimOutcome
            do { outcome = try await store.claim(channel, requester: id, policy: policy) } catch {
                return .unavailable("the cluster's database did not answer (\(error)); try again shortly")
            }
            switch outcome.decision {
            case .existing(let row):
                return redirect(row, outcome)
            case .moved(let row, _) where row.home == id:
                keeper.acquired(channel, epoch: row.epoch, requestSentAt: sent)
                epochs.set(channel, row.epoch)
                metrics.placements.increment()
                logger.info("channel placed here", metadata: ["channel": "\(channel)", "epoch": "\(row.epoch.rawValue)"])
                guard let holding = keeper.holding(channel), keeper.isServing(channel, now: Self.localNow()) else {
                    return .unavailable("the cluster's database answered too slowly to hold the channel; try again")
                }
                return .serve(validUntil: Self.hubInstant(holding.validUntil), takenUp: true)
            case .moved(let row, _):
                return redirect(row, outcome)
            case .awaitingExpiry(let row):
                // The home went silent, but may only be paused: nobody may take the channel before
                // its lease runs out. The join waits that long (a client sees a slow join, not a
                // refusal), then tries again.
                let wait = row.leaseExpiry - outcome.dbNow + .milliseconds(20)
                guard Self.localNow() - started + wait <= longestWait else {
                    return .unavailable("the channel's node \(row.home) stopped answering; its lease runs out in \(wait), try again then")
                }
                try? await Task.sleep(for: wait)
            case .noNodeAvailable:
                return .unavailable("no node of the cluster can take the channel now (none serving and live); try again shortly")
            }
        }
    }

    private func redirect(_ row: PlacementRow<UUID>, _ outcome: ClaimOutcome) -> Placement {
        guard let node = outcome.node(row.home), let port = UInt16(exactly: node.voicePort) else {
            return .unavailable("the channel's node \(row.home) is not in the cluster's node list; try again shortly")
        }
        metrics.redirects.increment()
        return .redirect(NodeAddress(node: row.home.rawValue, host: node.voiceHost, port: port, epoch: UInt64(row.epoch.rawValue)))
    }

    // MARK: Heartbeat and leases

    /// Registers the node, then heartbeats and renews every second until cancelled. Leases whose
    /// validity runs out without a renewal are fenced on time even while the database hangs: the
    /// clock's loop never waits for the database.
    func run(voiceHost: String, voicePort: Int, adminURL: String?, hooks: Hooks) async throws {
        try await store.registerNode(id, voiceHost: voiceHost, voicePort: voicePort, adminURL: adminURL)
        logger.notice("cluster node registered", metadata: ["node": "\(id)", "voice": "\(voiceHost):\(voicePort)",
                                                             "lease": "\(policy.lease)"])
        await withTaskGroup(of: Void.self) { group in
            group.addTask { await self.renewals(hooks) }
            group.addTask { await self.ticks(hooks) }
            await group.waitForAll()
        }
    }

    private func ticks(_ hooks: Hooks) async {
        while !Task.isCancelled {
            let fenced = keeper.tick(now: Self.localNow()).map { event -> UUID in
                switch event { case .fenced(let channel, _): channel }
            }
            if !fenced.isEmpty { await lose(fenced, "this node could not renew its lease on the channel in time", hooks: hooks) }
            try? await Task.sleep(for: .milliseconds(50))
        }
    }

    private func renewals(_ hooks: Hooks) async {
        let interval = keeper.settings.renewInterval
        while !Task.isCancelled {
            let sent = Self.localNow()
            await renew(keeper.startRenewal(now: sent), sent: sent, hooks: hooks)
            let wait = sent + interval - Self.localNow()
            if wait > .zero { try? await Task.sleep(for: wait) }
        }
    }

    private func renew(_ held: [HeldLease<UUID>], sent: LocalInstant, hooks: Hooks) async {
        // Bounded, so that a database cut off mid-call does not hold back the next attempt: a
        // renewal is worth something only within the lease.
        let (store, id, load, state, policy) = (store, id, keeper.held.count, state, policy)
        let cap = keeper.settings.validity / 3
        let result: Result<RenewalDecision<UUID>, StoreError> = await withTaskGroup(of: Result<RenewalDecision<UUID>, StoreError>?.self) { group in
            group.addTask {
                do throws(StoreError) {
                    let (renewal, recorded) = try await store.heartbeat(id, load: load, state: state, renewing: held, policy: policy)
                    if recorded == .draining, state == .serving { await self.drainRequested() }
                    return .success(renewal)
                } catch { return .failure(error) }
            }
            group.addTask {
                try? await Task.sleep(for: cap)
                return .failure(.unavailable("no answer within \(cap)"))
            }
            let first = await group.next() ?? nil
            group.cancelAll()
            return first ?? .failure(.unavailable("cancelled"))
        }
        let decision: RenewalDecision<UUID>
        switch result {
        case .success(let value): decision = value
        case .failure(let error):
            metrics.renewalFailures.increment()
            logger.warning("cluster heartbeat failed; the channels held here stop being served once their leases run out",
                           metadata: ["error": "\(error)", "held": "\(held.count)"])
            return
        }
        let renewed = decision.renewed.map { HeldLease(channel: $0.channel, epoch: $0.epoch) }
        keeper.renewalSucceeded(renewed, requestSentAt: sent)
        if !renewed.isEmpty { metrics.renewals.increment(by: Int64(renewed.count)) }
        var validity: [UUID: WireInstant] = [:]
        for lease in renewed {
            if let holding = keeper.holding(lease.channel) { validity[lease.channel] = Self.hubInstant(holding.validUntil) }
        }
        if !validity.isEmpty { await hooks.held(validity) }
        let lost = decision.lost.compactMap { keeper.lost($0.channel, epoch: $0.epoch) ? $0.channel : nil }
        if !lost.isEmpty { await lose(lost, "another node holds the channel now", hooks: hooks) }
    }

    private func lose(_ channels: [UUID], _ why: String, hooks: Hooks) async {
        for channel in channels { epochs.set(channel, nil) }
        metrics.leasesLost.increment(by: Int64(channels.count))
        logger.warning("channels fenced: no longer served here", metadata: ["channels": "\(channels)", "why": "\(why)"])
        await hooks.fenced(channels, why)
    }

    /// The channels held now, for `GET /v1/cluster` and draining.
    var held: [UUID] { keeper.held.map(\.channel) }

    // MARK: Draining

    /// The hub's side of a drain, set by whoever runs the node (VoiceService).
    private var drainHooks: DrainHooks?

    func setDrainHooks(_ hooks: DrainHooks) { drainHooks = hooks }

    /// An operator marked this node draining (`squelchd node drain`, `POST /v1/cluster/nodes/ID/drain`):
    /// its channels go to the other nodes, and it keeps running, taking no new ones.
    private func drainRequested() {
        guard state == .serving, let hooks = drainHooks else { return }
        state = .draining
        logger.notice("this node was marked draining: handing its channels to the other nodes")
        Task { await self.drain(within: drainWait, hooks: hooks) }
    }

    /// What a drain asks of the hub, on its event loop.
    struct DrainHooks: Sendable {
        var isTalking: @Sendable (UUID) async -> Bool
        var endTenure: @Sendable (UUID) async -> Void
        var move: @Sendable (UUID, NodeAddress) async -> Void
    }

    /// Hands every channel held here to another node: marked draining first (no new channel comes
    /// here), each channel waits for its burst in progress to end (at most until `deadline` for all),
    /// stops being served here, is handed over in the database (a new home, a new epoch), and its
    /// members are told to `move` there, so that they reconnect at once instead of timing out.
    /// Returns how many were handed over; with no other live node, the channels stay (and end with
    /// the process, as on a single node).
    @discardableResult
    func drain(within deadline: Duration, hooks: DrainHooks) async -> Int {
        state = .draining
        do { _ = try await store.setNodeState(id, .draining) } catch {
            logger.warning("could not mark this node draining", metadata: ["error": "\(error)"])
        }
        let until = ContinuousClock.now + deadline
        var moved = 0
        for channel in keeper.held.map(\.channel) {
            while ContinuousClock.now < until, await hooks.isTalking(channel) {
                try? await Task.sleep(for: .milliseconds(100))
            }
            guard let epoch = keeper.release(channel) else { continue }
            epochs.set(channel, nil)
            await hooks.endTenure(channel)
            let outcome: (decision: HandOverDecision<UUID>, nodes: [ClusterNodeRecord])
            do { outcome = try await store.handOver(channel, from: id, epoch: epoch, policy: policy) } catch {
                logger.warning("could not hand a channel over; its members reconnect once this node is gone",
                               metadata: ["channel": "\(channel)", "error": "\(error)"])
                continue
            }
            switch outcome.decision {
            case .moved(let row, _):
                guard let node = outcome.nodes.first(where: { $0.id == row.home }), let port = UInt16(exactly: node.voicePort) else { continue }
                let home = NodeAddress(node: row.home.rawValue, host: node.voiceHost, port: port, epoch: UInt64(row.epoch.rawValue))
                await hooks.move(channel, home)
                metrics.moves.increment()
                moved += 1
                logger.notice("channel handed over", metadata: ["channel": "\(channel)", "to": "\(home)"])
            case .noNodeAvailable:
                logger.notice("no other node can take the channel; it ends here with this node", metadata: ["channel": "\(channel)"])
            case .notHeld:
                break
            }
        }
        return moved
    }
}

/// The epochs of the channels a node holds, read by the store's fencing from any thread.
final class HeldEpochs: Sendable {
    private let epochs = Mutex<[UUID: Epoch]>([:])
    func epoch(of channel: UUID) -> Epoch? { epochs.withLock { $0[channel] } }
    func set(_ channel: UUID, _ epoch: Epoch?) { epochs.withLock { $0[channel] = epoch } }
}

/// The cluster's metrics, on the server's registry.
struct ClusterMetrics: Sendable {
    let placements: Counter
    let redirects: Counter
    let entries: Counter
    let renewals: Counter
    let renewalFailures: Counter
    let leasesLost: Counter
    let moves: Counter

    init(registry: PrometheusCollectorRegistry) {
        func counter(_ name: String, _ help: String) -> Counter {
            registry.makeCounter(descriptor: MetricNameDescriptor(namespace: "squelch", metricName: name, unitName: "total", helpText: help))
        }
        placements = counter("cluster_placements", "Channels this node took up as their home (a claim it won).")
        redirects = counter("cluster_redirects", "Joins this node sent to the channel's home on another node.")
        entries = counter("cluster_entry_passes", "Joins redirected here with an entry pass, answered with the handshake's flight.")
        renewals = counter("cluster_lease_renewals", "Channel leases this node renewed.")
        renewalFailures = counter("cluster_lease_renewal_failures", "Heartbeats (with their lease renewals) that failed: the database did not answer.")
        moves = counter("cluster_moves", "Channels this node handed over to another node while draining (their members told to move).")
        leasesLost = counter("cluster_leases_lost", "Channels this node stopped serving because their lease ran out or another node took them.")
    }
}
