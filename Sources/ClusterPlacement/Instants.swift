/// A reading of the database's clock: PostgreSQL's `now()` in the transaction that made a decision,
/// as microseconds since the Unix epoch (PostgreSQL's own resolution, so nothing is rounded away).
///
/// Leases and heartbeats are compared with this clock only. Node clocks are never compared with it or
/// with each other; that is what `LocalInstant` is for, and the two types don't mix.
public struct DatabaseInstant: Hashable, Comparable, Sendable, CustomStringConvertible {
    public var microseconds: Int64

    public init(microseconds: Int64) { self.microseconds = microseconds }

    public static func < (lhs: Self, rhs: Self) -> Bool { lhs.microseconds < rhs.microseconds }

    public static func + (lhs: Self, rhs: Duration) -> Self {
        Self(microseconds: lhs.microseconds &+ rhs.wholeMicroseconds)
    }

    public static func - (lhs: Self, rhs: Duration) -> Self {
        Self(microseconds: lhs.microseconds &- rhs.wholeMicroseconds)
    }

    public static func - (lhs: Self, rhs: Self) -> Duration {
        .microseconds(lhs.microseconds &- rhs.microseconds)
    }

    public var description: String { "db@\(microseconds)µs" }
}

/// A reading of this node's own monotonic clock, nanoseconds from an arbitrary origin.
///
/// It must keep running while the process is stopped (SIGSTOP, a long GC-like stall) and while the
/// machine is suspended, because `LeaseKeeper.isServing` relies on it to notice that time passed:
/// use `ContinuousClock` (CLOCK_BOOTTIME on Linux), not `SuspendingClock` (CLOCK_MONOTONIC, which
/// stops during suspend). Never a wall clock: those jump.
public struct LocalInstant: Hashable, Comparable, Sendable, CustomStringConvertible {
    public var nanoseconds: Int64

    public init(nanoseconds: Int64) { self.nanoseconds = nanoseconds }

    public static func < (lhs: Self, rhs: Self) -> Bool { lhs.nanoseconds < rhs.nanoseconds }

    public static func + (lhs: Self, rhs: Duration) -> Self {
        Self(nanoseconds: lhs.nanoseconds &+ rhs.wholeNanoseconds)
    }

    public static func - (lhs: Self, rhs: Duration) -> Self {
        Self(nanoseconds: lhs.nanoseconds &- rhs.wholeNanoseconds)
    }

    public static func - (lhs: Self, rhs: Self) -> Duration {
        .nanoseconds(lhs.nanoseconds &- rhs.nanoseconds)
    }

    public var description: String { "local@\(nanoseconds)ns" }
}

extension Duration {
    /// Truncated toward zero: a lease a fraction of a microsecond short is harmless (the node's
    /// safety margin is far larger).
    var wholeMicroseconds: Int64 {
        let (seconds, attoseconds) = components
        return seconds &* 1_000_000 &+ attoseconds / 1_000_000_000_000
    }

    var wholeNanoseconds: Int64 {
        let (seconds, attoseconds) = components
        return seconds &* 1_000_000_000 &+ attoseconds / 1_000_000_000
    }
}
