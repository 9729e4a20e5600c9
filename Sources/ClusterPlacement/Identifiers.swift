/// A squelchd node's id, as in the `nodes` table. It names the process for the cluster; a restarted
/// process may reuse its id (`PlacementPolicy.claim` gives it a new epoch when it takes a channel back).
public struct NodeID: Hashable, Comparable, Sendable, CustomStringConvertible, ExpressibleByStringLiteral {
    public var rawValue: String

    public init(_ rawValue: String) { self.rawValue = rawValue }
    public init(stringLiteral value: String) { rawValue = value }

    public static func < (lhs: Self, rhs: Self) -> Bool { lhs.rawValue < rhs.rawValue }

    public var description: String { rawValue }
}

/// A channel placement's fencing token. It only grows: every change of home (and every time a node
/// takes a channel afresh) gets the next one, and every write a home makes carries the epoch it holds,
/// so a home that lost the channel, even one that was paused and doesn't know it yet, cannot write.
/// Stored as a PostgreSQL `bigint`.
public struct Epoch: Hashable, Comparable, Sendable, CustomStringConvertible {
    public var rawValue: Int64

    public init(_ rawValue: Int64) { self.rawValue = rawValue }

    /// The epoch of a channel's first placement.
    public static let first = Epoch(1)

    public var next: Epoch { Epoch(rawValue + 1) }

    public static func < (lhs: Self, rhs: Self) -> Bool { lhs.rawValue < rhs.rawValue }

    public var description: String { "e\(rawValue)" }
}
