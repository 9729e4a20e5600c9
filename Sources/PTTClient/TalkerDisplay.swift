import ChannelProtocol

/// Who the app is shown as speaking (Apple's `activeRemoteParticipant`), and what that is chosen
/// from: the remote members holding the floor now and the replayed burst playing. Kept together
/// because each change of either may change the choice, and the choice (a live talker this member
/// hears, else the replay's talker, else nobody) is made in one place. The session decides when a
/// choice is due (not over this member's own half-duplex burst) and what showing costs (the audio).
struct TalkerDisplay {
    /// A remote talker's burst.
    struct Burst: Equatable {
        var slot: UInt16
        var burst: UInt16
    }

    /// The speaker shown now.
    private(set) var shown: Participant?
    /// Remote slots holding the floor now, and their bursts.
    private(set) var live: [UInt16: UInt16] = [:]
    /// The replayed burst playing now (one that ended before this member heard it, as after a wake
    /// push), whose talker is shown while nobody talks live. By burst too: a finish of another burst
    /// of the same talker doesn't end it.
    private(set) var replay: Burst?

    /// Shows `participant`; true if that changed what is shown.
    mutating func show(_ participant: Participant?) -> Bool {
        guard participant != shown else { return false }
        shown = participant
        return true
    }

    mutating func talkStarted(_ talker: Burst) { live[talker.slot] = talker.burst }

    /// True if `slot` was talking.
    mutating func talkEnded(slot: UInt16) -> Bool { live.removeValue(forKey: slot) != nil }

    /// A new session: its `joined` says who talks now.
    mutating func forgetLive() { live = [:] }

    mutating func replayStarted(_ burst: Burst) { replay = burst }

    mutating func replayEnded() { replay = nil }

    /// Whether a live talker is one this member hears.
    func anyoneAudible(unheard: (UInt16) -> Bool) -> Bool { live.keys.contains { !unheard($0) } }

    /// Whom to show: a live talker this member hears (once its roster entry has come), else the
    /// talker of the replay playing, else nobody.
    /// - Parameter participant: the participant to show for a slot (`ChannelSession.remoteParticipant`).
    func choice(roster: [UInt16: RosterMember], unheard: (UInt16) -> Bool, participant: (UInt16) -> Participant?) -> Participant? {
        let audible = live.keys.filter { !unheard($0) }
        if let next = audible.first, let name = roster[next]?.name, !name.isEmpty, let shown = participant(next) {
            return shown
        }
        guard let speaker = replay?.slot, !unheard(speaker) else { return nil }
        return participant(speaker)
    }

    /// Whether what is shown is `slot`'s placeholder, its roster entry not yet come.
    func showsPlaceholder(of slot: UInt16) -> Bool { shown?.name == Self.placeholderName(slot) }

    /// What a talker is called until its roster entry arrives.
    static func placeholderName(_ slot: UInt16) -> String { "member \(slot)" }
}
