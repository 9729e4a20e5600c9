import Wire

/// When each connected member's token expires, and when it is to be told so. An entry goes stale
/// once its member leaves, closes or joins again with another token; the hub drops those it knows
/// of, and `takeDue` drops the rest as it meets them.
struct TokenExpiryQueue {
    struct Deadline {
        var channel: ChannelState
        var slot: UInt16
        var tokenID: String
        var at: WireInstant
        /// When to send `tokenExpiring`; nil once sent (or if it went with the join).
        var notice: WireInstant?
        var next: WireInstant { notice ?? at }
    }

    enum Due {
        /// The token expired: the session ends.
        case expired
        /// The member is to be told its token expires soon.
        case notice
    }

    private var entries: [Deadline] = []
    /// No later than the earliest entry's next time: after a drop it may be early, which costs only
    /// a wake-up that finds nothing due.
    private(set) var next: WireInstant?

    mutating func schedule(_ deadline: Deadline) {
        entries.removeAll { $0.channel === deadline.channel && $0.slot == deadline.slot }
        entries.append(deadline)
        next = next.map { min($0, deadline.next) } ?? deadline.next
    }

    /// Forgets the entries of sessions that ended (closed, left, removed, channel deleted), so the
    /// queue holds only live sessions and no deleted channel's state.
    mutating func drop(where ended: (Deadline) -> Bool) {
        entries.removeAll(where: ended)
        if entries.isEmpty { next = nil }
    }

    /// Takes what is due at `now`, in queue order; an entry `isLive` rejects is dropped unread. An
    /// expired entry leaves the queue; a notice stays, for its expiry.
    mutating func takeDue(at now: WireInstant, isLive: (Deadline) -> Bool) -> [(Deadline, Due)] {
        var due: [(Deadline, Due)] = []
        var earliest: WireInstant?
        var index = 0
        while index < entries.count {
            let entry = entries[index]
            guard isLive(entry) else {
                entries.remove(at: index)
                continue
            }
            if entry.at <= now {
                entries.remove(at: index)
                due.append((entry, .expired))
                continue
            }
            if let notice = entry.notice, notice <= now {
                entries[index].notice = nil
                due.append((entry, .notice))
            }
            earliest = earliest.map { min($0, entries[index].next) } ?? entries[index].next
            index += 1
        }
        next = earliest
        return due
    }
}
