/// Why the model dropped a datagram.
public enum DropReason: String, Sendable, Hashable {
    /// Independent random loss (or good-state loss when burst loss is on).
    case loss
    /// Lost while the Gilbert-Elliott model was in its bad state.
    case burstLoss
    /// Arrived during a blackhole (outage).
    case blackhole
}

/// One copy of a datagram to put on the wire.
public struct Delivery: Sendable, Hashable {
    /// When to send it, in the same nanosecond clock as the `now` the model was given.
    public var deliverAt: UInt64
    /// True for the extra copy made by duplication.
    public var isDuplicate: Bool
    /// True when the copy was held back so later datagrams overtake it.
    public var isHeldBack: Bool

    /// Creates a delivery.
    public init(deliverAt: UInt64, isDuplicate: Bool = false, isHeldBack: Bool = false) {
        self.deliverAt = deliverAt
        self.isDuplicate = isDuplicate
        self.isHeldBack = isHeldBack
    }
}

/// What to do with one datagram.
public enum Decision: Sendable, Hashable {
    /// Do not forward it.
    case dropped(DropReason)
    /// Send each copy at its `deliverAt`; one copy, or two when duplicated, in delivery order.
    case deliver([Delivery])

    /// The copies to send, empty when dropped.
    public var deliveries: [Delivery] {
        if case .deliver(let copies) = self { return copies }
        return []
    }

    /// True when the datagram was dropped.
    public var isDropped: Bool {
        if case .dropped = self { return true }
        return false
    }
}

/// Counters for one direction. Every datagram offered is counted once in `received` and then in exactly one of
/// `forwarded` or `dropped`; `duplicated` and `reordered` count forwarded datagrams that were also impaired.
public struct ImpairmentCounters: Sendable, Hashable {
    /// Datagrams offered to the model.
    public var received: UInt64 = 0
    /// Datagrams sent on at least once.
    public var forwarded: UInt64 = 0
    /// Datagrams not sent at all (random loss, burst loss and blackhole together).
    public var dropped: UInt64 = 0
    /// Of `dropped`, those lost to a blackhole.
    public var blackholed: UInt64 = 0
    /// Extra copies made.
    public var duplicated: UInt64 = 0
    /// Datagrams held back so later ones overtake them.
    public var reordered: UInt64 = 0
    /// Bytes offered to the model.
    public var bytesReceived: UInt64 = 0
    /// Bytes put on the wire, copies included.
    public var bytesForwarded: UInt64 = 0

    /// Creates zeroed counters.
    public init() {}
}

/// Counters for both directions.
public struct ImpairmentStats: Sendable, Hashable {
    /// Client → server counters.
    public var clientToServer = ImpairmentCounters()
    /// Server → client counters.
    public var serverToClient = ImpairmentCounters()

    /// Creates zeroed stats.
    public init() {}

    /// The counters of one direction.
    public subscript(direction: Direction) -> ImpairmentCounters {
        get { direction == .clientToServer ? clientToServer : serverToClient }
        set {
            if direction == .clientToServer { clientToServer = newValue } else { serverToClient = newValue }
        }
    }
}

/// The impairment decisions, as a plain state machine: no clocks, no sockets, no threads.
///
/// The caller passes each datagram's size, direction and arrival time (any monotonic nanosecond clock) and gets
/// back when to deliver each copy, or that it is dropped. Each direction has its own generator, so what happens
/// on one direction never shifts the random stream of the other: replaying the same arrivals with the same
/// configuration replays the same decisions even if the other direction's traffic differs.
public struct ImpairmentModel: Sendable {
    private struct Lane: Sendable {
        var impairment: Impairment
        var generator: SeededGenerator
        var inBadState = false
        /// Latest in-order delivery time handed out, for `preservesOrder`.
        var lastInOrderDelivery: UInt64 = 0
        var counters = ImpairmentCounters()

        init(impairment: Impairment, direction: Direction) {
            self.impairment = impairment
            self.generator = SeededGenerator(seed: ImpairmentModel.streamSeed(impairment.seed, direction))
        }
    }

    private var clientToServer: Lane
    private var serverToClient: Lane
    /// Arrivals strictly before this time are blackholed.
    public private(set) var blackholeUntil: UInt64 = 0

    /// Creates a model with one impairment per direction.
    public init(clientToServer: Impairment = .none, serverToClient: Impairment = .none) {
        self.clientToServer = Lane(impairment: clientToServer, direction: .clientToServer)
        self.serverToClient = Lane(impairment: serverToClient, direction: .serverToClient)
    }

    /// The impairment currently applied to `direction`.
    public func impairment(for direction: Direction) -> Impairment {
        direction == .clientToServer ? clientToServer.impairment : serverToClient.impairment
    }

    /// Replaces the impairment of one direction.
    ///
    /// If the seed changes, that direction's generator restarts from the new seed; otherwise its stream carries
    /// on, so a test that toggles loss on and off mid-run stays reproducible from its single starting seed.
    /// Leaving burst loss resets the Gilbert-Elliott state to good.
    public mutating func setImpairment(_ impairment: Impairment, for direction: Direction) {
        withLane(direction) { lane in
            if lane.impairment.seed != impairment.seed {
                lane.generator = SeededGenerator(seed: Self.streamSeed(impairment.seed, direction))
            }
            if impairment.burstLoss == nil { lane.inBadState = false }
            lane.impairment = impairment
        }
    }

