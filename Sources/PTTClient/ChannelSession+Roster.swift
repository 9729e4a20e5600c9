import ChannelProtocol

/// The roster as the app sees it, and the subscriptions its strategy decides (who this member hears).
extension ChannelSession {
    /// The app's strategy decided for these users (by id); sends the server the new list if it changed.
    mutating func applySubscriptions(_ decisions: [String: SubscribeType]) {
        strategyDecisions = decisions
        unheard = Set(decisions.compactMap { $0.value == .none ? $0.key : nil })
        sendSubscriptionsIfChanged()
        emitRoster()
    }

    var rosterEntries: [RosterEntry] {
        roster.values.sorted { $0.slot < $1.slot }.map { p in
            RosterEntry(userID: p.userID, name: p.name, role: p.role, priority: p.priority, canTalk: p.canTalk,
                        canListen: p.canListen, connection: p.connection, talking: p.talking, muted: p.muted,
                        image: p.image.map { ChannelImage(url: $0) },
                        subscribe: unheard.contains(p.userID) ? .none : .audio, isLocal: p.slot == you, slot: p.slot)
        }
    }

    /// Users whose decision is unknown (new since the last evaluation).
    var undecidedEntries: [RosterEntry] { rosterEntries.filter { strategyDecisions[$0.userID] == nil && !$0.isLocal } }
    var decisions: [String: SubscribeType] { strategyDecisions }

    mutating func sendSubscriptionsIfChanged() {
        guard link == .joined, unheardSent != unheard else { return }
        unheardSent = unheard
        outputs.append(.send(.setSubscriptions(unheard: unheard.sorted())))
        // A talker just unsubscribed from stops being the active speaker.
        for (slot, _) in talkers.live where unheardSlot(slot) { remoteTalkEnded(slot: slot) }
    }

    /// Whether `slot` is a user this member chose not to hear.
    func unheardSlot(_ slot: UInt16) -> Bool {
        guard let user = roster[slot]?.userID else { return false }
        return unheard.contains(user)
    }

    /// Roster entries arrived (a chunk, or a `participant`). The mode follows this member's own entry
    /// (a renewed token may take `talk` away, and in a big channel the entry may come after `joined`).
    /// A talker announced before its entry (a big roster still coming in) gets its name shown, or
    /// stops being shown if it turns out to be a user this member does not hear.
    mutating func entriesArrived(_ entries: [RosterMember]) {
        let modeBefore = transmissionMode
        for entry in entries { roster[entry.slot] = entry }
        emitRoster()
        if rosterSettling != nil { awaitRosterSettling() }
        if transmissionMode != modeBefore { outputs.append(.event(.transmissionMode(transmissionMode))) }
        if let speaker = talkers.replay?.slot, entries.contains(where: { $0.slot == speaker }), talkers.showsPlaceholder(of: speaker) {
            showLiveOrReplayed()
        }
        for entry in entries where talkers.live[entry.slot] != nil {
            if unheardSlot(entry.slot) {
                remoteTalkEnded(slot: entry.slot)
            } else if talkers.showsPlaceholder(of: entry.slot) || talkers.shown?.name == entry.name, !entry.name.isEmpty,
                      let participant = remoteParticipant(entry.slot) {
                showRemote(participant)  // its name, or a picture that came with a later entry
            }
        }
    }

    /// A member left the channel (not just its connection).
    mutating func participantLeft(_ slot: UInt16) {
        if let user = roster[slot]?.userID, let entry = announced.removeValue(forKey: user) {
            outputs.append(.event(.participantLeft(entry)))
        }
        roster[slot] = nil
        if talkers.live[slot] != nil { remoteTalkEnded(slot: slot) }
        emitRoster()
    }
}
