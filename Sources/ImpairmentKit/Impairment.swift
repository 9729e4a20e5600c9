/// Which way a datagram travels through the proxy.
public enum Direction: String, Sendable, Hashable, CaseIterable, CustomStringConvertible {
    /// From a client to the upstream server ("up").
    case clientToServer
    /// From the upstream server back to a client ("down").
    case serverToClient

    public var description: String {
        switch self {
        case .clientToServer: return "client→server"
        case .serverToClient: return "server→client"
        }
    }
}

/// The Gilbert-Elliott two-state loss model: the link flips between a good and a bad state once per datagram.
///
/// In the good state datagrams are lost with ``Impairment/lossPercent``; in the bad state with
/// ``lossProbabilityInBadState`` (1 by default, the classic Gilbert model). Bursts of consecutive losses therefore
/// last `1 / (1 - stayProbability)` datagrams on average, which is what stresses FEC and PLC far more than the
/// same average loss spread out independently.
public struct BurstLoss: Sendable, Hashable {
    /// Probability, per datagram, of moving from the good to the bad state (0...1).
    public var enterProbability: Double
    /// Probability, per datagram, of staying in the bad state once there (0...1).
    public var stayProbability: Double
    /// Probability of losing a datagram while in the bad state (0...1).
    public var lossProbabilityInBadState: Double

    /// Creates a burst-loss configuration.
    /// - Parameters:
    ///   - enterProbability: per-datagram probability of good → bad.
    ///   - stayProbability: per-datagram probability of bad → bad.
    ///   - lossProbabilityInBadState: loss probability in the bad state (1 = every datagram in a burst is lost).
    public init(enterProbability: Double, stayProbability: Double, lossProbabilityInBadState: Double = 1) {
        self.enterProbability = enterProbability
        self.stayProbability = stayProbability
        self.lossProbabilityInBadState = lossProbabilityInBadState
    }

    /// Mean number of consecutive datagrams spent in the bad state, `1 / (1 - stay)`.
    public var meanBurstLength: Double {
        let leave = 1 - min(max(stayProbability, 0), 1)
        return leave > 0 ? 1 / leave : .infinity
    }

    /// Long-run fraction of datagrams that see the bad state, `enter / (enter + 1 - stay)`.
    public var badStateFraction: Double {
        let enter = min(max(enterProbability, 0), 1)
        let leave = 1 - min(max(stayProbability, 0), 1)
        return enter + leave > 0 ? enter / (enter + leave) : 0
    }
}

/// How the jitter component of the delay is drawn.
///
/// Both shapes stay inside the same window `[delay, delay + jitter]`: real queueing only ever adds delay, so the
/// configured delay is a floor that tests can assert on, and the window's top is a hard ceiling.
public enum JitterDistribution: String, Sendable, Hashable, CaseIterable {
    /// Flat over `[0, jitter]` (mean `jitter / 2`).
    case uniform
    /// A bell centred on `jitter / 2` with σ = `jitter / 6`, clamped to `[0, jitter]` (±3σ fills the window, so
    /// about 0.3 % of draws are clamped). Drawn as a sum of 12 uniforms (Irwin–Hall) rather than Box–Muller so
    /// that the decisions use no libm call and stay bit-identical on every platform for a given seed.
    case normal
}

/// The impairment applied to one direction of traffic.
///
/// Out-of-range values are clamped when used (percentages to 0...100, durations to ≥ 0), so a configuration is
/// never rejected. Every random choice comes from a generator seeded with ``seed``, so a given configuration and
/// sequence of inputs always yields the same decisions.
public struct Impairment: Sendable, Hashable {
    /// Independent (Bernoulli) loss, in percent. With ``burstLoss`` set, it is the loss in the good state.
    public var lossPercent: Double
    /// Optional Gilbert-Elliott burst loss on top of (or instead of) independent loss.
    public var burstLoss: BurstLoss?
    /// Fixed one-way delay in milliseconds: the floor every datagram waits.
    public var delayMilliseconds: Double
    /// Width of the random extra delay window in milliseconds (see ``JitterDistribution``).
    public var jitterMilliseconds: Double
    /// Shape of the jitter within its window.
    public var jitterDistribution: JitterDistribution
    /// Percentage of datagrams held back by ``reorderDelayMilliseconds`` so later ones overtake them.
    public var reorderPercent: Double
    /// Extra hold-back applied to a reordered datagram. It must exceed the gap between datagrams for an
    /// overtake to happen; the default of 40 ms is two 20 ms voice frames.
    public var reorderDelayMilliseconds: Double
    /// Percentage of datagrams delivered twice. The copy gets its own jitter draw, so it may land before or after
    /// the original, as a duplicate from a real path would.
    public var duplicatePercent: Double
    /// When true (the default) jitter never reorders: a datagram is not delivered before the one that entered
    /// the same direction ahead of it, as through a real FIFO queue. Reordering then comes only from
    /// ``reorderPercent``, so a test controls exactly how much of it there is. When false, each datagram's
    /// jitter is independent (like netem), so large jitter also reorders.
    public var preservesOrder: Bool
    /// Seed for this direction's generator.
    public var seed: UInt64

    /// Creates an impairment; every parameter defaults to "no impairment".
    public init(
        lossPercent: Double = 0,
        burstLoss: BurstLoss? = nil,
        delayMilliseconds: Double = 0,
        jitterMilliseconds: Double = 0,
        jitterDistribution: JitterDistribution = .uniform,
        reorderPercent: Double = 0,
        reorderDelayMilliseconds: Double = 40,
        duplicatePercent: Double = 0,
        preservesOrder: Bool = true,
        seed: UInt64 = 0
    ) {
        self.lossPercent = lossPercent
        self.burstLoss = burstLoss
        self.delayMilliseconds = delayMilliseconds
        self.jitterMilliseconds = jitterMilliseconds
        self.jitterDistribution = jitterDistribution
        self.reorderPercent = reorderPercent
        self.reorderDelayMilliseconds = reorderDelayMilliseconds
        self.duplicatePercent = duplicatePercent
        self.preservesOrder = preservesOrder
        self.seed = seed
    }

    /// A transparent link: no loss, no delay, no reordering, no duplication.
    public static let none = Impairment()

    /// True when this configuration leaves traffic untouched (the seed is irrelevant then).
    public var isTransparent: Bool {
        var copy = self
        copy.seed = 0
        return copy == .none
    }
}

extension Impairment: CustomStringConvertible {
    public var description: String {
        var parts = ["loss \(Self.format(lossPercent))%"]
        if let burst = burstLoss {
            parts.append(
                "burst enter \(Self.format(burst.enterProbability)) stay \(Self.format(burst.stayProbability))"
                    + " bad-loss \(Self.format(burst.lossProbabilityInBadState))"
            )
        }
        parts.append("delay \(Self.format(delayMilliseconds))ms")
        parts.append("jitter \(Self.format(jitterMilliseconds))ms \(jitterDistribution.rawValue)")
        parts.append("reorder \(Self.format(reorderPercent))% +\(Self.format(reorderDelayMilliseconds))ms")
        parts.append("duplicate \(Self.format(duplicatePercent))%")
        if !preservesOrder { parts.append("unordered") }
        parts.append("seed \(seed)")
        return parts.joined(separator: ", ")
    }

    private static func format(_ value: Double) -> String {
        value == value.rounded() && abs(value) < 1e15 ? String(Int64(value)) : String(value)
    }
}
