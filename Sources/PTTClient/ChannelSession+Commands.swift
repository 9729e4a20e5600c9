import ChannelProtocol
import Foundation

/// The app's commands (Apple's `PTChannelManager` calls), each checked against the state it needs.
extension ChannelSession {
    mutating func requestJoin(_ uuid: UUID, descriptor: ChannelDescriptor, credentials: ChannelCredentials,
                              reason: ChannelJoinReason, pushToken restoredToken: Data? = nil) {
        if let channel {
            if channel != uuid {
                emit(.failedToJoin(uuid, ChannelError(.channelLimitReached, "already in channel \(channel); leave it before joining another")))
            }
            return
        }
        if reason == .developerRequest && appState != .foreground {
            emit(.failedToJoin(uuid, ChannelError(.appNotForeground, "channels are joined from the foreground; call setAppState(.foreground) first")))
            return
        }
        channel = uuid
        self.descriptor = descriptor
        self.credentials = credentials
        joinReport = .due(reason)
        pushToken = restoredToken
        unheardSent = nil
        connect()
    }

    mutating func leave(_ uuid: UUID, reason: ChannelLeaveReason = .developerRequest) {
        guard channel == uuid else {
            emit(.failedToLeave(uuid, ChannelError(.channelNotFound, "no active channel \(uuid)")))
            return
        }
        if link == .joined {
            outputs.append(.send(.leave))
        } else if let credentials {
            // Suspended, reconnecting, joining, or the server down: the leave can't go on this
            // connection, and without it the server keeps the member (in everyone's roster, woken by
            // push) for good. With an expired token only a renewal not yet taken can still get in.
            if !token.isExpired {
                outputs.append(.oweLeave(uuid, credentials))
            } else if let pending = token.pending {
                var renewed = credentials
                renewed.token = pending
                outputs.append(.oweLeave(uuid, renewed))
            } else {
                outputs.append(.event(.notice("the participant token expired, so the server could not be told of the leave; it lists you in the channel until an administrator removes you")))
            }
        }
        finish(reason: reason)
    }

    mutating func beginTransmitting(_ uuid: UUID, source: ChannelTransmitRequestSource) {
        guard channel == uuid else {
            emit(.failedToBegin(uuid, ChannelError(.channelNotFound, "no active channel \(uuid)")))
            return
        }
        if let refusal = beginRefusal(source) {
            emit(.failedToBegin(uuid, refusal))
            return
        }
        switch link {
        case .joined:
            transmit = .requesting(source)
            floorRequests.press()
            outputs.append(.send(floorRequests.request))
        case .suspended, .down, .connecting, .joining:
            // Not connected (woken from the background, or the connection is being remade): the
            // press is held, and the request goes out once the channel is rejoined, as a radio keys
            // up as soon as it has the network. Refused instead, it looked ignored: the failure was
            // soon replaced on screen by "connected again". A reconnect waiting out its backoff is
            // tried now; the user is waiting. The wait is bounded (`transmitWaitDue`).
            transmit = .requesting(source)
            outputs.append(.scheduleTransmitWait(milliseconds: Self.transmitWaitMilliseconds, request: floorRequests.press()))
            if link == .suspended || link == .down { connect() }
        }
    }

    /// Why a press can't be taken now, if it can't.
    private func beginRefusal(_ source: ChannelTransmitRequestSource) -> ChannelError? {
        if appState != .foreground && source != .handsfreeButton {
            return ChannelError(.appNotForeground, "transmitting starts from the foreground (or an accessory button)")
        }
        if callActive { return ChannelError(.callActive, "a call holds the audio; talk after it ends") }
        if transmissionMode == .listenOnly { return ChannelError(.transmissionNotAllowed, "this channel is listen-only for you") }
        guard transmit == .idle else {
            return ChannelError(.transmissionInProgress, "already transmitting or waiting for the floor")
        }
        switch link {
        case .joined where serviceStatus != .ready || stalled:
            return ChannelError(.transmissionNotAllowed, "the service is \(stalled || serviceStatus == .connecting ? "connecting" : "unavailable"); wait until it is ready")
        case .down where token.isExpired:
            return ChannelError(.transmissionNotAllowed, "the participant token expired; hand the channel a new one with renewToken to talk again")
        case .joining where stalled:
            // The join went out and squelchd has not answered it for the stall timeout: as a stall
            // while joined, refused now rather than held in silence.
            return ChannelError(.transmissionNotAllowed, "squelchd did not answer the join; the connection may be down")
        default:
            return nil
        }
    }

    /// How long a press made while not connected waits for the channel to be rejoined before it
    /// fails: MCPTT's floor-request budget (T101 × C101) is seconds too, and a user holding the key
    /// must learn soon that nobody hears.
    static let transmitWaitMilliseconds = 4_000

