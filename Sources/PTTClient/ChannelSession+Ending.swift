import ChannelProtocol

/// How a channel ends, or doesn't: the server's refusals (of the join, or of the membership later),
/// and leaving for good.
extension ChannelSession {
    /// Each refusal means what the state it comes in says: a token problem with a newer token at hand,
    /// a passing trouble for a channel the user is in, a first join that failed, or the end.
    mutating func refused(_ code: RefusalCode, _ reason: String) {
        guard channel != nil else { return }
        // A restored channel is one the user is in, though this process has not joined it yet: what
        // would only end a session (a server briefly unable, an expired token) doesn't forget it. The
        // app renews the token (a saved one often runs out while the app is not running), or the
        // connection is tried again; refusals that end the membership still do.
        let inChannel = joinReport != .due(.developerRequest)
        if code.isTokenProblem, let pending = token.pending, credentials != nil {
            // A newer token is waiting (a restored channel whose saved token ran out, a session whose
            // token expired while the new one was being checked): try it before giving up.
            rejoin(with: pending)
        } else if code.isTokenProblem, token.standing == .tryingNew, inChannel {
            // That token, tried after the old one was refused, is refused too: the channel waits for
            // another, as after an expiry, rather than ending.
            sessionTokenExpired(reason, announce: false)
            outputs.append(.event(.tokenRenewalFailed(code, reason)))
        } else if inChannel, code == .internalError || code == .serverBusy {
            // The server could not check the token (its database is failing) or is full: that passes,
            // so a channel the user is in tries again with backoff, as after a failed connection.
            retryLater(reason)
        } else if inChannel, code == .tokenExpired {
            sessionTokenExpired(reason)
        } else if !joinReported {
            joinRefused(code, reason)
        } else if code == .replaced {
            stepAside(reason)
        } else {
            outputs.append(.event(.notice(reason)))
            switch code {
            case .removedByAdmin, .channelDeleted, .tokenRevoked: finish(reason: .systemPolicy)
            default: finish(reason: .unknown)
            }
        }
    }

    private mutating func rejoin(with pending: String) {
        credentials?.token = pending
        token.joinsWithNew()
        lostConnection()
        outputs.append(.disconnect)
        link = .down
        connect()
    }

    private mutating func retryLater(_ reason: String) {
        lostConnection()
        outputs.append(.disconnect)
        link = .down
        updateStatus(.unavailable)
        outputs.append(.event(.notice(reason)))
        scheduleReconnect()
    }

    /// The first join of a channel the user is not in yet was refused: it failed, and nothing is kept.
    private mutating func joinRefused(_ code: RefusalCode, _ reason: String) {
        guard let channel else { return }
        let error: ChannelError
        switch code {
        case .channelNotFound, .tokenWrongChannel: error = ChannelError(.channelNotFound, reason, refusal: code)
        default: error = ChannelError(.unknown, reason, refusal: code)
        }
        failHeldPress("the channel could not be joined: \(reason)")
        emit(.failedToJoin(channel, error))
        updateStatus(.unavailable)
        outputs.append(.disconnect)
        outputs.append(.flushPlayback)  // taking audio since the connection opened
        reset()
        outputs.append(.forgetRestoration)
    }

    /// Another connection of this user joined: a one-shot `walkie talk`, the same account on a second
    /// device. Leaving would forget a channel the user is still in (and drop the push token that wakes
    /// this device), and joining again at once would replace the other, which would do the same back.
    /// So this one steps aside as if suspended: channel, record and push token kept, the service
    /// unavailable. A transmit request, or `resume`, takes the channel back; a push does too, where the
    /// member's push token is still this device's (the other connection, a one-shot, registered none)
    /// and the server sends pushes.
    private mutating func stepAside(_ reason: String) {
        lostConnection()
        failHeldPress("\(reason); this one stepped aside, talk again to take the channel back")
        link = .suspended
        outputs.append(.disconnect)
        outputs.append(.event(.notice("\(reason): this one stepped aside and keeps the channel; talk to take it back")))
        // Suspended before unavailable: an app reading the status sees why it went.
        outputs.append(.event(.suspended(true)))
        updateStatus(.unavailable)
    }

    /// Leaves the channel for good: everything stops, the token dies, the record goes.
    mutating func finish(reason: ChannelLeaveReason) {
        guard let channel else { return }
        if case .active = transmit { endTransmission(source: .unknown, release: false) }
        // A press still waiting (held while reconnecting, sent and unanswered, or queued) gets its
        // answer: the app would otherwise keep showing "requesting" for a channel that is gone.
        switch transmit {
        case .requesting, .queued:
            emit(.failedToBegin(channel, ChannelError(.transmissionNotAllowed, link == .joined
                ? "the channel ended before the floor was granted" : "the channel ended before it was rejoined")))
        case .idle, .active: break
        }
        transmit = .idle
        clearRemote()
        deactivateAudioIfIdle(force: true)
        outputs.append(.flushPlayback)
        let connected = link != .down
        if let pushToken { outputs.append(.invalidatePushToken(pushToken)) }
        outputs.append(.forgetRestoration)
        reset()
        emit(.didLeave(channel, reason))
        // Last: the engine may wait for the `leave` to be acknowledged before it closes, and an app
        // that exits meanwhile must already have the channel forgotten on disk.
        if connected { outputs.append(.disconnect) }
    }

    /// Back to no channel. The listeners' figure goes back to 0 with the encoder, unannounced: nobody
    /// is listening.
    mutating func reset() {
        channel = nil
        descriptor = nil
        credentials = nil
        link = .down
        transmit = .idle
        talkers = TalkerDisplay()
        audio = AudioSession(isTransmitting: false, isReceiving: false)
        audioActive = false
        pushToken = nil
        modeOverride = nil
        serverInfo = nil
        you = nil
        roster = [:]
        announced = [:]
        appImages = [:]
        rosterSettling = nil
        joinReport = .due(.developerRequest)
        unheardSent = nil
        serviceStatus = .ready
        forgetConnectionState()
        reconnectAttempts = 0
        route = ClusterRoute()
        token = TokenRenewal()
        setListenerLoss(0, announce: false)
        reception = ReceptionLoss()
    }
}
