import ChannelProtocol

/// What the server says: each message goes to the part of the session it is about.
extension ChannelSession {
    mutating func received(_ message: ServerMessage) {
        guard channel != nil else { return }
        switch message {
        case .joined(let info, let slot, let participants, let talkers, let features):
            joined(info, you: slot, roster: participants, talkers: talkers, features: features)
        case .roster(let entries):
            entriesArrived(entries)
        case .participant(let entry):
            entriesArrived([entry])
        case .participantLeft(let slot, _):
            participantLeft(slot)
        case .refused(let code, let reason):
            refused(code, reason)
        case .floor(let event):
            floor(event)
        case .descriptor(let info):
            serverInfo = info
            outputs.append(.event(.channelInfo(info)))
            outputs.append(.event(.transmissionMode(transmissionMode)))
        case .serviceStatus(let status, let reason):
            serverStatus = ServiceStatus(status)
            updateStatus(stalled ? .connecting : serverStatus)
            if let reason { outputs.append(.event(.notice(reason))) }
        case .pushTokenRegistered, .subscriptions:
            break
        case .error(let code, let reason):
            serverError(code, reason)
        case .tokenExpiring(let expiresAt):
            outputs.append(.event(.tokenExpiring(expiresAt)))
        case .tokenRenewed(let expiresAt):
            renewalAccepted()
            outputs.append(.event(.tokenRenewed(expiresAt)))
        case .receptionLoss(let percent):
            setListenerLoss(percent)
        case .redirect(let home, let pass):
            redirected(to: home, pass: pass)
        case .move(let home):
            moved(to: home)
        case .mediaKey:
            break  // the connection's task hands keys over (`SessionKeys`), ahead of the session
        }
    }

    /// The join went through: a new session on the server, which knows nothing of the last one.
    private mutating func joined(_ info: ChannelInfo, you slot: UInt16, roster participants: [RosterMember],
                                 talkers live: [Talker], features: [ProtocolFeature]) {
        guard let channel, link == .joining else { return }
        link = .joined
        reconnectAttempts = 0
        route.joined(features: features)
        serverInfo = info
        you = slot
        roster = Dictionary(participants.map { ($0.slot, $0) }, uniquingKeysWith: { $1 })
        talkers.forgetLive()
        serverStatus = .ready
        updateStatus(.ready)
        // The server keeps neither loss figure across sessions: the talker side starts at 0 again, and
        // this member's own figure goes out at once if it matters (and the server takes it).
        let report = reception.sessionBegan(serverTakesReports: features.contains(.receptionReport))
        setListenerLoss(0)
        if let report { outputs.append(.send(.receptionReport(lossPercent: report))) }
        // The token tried after the last one ran out works: it is the one to restore (a first join
        // saves it below anyway).
        if token.joined(), joinReported { saveRecord() }
        if case .due(let reason) = joinReport {
            joinReport = .made
            saveRecord()
            emit(.didJoin(channel, reason))
        }
        outputs.append(.event(.channelInfo(info)))
        outputs.append(.event(.transmissionMode(transmissionMode)))
        if pushToken == nil { outputs.append(.requestPushToken(channel)) } else { registerToken() }
        if (roster[slot]?.muted ?? false) != muted { outputs.append(.send(.setMuted(muted))) }
        unheardSent = nil
        sendSubscriptionsIfChanged()
        emitRoster()
        if !announced.isEmpty { awaitRosterSettling() }  // a rejoin: who left meanwhile?
        floorAtJoin(live, you: slot)
        // A renewal in flight died with the old connection; the newest token is offered again.
        token.answerLost()
        sendPendingRenewal()
    }

    /// `joined`'s `talkers`: who holds the floor as this session begins.
    private mutating func floorAtJoin(_ live: [Talker], you slot: UInt16) {
        for talker in live where talker.slot != slot { remoteTalkStarted(slot: talker.slot, burst: talker.burst) }
        // A speaker shown from a push, whose burst ended before this join: nobody is talking now,
        // unless the server's replay of that burst is already playing.
        if !talkers.anyoneAudible(unheard: { unheardSlot($0) }) { showLiveOrReplayed() }
        // This member held the floor when the connection dropped and is back within the grace
        // period, so the server kept its burst going; the transmission ended here with the
        // connection, so the floor goes back at once rather than staying held in silence until
        // the maximum burst length. A press made meanwhile asks after it, for a burst of its own.
        if live.contains(where: { $0.slot == slot }) { outputs.append(.send(.floorRelease)) }
        if case .requesting = transmit { outputs.append(.send(floorRequests.request)) }
    }

    /// An `error`: the answer to a renewal, messages dropped for their rate, or something to tell.
    private mutating func serverError(_ code: RefusalCode, _ reason: String) {
        if token.awaitsAnswer, code.isTokenProblem || code == .internalError {
            renewalRefused(code, reason)
            return
        }
        if code == .rateLimited {
            // The server dropped some of what was sent, and says so at most once a second, not which.
            // What the server must know is said again once the budget has refilled.
            if !resyncScheduled {
                resyncScheduled = true
                outputs.append(.scheduleResync(milliseconds: 1_500))
            }
        }
        outputs.append(.event(.notice("server: \(reason)")))
    }

    /// After messages dropped for their rate: the subscriptions, the muted flag (if the server's entry
    /// disagrees), the push token and a token renewal waiting for its answer are sent again. Each is
    /// idempotent on the server; a floor request was answered with `denied` and a release is never
    /// dropped, so the floor needs nothing.
    mutating func resyncDue() {
        resyncScheduled = false
        guard link == .joined else { return }  // a new join says everything anyway
        unheardSent = nil
        sendSubscriptionsIfChanged()
        if let you, let own = roster[you], own.muted != muted { outputs.append(.send(.setMuted(muted))) }
        registerToken()
        // A renewal dropped too would block every later one until a reconnect, and the session would
        // end with the old token. A second answer to it is ignored (`renewalAccepted`).
        if token.awaitsAnswer {
            token.answerLost()
            sendPendingRenewal()
        }
    }

    /// The receiver finished a window of heard audio, `percent` of it missing on arrival: reported to
    /// the server when it moved enough (`ReceptionLoss`).
    mutating func receptionMeasured(_ percent: Int) {
        guard let report = reception.measured(percent, joined: link == .joined) else { return }
        outputs.append(.send(.receptionReport(lossPercent: report)))
    }

    /// `announce`: tell the app too. Not when the channel is left: nobody is listening then.
    mutating func setListenerLoss(_ percent: Int, announce: Bool = true) {
        guard reception.listenerLossSaid(percent) else { return }
        outputs.append(.adaptToListenerLoss(percent))
        if announce { outputs.append(.event(.listenerLoss(percent))) }
    }
}