    /// Drops everything, in both directions, that arrives before `until` (an outage). A later call replaces the
    /// window; `blackhole(until: 0)` ends it at once. Datagrams already accepted are still delivered, as if the
    /// outage started once they were past the broken hop.
    public mutating func blackhole(until: UInt64) {
        blackholeUntil = until
    }

    /// True when a datagram arriving at `now` would be blackholed.
    public func isBlackholed(at now: UInt64) -> Bool {
        now < blackholeUntil
    }

    /// The counters of both directions.
    public var stats: ImpairmentStats {
        var stats = ImpairmentStats()
        stats.clientToServer = clientToServer.counters
        stats.serverToClient = serverToClient.counters
        return stats
    }

    /// Decides the fate of one datagram.
    /// - Parameters:
    ///   - byteCount: its size, for the byte counters only.
    ///   - direction: which way it travels.
    ///   - now: its arrival time in nanoseconds; must not go backwards within a direction for the
    ///     `preservesOrder` and delay bounds to hold.
    /// - Returns: `.dropped(reason)` or the copies to send, sorted by `deliverAt`.
    public mutating func process(byteCount: Int, direction: Direction, now: UInt64) -> Decision {
        let blackholed = isBlackholed(at: now)
        return withLane(direction) { lane in
            Self.decide(lane: &lane, byteCount: UInt64(max(byteCount, 0)), now: now, blackholed: blackholed)
        }
    }

    private static func decide(lane: inout Lane, byteCount: UInt64, now: UInt64, blackholed: Bool) -> Decision {
        lane.counters.received += 1
        lane.counters.bytesReceived += byteCount
        if blackholed {
            // No draw here: the stream after an outage continues as if the blackholed datagrams never existed.
            lane.counters.dropped += 1
            lane.counters.blackholed += 1
            return .dropped(.blackhole)
        }

        let impairment = lane.impairment
        if let reason = loss(lane: &lane, impairment: impairment) {
            lane.counters.dropped += 1
            return .dropped(reason)
        }

        let delay = nanoseconds(milliseconds: impairment.delayMilliseconds)
        var deliverAt = now &+ delay &+ jitter(&lane.generator, impairment)
        if impairment.preservesOrder {
            deliverAt = max(deliverAt, lane.lastInOrderDelivery)
            lane.lastInOrderDelivery = deliverAt
        }
        var primary = Delivery(deliverAt: deliverAt)
        // Held back after the in-order time is recorded, so the datagrams behind it are not held up too.
        if lane.generator.chance(percent(impairment.reorderPercent)) {
            primary.deliverAt &+= nanoseconds(milliseconds: impairment.reorderDelayMilliseconds)
            primary.isHeldBack = true
            lane.counters.reordered += 1
        }
        var copies = [primary]
        if lane.generator.chance(percent(impairment.duplicatePercent)) {
            let copyAt = now &+ delay &+ jitter(&lane.generator, impairment)
            copies.append(Delivery(deliverAt: copyAt, isDuplicate: true))
            if copyAt < primary.deliverAt { copies.swapAt(0, 1) }
            lane.counters.duplicated += 1
        }
        lane.counters.forwarded += 1
        lane.counters.bytesForwarded += byteCount * UInt64(copies.count)
        return .deliver(copies)
    }

    private static func loss(lane: inout Lane, impairment: Impairment) -> DropReason? {
        guard let burst = impairment.burstLoss else {
            return lane.generator.chance(percent(impairment.lossPercent)) ? .loss : nil
        }
        // The state moves before the loss draw, so the first datagram of a burst is already in the bad state.
        let move = lane.generator.nextUnit()
        lane.inBadState = lane.inBadState ? move < burst.stayProbability : move < burst.enterProbability
        if lane.inBadState {
            return lane.generator.chance(burst.lossProbabilityInBadState) ? .burstLoss : nil
        }
        return lane.generator.chance(percent(impairment.lossPercent)) ? .loss : nil
    }

    private static func jitter(_ generator: inout SeededGenerator, _ impairment: Impairment) -> UInt64 {
        let window = max(impairment.jitterMilliseconds, 0)
        guard window > 0 else { return 0 }
        let fraction: Double
        switch impairment.jitterDistribution {
        case .uniform:
            fraction = generator.nextUnit()
        case .normal:
            fraction = min(max(0.5 + generator.nextStandardNormal() / 6, 0), 1)
        }
        return nanoseconds(milliseconds: window * fraction)
    }

    private static func percent(_ value: Double) -> Double {
        value.isNaN ? 0 : min(max(value, 0), 100) / 100
    }

    private static func nanoseconds(milliseconds: Double) -> UInt64 {
        guard milliseconds.isFinite, milliseconds > 0 else { return 0 }
        // Caps at about 292 years of delay so the conversion can never trap.
        return UInt64(min(milliseconds * 1_000_000, 9.2e18))
    }

    /// The server→client stream is salted so that the same seed on both directions (the usual CLI case) still
    /// gives two independent streams; with identical streams a lost request would predict a lost reply.
    static func streamSeed(_ seed: UInt64, _ direction: Direction) -> UInt64 {
        direction == .clientToServer ? seed : seed ^ 0xD1B5_4A32_D192_ED03
    }

    private mutating func withLane<T>(_ direction: Direction, _ body: (inout Lane) -> T) -> T {
        direction == .clientToServer ? body(&clientToServer) : body(&serverToClient)
    }
}
