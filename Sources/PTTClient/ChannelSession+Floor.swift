import ChannelProtocol

/// This member's own transmission: the server's floor answers, and ending or withdrawing a press.
/// Which answer belongs to which request is `FloorRequests`'s to tell.
extension ChannelSession {
    mutating func floor(_ event: FloorEvent) {
        guard let channel, !floorRequests.isStale(event, pressed: transmit != .idle) else { return }
        switch event.kind {
        case .granted:
            guard let burst = event.burst else { return }
            granted(burst: burst)
        case .denied:
            guard transmit != .idle else { return }
            transmit = .idle
            outputs.append(.tone(.busy))
            emit(.failedToBegin(channel, Self.error(for: event)))
        case .queued:
            switch transmit {
            case .requesting(let source), .queued(let source, _):
                if case .requesting = transmit { outputs.append(.tone(.queued)) }  // not at each move up
                transmit = .queued(source, position: event.position ?? 0)
                outputs.append(.event(.floorQueued(position: event.position ?? 0)))
            default: break
            }
        case .revoked:
            guard case .active = transmit else { return }
            outputs.append(.event(.transmissionRevoked(event.cause, event.reason ?? "the floor was taken away")))
            endTransmission(source: .unknown, release: false)
        case .taken:
            guard let slot = event.slot, slot != you else { return }
            remoteTalkStarted(slot: slot, burst: event.burst ?? 0)
        case .ended:
            guard let slot = event.slot else { return }
            if slot == you {
                // Only the burst it names: the end of a withdrawn request's burst is not this one's.
                if case .active(_, let burst) = transmit, event.burst == nil || event.burst == burst {
                    endTransmission(source: .unknown, release: false)
                }
            } else {
                remoteTalkEnded(slot: slot)
            }
        case .idle:
            for slot in Array(talkers.live.keys) { remoteTalkEnded(slot: slot) }
        }
    }

    private mutating func granted(burst: UInt16) {
        guard let channel else { return }
        switch transmit {
        case .requesting(let source), .queued(let source, _):
            if transmissionMode == .halfDuplex { clearRemote() }
            transmit = .active(source, burst: burst)
            outputs.append(.tone(.talkPermit))
            emit(.didBeginTransmitting(channel, source))
            audio.isTransmitting = true
            activateAudio()
            outputs.append(.startSending(burst: burst))
        case .active(let source, _):
            transmit = .active(source, burst: burst)
        case .idle:
            // A grant for a request the user already let go of.
            outputs.append(.send(.floorRelease))
        }
    }

    static func error(for event: FloorEvent) -> ChannelError {
        let reason = event.reason ?? "the floor was refused"
        let code: ChannelError.Code
        switch event.cause {
        case .notAllowed?: code = .transmissionNotAllowed
        case .busy?, .queueFull?: code = .transmissionInProgress
        case .notJoined?: code = .channelNotFound
        default: code = .unknown
        }
        return ChannelError(code, reason, floorCause: event.cause)
    }

    /// A press held while not connected (never sent) fails now, saying why: the channel it waits for
    /// is gone, or can't be rejoined without the app's help.
    mutating func failHeldPress(_ message: String) {
        guard let channel, link != .joined, case .requesting = transmit else { return }
        transmit = .idle
        emit(.failedToBegin(channel, ChannelError(.transmissionNotAllowed, message)))
    }

    /// The wait of a press made while not connected is over. Still not rejoined (the request never
    /// went out): it fails, and the reconnecting goes on. Once the request is sent, the stall
    /// timeout and the floor's own answers take over.
    mutating func transmitWaitDue(request: UInt32) {
        guard let channel, request == floorRequests.newest, case .requesting = transmit, link != .joined else { return }
        transmit = .idle
        emit(.failedToBegin(channel, ChannelError(.transmissionNotAllowed, token.isExpired
            ? "the participant token expired; hand the channel a new one with renewToken to talk again"
            : "the channel could not be rejoined within \(Self.transmitWaitMilliseconds / 1_000) s; still trying, talk again once the service is ready")))
    }

    /// Ends the local transmission: the end marker goes out before the release, so listeners close
    /// the burst at once instead of waiting for a timeout.
    mutating func endTransmission(source: ChannelTransmitRequestSource, release: Bool) {
        guard let channel, case .active = transmit else { return }
        transmit = .idle
        outputs.append(.stopSending)
        if release && link == .joined { outputs.append(.send(.floorRelease)) }
        emit(.didEndTransmitting(channel, source))
        audio.isTransmitting = false
        // In half duplex a replay that started meanwhile wasn't shown; it is now.
        if talkers.shown == nil, talkers.replay != nil { showLiveOrReplayed() }
        deactivateAudioIfIdle()
    }

    /// Withdraws a floor request still waiting for its answer or in the queue, and tells the app:
    /// why its begin failed, or (`nil`: the user let go) that it was cancelled. The release follows
    /// the request on the stream, so the server drops it (or ends the burst it granted meanwhile).
    mutating func withdrawRequest(_ error: ChannelError?) {
        guard let channel else { return }
        switch transmit {
        case .requesting, .queued: break
        case .idle, .active: return
        }
        if case .requesting = transmit, link == .joined { floorRequests.withdrew() }
        transmit = .idle
        if link == .joined { outputs.append(.send(.floorRelease)) }
        if let error { emit(.failedToBegin(channel, error)) } else { outputs.append(.event(.transmitCancelled)) }
    }
}
