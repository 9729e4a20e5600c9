/// One node's view of the channels it is home to, by its own monotonic clock: the check made before
/// every floor grant and every relayed packet (`isServing`), when to renew, and when to stop. Sans-I/O:
/// the adapter feeds it the outcomes of its transactions and the time; one instance per node process.
///
/// Why the node stops before anyone else may start, whatever the offset between clocks:
/// the node reads its clock at `requestSentAt` before it begins a transaction that wins or renews a
/// lease. The database's `now()` in that transaction is no earlier than that moment (the transaction
/// started after the request was sent), and it writes expiry = `now()` + lease. The node believes the
/// lease until `requestSentAt` + lease × (1 − maxDriftFraction) − safetyMargin on its own clock. If
/// its clock's rate is within `maxDriftFraction` of the database's, that instant comes strictly before
/// the expiry, and no other node can take the channel before the expiry (`PlacementPolicy.claim`), nor
/// start serving before its own transaction commits. Only elapsed time on one clock is ever used, so
/// offsets don't matter; only rates do (real clocks differ by parts per million, far below 1 %).
/// A paused process (SIGSTOP, a stall) is covered because `isServing` compares with the current time
/// whenever it is asked: a node that resumes past its validity finds it over before acting, and a
/// reply that reaches it late still counts from when the request was sent. The epoch covers the rest:
/// writes that were in flight carry it and fail once the channel moved.
public struct LeaseKeeper<Channel: Hashable & Sendable>: Sendable {
    public struct Settings: Sendable, Equatable {
        /// The database's lease (`PlacementPolicy.lease`); must be the same.
        public var lease: Duration
        /// How often to renew (default 1 s): several chances per lease.
        public var renewInterval: Duration
        /// The largest difference in rate between this node's clock and the database's, as a
        /// fraction (default 1 %).
        public var maxDriftFraction: Double
        /// Subtracted on top (default 100 ms), for rounding and the time between reading the clock
        /// and the first byte leaving.
        public var safetyMargin: Duration

        public init(lease: Duration = .seconds(5), renewInterval: Duration = .seconds(1),
                    maxDriftFraction: Double = 0.01, safetyMargin: Duration = .milliseconds(100)) {
            precondition((0..<1).contains(maxDriftFraction), "drift fraction out of range")
            self.lease = lease
            self.renewInterval = renewInterval
            self.maxDriftFraction = maxDriftFraction
            self.safetyMargin = safetyMargin
            precondition(validity > .zero, "the safety margin eats the whole lease")
            precondition(renewInterval > .zero && renewInterval < validity, "renewals must come within the validity")
        }

        /// How long after sending a request that won or renewed a lease the node may believe it:
        /// lease × (1 − maxDriftFraction) − safetyMargin, rounded down to the nanosecond.
        public var validity: Duration {
            let shrunk = (Double(lease.wholeNanoseconds) * (1 - maxDriftFraction)).rounded(.down)
            return .nanoseconds(Int64(shrunk)) - safetyMargin
        }
    }

    /// What `tick` reports.
    public enum Event: Hashable, Sendable {
        /// The channel's validity ran out without a renewal: stop granting the floor and relaying,
        /// tell its clients "connecting". The keeper has forgotten it; a later join claims it afresh.
        case fenced(Channel, epoch: Epoch)
    }

    public struct Holding: Hashable, Sendable {
        public var channel: Channel
        public var epoch: Epoch
        /// The first local instant at which the node no longer believes the lease.
        public var validUntil: LocalInstant
    }

    public let settings: Settings
    /// Kept in an array (with an index) so renewals and events come out in a stable order, which
    /// makes seeded simulations repeat exactly.
    private var holdings: [Holding] = []
    private var index: [Channel: Int] = [:]
    private var renewalDue: LocalInstant?

    public init(settings: Settings = Settings()) { self.settings = settings }

    /// The channels held (serving or not yet ticked out), in a stable order.
    public var held: [Holding] { holdings }

    public func holding(_ channel: Channel) -> Holding? { index[channel].map { holdings[$0] } }

