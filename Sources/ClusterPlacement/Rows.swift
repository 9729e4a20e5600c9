/// Whether a node takes new channels. A draining node keeps serving what it holds until it hands each
/// channel over, but is never chosen as a new home.
public enum NodeState: String, Hashable, Sendable {
    case serving
    case draining
}

/// A row of the `nodes` table, as read inside the deciding transaction.
public struct NodeRow: Hashable, Sendable {
    public var id: NodeID
    /// Where clients reach the node's voice endpoint ("host:port"); redirects point here.
    public var voiceAddress: String
    public var state: NodeState
    /// What the node reported at its last heartbeat (connected members, say); lower is preferred.
    public var load: Int
    /// The database's `now()` at the node's last heartbeat.
    public var heartbeat: DatabaseInstant

    public init(id: NodeID, voiceAddress: String, state: NodeState = .serving, load: Int = 0, heartbeat: DatabaseInstant) {
        self.id = id
        self.voiceAddress = voiceAddress
        self.state = state
        self.load = load
        self.heartbeat = heartbeat
    }
}

/// A channel's placement row: which node is its home, under which epoch, until when.
///
/// Rows are never deleted (a channel that empties is released, which only ends its lease): deleting
/// one would restart its epoch at 1, and an old home still holding epoch 1 could write again.
public struct PlacementRow<Channel: Hashable & Sendable>: Hashable, Sendable, CustomStringConvertible {
    public var channel: Channel
    public var home: NodeID
    public var epoch: Epoch
    /// The database time from which another node may take the channel.
    public var leaseExpiry: DatabaseInstant

    public init(channel: Channel, home: NodeID, epoch: Epoch, leaseExpiry: DatabaseInstant) {
        self.channel = channel
        self.home = home
        self.epoch = epoch
        self.leaseExpiry = leaseExpiry
    }

    /// A lease is over at its expiry instant exactly, so "expired" and "may be taken" are one test.
    public func isExpired(at dbNow: DatabaseInstant) -> Bool { dbNow >= leaseExpiry }

    public var description: String { "\(channel) at \(home) \(epoch) until \(leaseExpiry)" }
}

/// A channel a node believes it holds, and the epoch it holds it under.
public struct HeldLease<Channel: Hashable & Sendable>: Hashable, Sendable, CustomStringConvertible {
    public var channel: Channel
    public var epoch: Epoch

    public init(channel: Channel, epoch: Epoch) {
        self.channel = channel
        self.epoch = epoch
    }

    public var description: String { "\(channel) \(epoch)" }
}
