import ChannelProtocol
import Wire

// Roster entries to everyone, at most one per member per `HubConfiguration.rosterUpdateInterval`.
// Every change to a member (mute, talking, connection, rights) goes to every member of its channel;
// a member toggling mute at the control rate would make that the channel's size in messages twenty
// times a second. The first change goes at once; later ones within the interval wait for its end and
// go as one entry, the member as it is then. The member itself is told every change at once: its
// client may act on its own entry (walkie confirms a release by seeing itself stop talking, which a
// merged entry would hide), and that costs one message, not the channel's size.
extension ChannelHub {
    /// Tells `links` (everyone connected, unless given) the member in `slot` as it is now, or, within
    /// the interval since its last entry, holds the change and tells everyone at the interval's end.
    func announce(_ channel: ChannelState, slot: UInt16, to links: [Link]? = nil, at now: WireInstant) {
        guard var member = channel.members[slot] else { return }
        let interval = configuration.rosterUpdateInterval
        if interval > 0, let last = member.announcedAt, now.since(last) < interval {
            if let own = member.link, links?.contains(own) ?? true { outputs.append(.send(.participant(member.participant), to: [own])) }
            if !member.announcePending {
                channel.members[slot]?.announcePending = true
                heldAnnouncements.append(MemberRef(channel: channel, slot: slot))
                let due = last + interval
                nextHeldAnnouncement = nextHeldAnnouncement.map { min($0, due) } ?? due
                counters.rosterUpdatesHeld += 1
            }
            return
        }
        member.announcedAt = now
        member.announcePending = false
        channel.members[slot] = member
        outputs.append(.send(.participant(member.participant), to: links ?? channel.connectedLinks))
    }

    /// Sends the held entries that are due, each as its member is now, and notes when the next is.
    func sendHeldAnnouncements(at time: HubTime) {
        let interval = configuration.rosterUpdateInterval
        var next: WireInstant?
        var due: [MemberRef] = []
        heldAnnouncements.removeAll { held in
            // Left, or its slot taken by another member meanwhile: nothing to send.
            guard let member = held.channel.members[held.slot], member.announcePending, let last = member.announcedAt else { return true }
            guard last + interval <= time.instant else {
                next = next.map { min($0, last + interval) } ?? last + interval
                return false
            }
            due.append(held)
            return true
        }
        nextHeldAnnouncement = next
        // Not to the member itself, which was told each change as it came.
        for held in due where held.channel.members[held.slot]?.announcePending == true {
            announce(held.channel, slot: held.slot, to: held.channel.links(except: held.slot), at: time.instant)
        }
    }
}
