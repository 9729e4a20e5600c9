/// The delays of the client's retry loops (reconnecting to a channel, delivering a leave squelchd
/// has not heard yet): one formula, so that both back off and spread out the same way.
enum Backoff {
    /// `first` milliseconds, doubled for each failure before this one (`failures` ≥ 0), at most
    /// `ceiling`. The shift stops at 6 doublings, before it could overflow.
    static func milliseconds(first: Int, failuresBefore failures: Int, ceiling: Int) -> Int {
        min(ceiling, first << min(max(failures, 0), 6))
    }

    /// Between half and all of `milliseconds`, at random: after a server restart or an outage,
    /// every client of a channel would otherwise knock at the same moments.
    static func jittered(_ milliseconds: Int) -> Int {
        milliseconds / 2 + Int.random(in: 0 ... max(0, milliseconds - milliseconds / 2))
    }
}
