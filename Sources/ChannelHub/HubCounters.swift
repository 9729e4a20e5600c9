/// Why the relay dropped an incoming audio datagram.
public enum DropReason: Int, CaseIterable, Sendable {
    /// Not an audio datagram of this protocol.
    case malformed
    /// The connection has not joined a channel.
    case notJoined
    /// The sender doesn't hold the floor.
    case notFloorHolder
    /// The sender holds the floor, but the packet belongs to an earlier burst.
    case staleBurst
    /// The transport couldn't send to a listener right now (the listener's connection is closing).
    case sendFailed
    /// The talker sent faster than any Opus sender may (`audioPacketsPerSecond`).
    case overRate
    /// This cluster node does not hold the channel's lease (now, or any longer).
    case notHome
    /// The frame is not sealed with a key of the sender's burst (or not an SFrame at all).
    case unknownKey

    public var label: String {
        switch self {
        case .malformed: return "malformed"
        case .notJoined: return "not_joined"
        case .notFloorHolder: return "not_floor_holder"
        case .staleBurst: return "stale_burst"
        case .sendFailed: return "send_failed"
        case .overRate: return "over_rate"
        case .notHome: return "not_home"
        case .unknownKey: return "unknown_key"
        }
    }
}

/// Plain counters the hub bumps on its event loop; the driver publishes them as metrics.
public struct HubCounters: Sendable, Equatable {
    public var packetsIn = 0
    public var bytesIn = 0
    public var packetsOut = 0
    public var bytesOut = 0
    public var catchUpPacketsOut = 0
    public var catchUpBytesOut = 0
    /// Indexed by `DropReason.rawValue`.
    public var drops = [Int](repeating: 0, count: DropReason.allCases.count)
    public var bursts = 0
    /// Media keys made: one per burst, and one per burst going on whenever a member stops hearing.
    public var mediaKeys = 0
    public var floorGrants = 0
    public var floorDenials = 0
    public var floorRevocations = 0
    public var joins = 0
    public var refusals = 0
    public var controlErrors = 0
    /// Control messages dropped because their connection sent more than its rate allows.
    public var controlRateLimited = 0
    /// Sessions ended because their participant token expired while connected.
    public var tokenExpiries = 0
    /// `renewToken` requests that gave a session a new token, and those refused.
    public var tokenRenewals = 0
    public var tokenRenewalsRefused = 0
    /// `receptionReport`s that changed a listener's loss figure.
    public var receptionReports = 0
    /// Joins sent to another node of the cluster (the channel's home).
    public var redirects = 0
    /// Channels dropped because this node's lease on them ran out or was lost.
    public var fenced = 0
    /// Connected members the liveness sweep marked `reconnecting` because their connection went silent.
    public var silentMembers = 0
    /// Bursts that had ended replayed to a member who missed them (one per member and burst).
    public var missedBurstReplays = 0
    /// Roster entries held back to keep to `rosterUpdateInterval` (each sent later, merged).
    public var rosterUpdatesHeld = 0
    /// Floor requests denied for `floorGrantsPerMinute`.
    public var floorRequestsLimited = 0
    /// Wakes not asked for because their member had used its `wakesPerMinute`.
    public var wakesLimited = 0

    public init() {}

    public func drops(_ reason: DropReason) -> Int { drops[reason.rawValue] }
}
