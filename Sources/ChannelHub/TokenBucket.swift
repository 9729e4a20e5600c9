import Wire

/// A token bucket on the hub's clock: a connection's control messages, a talker's audio packets.
struct TokenBucket {
    var tokens: Double
    var refilledAt: WireInstant
    /// When the connection was last told it is over its rate.
    var noticedAt: WireInstant?

    /// Takes one token; false when there is none left.
    mutating func take(at now: WireInstant, perSecond: Int, burst: Int) -> Bool {
        let elapsed = Double(now.since(refilledAt)) / 1e9
        tokens = min(Double(burst), tokens + elapsed * Double(perSecond))
        refilledAt = now
        guard tokens >= 1 else { return false }
        tokens -= 1
        return true
    }

    /// True at most once a second.
    mutating func noticeDue(at now: WireInstant) -> Bool {
        if let noticedAt, now.since(noticedAt) < 1_000_000_000 { return false }
        noticedAt = now
        return true
    }
}
