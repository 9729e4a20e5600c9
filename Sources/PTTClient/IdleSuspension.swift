/// When an idle app closes its voice connection, as iOS suspends a PTT app in the background: after
/// `after` nanoseconds with nothing going on (nobody talking to it, no press, a joined session), if a
/// push could wake it. A suspended session counts as activity, so after a push wakes it the clock
/// starts again: the woken burst plays, and `after` of quiet later it goes back to sleep. A fleet of
/// idle devices then costs the server nothing but their push tokens.
///
/// Plain values in, a decision out; the app calls `tick` as often as it likes and `suspend()`s the
/// manager when it answers true.
public struct IdleSuspension: Sendable {
    public let after: UInt64
    private var activeAt: UInt64

    public init(after nanoseconds: UInt64, now: UInt64) {
        after = nanoseconds
        activeAt = now
    }

    /// - Parameters:
    ///   - busy: transmitting, receiving, a press waiting, or the session not joined (reconnecting).
    ///   - suspended: the voice connection is closed already.
    ///   - wakeable: a push could wake the app (`ChannelManager.canBeWokenByPush`); never sleep without.
    /// - Returns: true when the app should suspend now.
    public mutating func tick(now: UInt64, busy: Bool, suspended: Bool, wakeable: Bool) -> Bool {
        if busy || suspended {
            activeAt = now
            return false
        }
        guard wakeable, now &- activeAt >= after else { return false }
        activeAt = now
        return true
    }
}
