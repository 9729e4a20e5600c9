import Wire

/// A member of one live channel, by its slot: what the hub's per-member timer lists hold.
struct MemberRef {
    let channel: ChannelState
    let slot: UInt16

    func `is`(_ channel: ChannelState, _ slot: UInt16) -> Bool { self.channel === channel && self.slot == slot }
}

/// Members being replayed bursts (late joiners, members back from a drop), in the order they began,
/// and when their next catch-up packets go out (nil: nobody is being replayed).
struct CatchUpSchedule: RandomAccessCollection {
    private var members: [MemberRef] = []
    private(set) var nextTick: WireInstant?

    var startIndex: Int { members.startIndex }
    var endIndex: Int { members.endIndex }
    subscript(position: Int) -> MemberRef { members[position] }

    /// Schedules `slot`'s replay, its first packets at once (at `now`). A member that rejoined on a
    /// new connection mid-replay is still listed: once is enough, or it would be served twice per
    /// tick and given every new burst twice.
    mutating func add(_ channel: ChannelState, slot: UInt16, now: WireInstant) {
        if !members.contains(where: { $0.is(channel, slot) }) { members.append(MemberRef(channel: channel, slot: slot)) }
        nextTick = now
    }

    mutating func remove(at index: Int) { members.remove(at: index) }

    mutating func removeAll(in channel: ChannelState) { members.removeAll { $0.channel === channel } }

    /// A tick is over: the next comes `interval` after `now`, if anyone is still being replayed.
    mutating func ticked(at now: WireInstant, interval: UInt64) {
        nextTick = members.isEmpty ? nil : now + interval
    }
}