    /// THE check before every floor grant and relayed packet. With an epoch, also that the node holds
    /// the channel under that one (a member admitted under an older epoch belongs to a past term).
    public func isServing(_ channel: Channel, epoch: Epoch? = nil, now: LocalInstant) -> Bool {
        guard let holding = holding(channel) else { return false }
        return now < holding.validUntil && (epoch == nil || epoch == holding.epoch)
    }

    /// The node won `channel` under `epoch` (a claim or a handover that gave it back) in a
    /// transaction it began at `requestSentAt`. A newer epoch replaces an older one; a reply for an
    /// older epoch than the one held is stale and ignored (returns false).
    @discardableResult
    public mutating func acquired(_ channel: Channel, epoch: Epoch, requestSentAt: LocalInstant) -> Bool {
        let validUntil = requestSentAt + settings.validity
        if let i = index[channel] {
            if epoch < holdings[i].epoch { return false }
            if epoch == holdings[i].epoch {
                holdings[i].validUntil = max(holdings[i].validUntil, validUntil)
            } else {
                holdings[i] = Holding(channel: channel, epoch: epoch, validUntil: validUntil)
            }
        } else {
            index[channel] = holdings.count
            holdings.append(Holding(channel: channel, epoch: epoch, validUntil: validUntil))
        }
        let due = requestSentAt + settings.renewInterval
        renewalDue = renewalDue.map { min($0, due) } ?? due
        return true
    }

    /// When the next renewal round is due (nil: nothing held).
    public func nextRenewal() -> LocalInstant? { holdings.isEmpty ? nil : renewalDue }

    /// Starts a renewal round: returns what to renew (send it with `now` as the request time) and
    /// schedules the next round. Rounds may overlap; each success counts from its own send time.
    public mutating func startRenewal(now: LocalInstant) -> [HeldLease<Channel>] {
        renewalDue = now + settings.renewInterval
        return holdings.map { HeldLease(channel: $0.channel, epoch: $0.epoch) }
    }

    /// The database renewed these leases in a transaction begun at `requestSentAt`. Leases no longer
    /// held, or held under another epoch, are ignored. A renewal that arrives after the validity ran
    /// out but before `tick` noticed still counts: the database renewed before the expiry, so nobody
    /// could have taken the channel in between.
    public mutating func renewalSucceeded(_ leases: [HeldLease<Channel>], requestSentAt: LocalInstant) {
        let validUntil = requestSentAt + settings.validity
        for lease in leases {
            guard let i = index[lease.channel], holdings[i].epoch == lease.epoch else { continue }
            holdings[i].validUntil = max(holdings[i].validUntil, validUntil)
        }
    }

    // A failed or unanswered renewal needs no input: the validity runs out by itself, and `tick`
    // reports it.

    /// The database says the lease is gone (another epoch, or expired). Returns whether it was held.
    @discardableResult
    public mutating func lost(_ channel: Channel, epoch: Epoch) -> Bool {
        guard let holding = holding(channel), holding.epoch == epoch else { return false }
        remove(channel)
        return true
    }

    /// Stops serving `channel` now (emptied, or about to be handed over); returns the epoch to give up
    /// in the database (`PlacementPolicy.release` or `handOver`), nil if it wasn't held.
    public mutating func release(_ channel: Channel) -> Epoch? {
        guard let holding = holding(channel) else { return nil }
        remove(channel)
        return holding.epoch
    }

    /// Forgets every channel whose validity ran out by `now` and reports each.
    public mutating func tick(now: LocalInstant) -> [Event] {
        var events: [Event] = []
        var i = 0
        while i < holdings.count {
            let holding = holdings[i]
            if now >= holding.validUntil {
                events.append(.fenced(holding.channel, epoch: holding.epoch))
                remove(holding.channel)  // swaps the last holding into slot i
            } else {
                i += 1
            }
        }
        return events
    }

    /// When `tick` (or a renewal) next has something to do (nil: nothing held).
    public func nextDeadline() -> LocalInstant? {
        guard let firstExpiry = holdings.lazy.map(\.validUntil).min() else { return nil }
        return renewalDue.map { min($0, firstExpiry) } ?? firstExpiry
    }

    private mutating func remove(_ channel: Channel) {
        guard let i = index.removeValue(forKey: channel) else { return }
        let last = holdings.removeLast()
        if i < holdings.count {
            holdings[i] = last
            index[last.channel] = i
        }
    }
}