    mutating func stopTransmitting(_ uuid: UUID, source: ChannelTransmitRequestSource) {
        guard channel == uuid else {
            emit(.failedToStop(uuid, ChannelError(.channelNotFound, "no active channel \(uuid)")))
            return
        }
        switch transmit {
        case .idle:
            emit(.failedToStop(uuid, ChannelError(.transmissionNotFound, "not transmitting")))
        case .requesting, .queued:
            // Let go before the grant: withdraw the request; nothing began, so nothing ends.
            withdrawRequest(nil)
        case .active:
            endTransmission(source: source, release: true)
        }
    }

    mutating func setAppState(_ state: AppState) { appState = state }

    /// A system call takes the audio (or gives it back): transmission stops and playback goes quiet.
    mutating func setSystemCall(active: Bool) {
        guard active != callActive else { return }
        callActive = active
        if active {
            if case .active = transmit { endTransmission(source: .unknown, release: true) }
            // A request still waiting would otherwise be granted into the call.
            withdrawRequest(ChannelError(.callActive, "a call took the audio before the floor was granted"))
            outputs.append(.mutePlayback(true))
            deactivateAudioIfIdle(force: true)
        } else {
            outputs.append(.mutePlayback(false))
            if talkers.shown != nil { activateAudio() }
        }
    }

    /// The app sets the remote speaker itself (Apple's `setActiveRemoteParticipant`).
    mutating func setActiveRemoteParticipant(_ participant: Participant?, _ uuid: UUID) throws(ChannelError) {
        guard channel == uuid else { throw ChannelError(.channelNotFound, "no active channel \(uuid)") }
        if participant != nil, case .active = transmit, transmissionMode == .halfDuplex {
            throw ChannelError(.transmissionInProgress, "you are transmitting; stop before showing a remote speaker")
        }
        if let participant, let image = participant.image { appImages[participant.name] = image }
        showRemote(participant)
    }

    mutating func setServiceStatus(_ status: ServiceStatus, _ uuid: UUID) throws(ChannelError) {
        guard channel == uuid else { throw ChannelError(.channelNotFound, "no active channel \(uuid)") }
        updateStatus(status)
    }

    mutating func setTransmissionMode(_ mode: TransmissionMode, _ uuid: UUID) throws(ChannelError) {
        guard channel == uuid else { throw ChannelError(.channelNotFound, "no active channel \(uuid)") }
        modeOverride = mode
        if mode == .listenOnly {
            if case .active = transmit { endTransmission(source: .unknown, release: true) }
            withdrawRequest(ChannelError(.transmissionNotAllowed, "the channel was set to listen only before the floor was granted"))
        }
        outputs.append(.event(.transmissionMode(transmissionMode)))
    }

    mutating func setChannelDescriptor(_ descriptor: ChannelDescriptor, _ uuid: UUID) throws(ChannelError) {
        guard channel == uuid else { throw ChannelError(.channelNotFound, "no active channel \(uuid)") }
        self.descriptor = descriptor
        saveRecord()
        outputs.append(.event(.descriptor(descriptor)))
    }

    mutating func setAccessoryButtonEventsEnabled(_ enabled: Bool, _ uuid: UUID) throws(ChannelError) {
        guard channel == uuid else { throw ChannelError(.channelNotFound, "no active channel \(uuid)") }
        accessoryButtonEventsEnabled = enabled
    }

    /// A hands-free button went down or up; ignored while accessory events are disabled.
    mutating func accessoryButton(pressed: Bool, _ uuid: UUID) {
        guard accessoryButtonEventsEnabled, channel == uuid else { return }
        if pressed { beginTransmitting(uuid, source: .handsfreeButton) } else { stopTransmitting(uuid, source: .handsfreeButton) }
    }

    /// The user silenced the channel's playback (or turned it back on). The roster shows everyone that
    /// this member muted the channel, so a dispatcher knows who will not hear a call; each new session
    /// says it again, since the server forgets it across restarts.
    mutating func setMuted(_ value: Bool) {
        guard muted != value else { return }
        muted = value
        if link == .joined { outputs.append(.send(.setMuted(value))) }
    }

    /// The app closes the voice connection to save power; pushes wake it (`pushResult`).
    mutating func suspend() {
        guard channel != nil, link != .suspended, link != .down else { return }
        if case .active = transmit { endTransmission(source: .unknown, release: true) }
        // A request (waiting for its answer or in the queue) is withdrawn before the connection
        // closes: without the release, a grant meanwhile held the floor in silence for the grace.
        withdrawRequest(ChannelError(.transmissionNotAllowed, "the channel was suspended before the floor was granted"))
        link = .suspended
        if stalled || serviceStatus == .connecting { updateStatus(serverStatus) }
        // What the session knew of this connection (answers owed to withdrawn requests, a stall)
        // doesn't carry over to the next.
        forgetConnectionState()
        outputs.append(.disconnect)
        outputs.append(.event(.suspended(true)))
    }

    /// Wakes a suspended client without a push (the app came back to the foreground).
    mutating func resume() {
        guard link == .suspended else { return }
        connect()
    }
}
