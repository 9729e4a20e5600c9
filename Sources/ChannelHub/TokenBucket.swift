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
        available(at: now, rate: Double(perMinute) / 60, burst: burst) >= 1
    }

    /// Nanoseconds until a token is there at `perMinute` (0: one is).
    func wait(at now: WireInstant, perMinute: Int, burst: Int) -> UInt64 {
        let rate = Double(perMinute) / 60
        let tokens = available(at: now, rate: rate, burst: burst)
        guard tokens < 1, rate > 0 else { return 0 }
        return UInt64((1 - tokens) / rate * 1e9)
    }

    /// The tokens there would be at `now`, refilled at `rate` a second up to `burst`.
    private func available(at now: WireInstant, rate: Double, burst: Int) -> Double {
        min(Double(burst), tokens + Double(now.since(refilledAt)) / 1e9 * rate)
    }

    private mutating func take(at now: WireInstant, rate: Double, burst: Int) -> Bool {
        tokens = available(at: now, rate: rate, burst: burst)
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
