import Wire

/// A token bucket on the hub's clock: a connection's control messages, a talker's audio packets, a
/// member's floor grants and wakes.
struct TokenBucket {
    var tokens: Double
    var refilledAt: WireInstant
    /// When the connection was last told it is over its rate.
    var noticedAt: WireInstant?

    /// A full bucket.
    init(full burst: Int, at now: WireInstant) {
        tokens = Double(burst)
        refilledAt = now
    }

    init(tokens: Double, refilledAt: WireInstant) {
        self.tokens = tokens
        self.refilledAt = refilledAt
    }

    /// Takes one token; false when there is none left.
    mutating func take(at now: WireInstant, perSecond: Int, burst: Int) -> Bool {
        take(at: now, rate: Double(perSecond), burst: burst)
    }

    /// Takes one token at `perMinute`; false when there is none left.
    mutating func take(at now: WireInstant, perMinute: Int, burst: Int) -> Bool {
        take(at: now, rate: Double(perMinute) / 60, burst: burst)
    }

    /// Whether a token is there now, without taking it.
    func hasToken(at now: WireInstant, perMinute: Int, burst: Int) -> Bool {
        var copy = self
        return copy.take(at: now, perMinute: perMinute, burst: burst)
    }

    /// Nanoseconds until a token is there at `perMinute` (0: one is).
    func wait(at now: WireInstant, perMinute: Int, burst: Int) -> UInt64 {
        let rate = Double(perMinute) / 60
        let tokens = min(Double(burst), self.tokens + Double(now.since(refilledAt)) / 1e9 * rate)
        guard tokens < 1, rate > 0 else { return 0 }
        return UInt64((1 - tokens) / rate * 1e9)
    }

    private mutating func take(at now: WireInstant, rate: Double, burst: Int) -> Bool {
        let elapsed = Double(now.since(refilledAt)) / 1e9
        tokens = min(Double(burst), tokens + elapsed * rate)
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
