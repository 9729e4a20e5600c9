/// The remote speaker shown and the audio session it holds: live talkers, replays, and what showing
/// one costs. Whom to show is `TalkerDisplay`'s choice; when a choice is due is decided here.
extension ChannelSession {
    mutating func remoteTalkStarted(slot: UInt16, burst: UInt16) {
        talkers.talkStarted(TalkerDisplay.Burst(slot: slot, burst: burst))
        guard !unheardSlot(slot) else { return }
        if let participant = remoteParticipant(slot) {
            if case .active = transmit, transmissionMode == .halfDuplex { return }
            showRemote(participant)
        }
    }

    mutating func remoteTalkEnded(slot: UInt16) {
        guard talkers.talkEnded(slot: slot) else { return }
        showLiveOrReplayed()
    }

    /// Shows a live talker this member hears, else the talker of the replay playing, else nobody.
    mutating func showLiveOrReplayed() {
        let choice = talkers.choice(roster: roster, unheard: { unheardSlot($0) }, participant: { remoteParticipant($0) })
        showRemote(choice)
    }

    /// A replayed burst started playing: one that had ended (what a phone woken by a push hears when it
    /// joined after a short burst), or one still going whose start this member missed. Its talker is
    /// shown while it plays, unless someone is talking live (or this member is, in half duplex): a
    /// live burst's talker is shown already, and stays shown after the floor ends for as long as the
    /// replay is still playing what was said.
    mutating func replayStarted(slot: UInt16, burst: UInt16) {
        guard channel != nil, slot != you, !unheardSlot(slot) else { return }
        talkers.replayStarted(TalkerDisplay.Burst(slot: slot, burst: burst))
        if case .active = transmit, transmissionMode == .halfDuplex { return }
        if talkers.anyoneAudible(unheard: { unheardSlot($0) }) { return }
        showLiveOrReplayed()
    }

    /// A burst finished playing; if it was the replay shown, the speaker goes back to whoever talks live.
    mutating func replayFinished(slot: UInt16, burst: UInt16) {
        guard talkers.replay == TalkerDisplay.Burst(slot: slot, burst: burst) else { return }
        endReplay()
    }

    /// Playout stopped (the audio output failed): no replay is playing any more.
    mutating func playbackStopped() {
        guard talkers.replay != nil else { return }
        endReplay()
    }

    /// No replay plays any more: the speaker goes back to whoever talks live, if anyone.
    private mutating func endReplay() {
        talkers.replayEnded()
        if case .active = transmit, transmissionMode == .halfDuplex { return }
        showLiveOrReplayed()
    }

    /// The speaker to show for `slot`: its roster name (a placeholder until its entry comes) and
    /// picture, or the picture the app gave that name (`setActiveRemoteParticipant`), which the next
    /// floor event must not take back.
    func remoteParticipant(_ slot: UInt16) -> Participant? {
        let entry = roster[slot]
        let name = (entry?.name).flatMap { $0.isEmpty ? nil : $0 } ?? TalkerDisplay.placeholderName(slot)
        let image = appImages[name] ?? entry?.image.map { ChannelImage(url: $0) }
        return try? Participant(name: name, image: image)
    }

    mutating func showRemote(_ participant: Participant?) {
        guard talkers.show(participant) else { return }
        outputs.append(.event(.activeRemoteParticipant(participant)))
        if participant != nil {
            audio.isReceiving = true
            if !callActive { activateAudio() }
        } else {
            audio.isReceiving = false
            deactivateAudioIfIdle()
        }
    }

    mutating func clearRemote() { showRemote(nil) }

    mutating func activateAudio() {
        guard !audioActive, !callActive else { return }
        audioActive = true
        emit(.didActivate(audio))
    }

    mutating func deactivateAudioIfIdle(force: Bool = false) {
        guard audioActive else { return }
        if !force && (audio.isTransmitting || audio.isReceiving) { return }
        audioActive = false
        emit(.didDeactivate(audio))
    }
}
