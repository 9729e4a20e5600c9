import ChannelProtocol
import Foundation
import ParticipantClaims

/// A delegate callback the session wants made, in order.
enum DelegateCall: Sendable, Equatable {
    case didJoin(UUID, ChannelJoinReason)
    case didLeave(UUID, ChannelLeaveReason)
    case didBeginTransmitting(UUID, ChannelTransmitRequestSource)
    case didEndTransmitting(UUID, ChannelTransmitRequestSource)
    case receivedPushToken(Data)
    case didActivate(AudioSession)
    case didDeactivate(AudioSession)
    case failedToJoin(UUID, ChannelError)
    case failedToLeave(UUID, ChannelError)
    case failedToBegin(UUID, ChannelError)
    case failedToStop(UUID, ChannelError)
}

/// Everything the session asks of the world. The driver carries these out in order.
enum SessionOutput: Sendable, Equatable {
    case delegate(DelegateCall)
    /// Open a voice connection and handshake; answer with `transportConnected` or `transportFailed`.
    case connect(ChannelCredentials)
    /// Close the voice connection (`leaving`: for good, with CLOSE code normal).
    case disconnect
    case send(ClientMessage)
    /// Start capturing and sending audio stamped with `burst`.
    case startSending(burst: UInt16)
    /// Stop capturing; send the end-of-burst marker (three times) before anything that follows.
    case stopSending
    /// The worst loss among this member's listeners (percent): the encoder adds FEC from 2 %.
    case adaptToListenerLoss(Int)
    /// Mute or unmute playback (a system call holds the audio).
    case mutePlayback(Bool)
    /// Drop whatever is buffered for playback (leaving a channel).
    case flushPlayback
    /// Try the connection again after at most this long (the engine waits a random time between half
    /// and all of it); answer with `reconnectDue`.
    case scheduleReconnect(milliseconds: Int)
    /// A press made while not connected waits this long for the channel to be rejoined; answer with
    /// `transmitWaitDue(request:)`.
    case scheduleTransmitWait(milliseconds: Int, request: UInt32)
    /// The server dropped control messages for their rate; answer with `resyncDue` after this long, to
    /// say again what may have been lost.
    case scheduleResync(milliseconds: Int)
    /// Ask the push transport for an ephemeral token; answer with `pushTokenIssued`.
    case requestPushToken(UUID)
    /// The token is dead (the channel was left).
    case invalidatePushToken(Data)
    case save(RestorationRecord)
    case forgetRestoration
    /// The channel was left while not joined: the server has not heard the leave. Deliver it on a
    /// connection of its own, now and after restarts, until the server takes it (`OwedLeave`).
    case oweLeave(UUID, ChannelCredentials)
    case event(ChannelManagerEvent)
}

/// The channel manager's logic as a plain state machine (the project's sans-I/O rule): commands from
/// the app, events from the transport and the server go in; delegate calls, messages and media
/// actions come out of `takeOutputs()`. No sockets, clocks, threads or audio here, so every path of
/// Apple's API can be driven deterministically in tests.
struct ChannelSession {
    enum Link: Sendable, Equatable {
        /// No channel, or suspended: no connection.
        case down
        /// Handshaking.
        case connecting
        /// Connected; `join` sent, waiting for `joined` or `refused`.
        case joining
        case joined
        /// The app closed the connection to sleep; a push or a transmit request wakes it.
        case suspended
    }

    enum Transmit: Sendable, Equatable {
        case idle
        /// `floorRequest` sent (or waiting for the connection to send it).
        case requesting(ChannelTransmitRequestSource)
        case queued(ChannelTransmitRequestSource, position: Int)
        case active(ChannelTransmitRequestSource, burst: UInt16)
    }

    private(set) var channel: UUID?
    private(set) var descriptor: ChannelDescriptor?
    private(set) var credentials: ChannelCredentials?
    private(set) var link = Link.down
    private(set) var appState = AppState.foreground
    private(set) var callActive = false
    /// Playback silenced by the user (`setMuted`), as the roster should show it.
    private(set) var muted = false
    /// A `resyncDue` is on its way (the server said it dropped messages for their rate).
    private var resyncScheduled = false
    private(set) var serviceStatus = ServiceStatus.ready
    private(set) var transmit = Transmit.idle
    private(set) var activeRemoteParticipant: Participant?
    private(set) var audio = AudioSession(isTransmitting: false, isReceiving: false)
    private(set) var audioActive = false
    private(set) var pushToken: Data?
    private(set) var accessoryButtonEventsEnabled = true
    /// The mode the app set (`setTransmissionMode`); the server's otherwise.
    private(set) var modeOverride: TransmissionMode?
    private(set) var serverInfo: ChannelInfo?
    private(set) var you: UInt16?
    private(set) var roster: [UInt16: ChannelProtocol.Participant] = [:]
    /// Remote slots holding the floor now.
    private(set) var remoteTalkers: [UInt16: UInt16] = [:]
    /// The replayed burst playing now (one that ended before this member heard it, as after a wake
    /// push), whose talker is shown while nobody talks live. By burst too: a finish of another burst
    /// of the same talker doesn't end it.
    private var replay: (slot: UInt16, burst: UInt16)?
    private var replaySpeaker: UInt16? { replay?.slot }
    /// Whether `didJoin` went out for the current channel (reconnects don't repeat it).
    private(set) var joinReported = false
    private var joinReason = ChannelJoinReason.developerRequest
    /// Failed connection attempts in a row, for the backoff.
    private(set) var reconnectAttempts = 0
    /// squelchd closed saying it was going away, and no connection has come up since.
    private(set) var serverAway = false
    private(set) var unheard: Set<String> = []
    /// The server ended the session because the participant token expired: no connection is tried
    /// until the app hands over a new token (`renewToken`), since every join would be refused.
    private(set) var tokenExpired = false
    /// The newest token from `renewToken` that the server has not taken yet. `credentials` keep the
    /// token the server last accepted until it takes this one, so that a token it refuses (forged,
    /// another user's) never replaces one that works, in memory or in the restoration record.
    private(set) var pendingToken: String?
    /// The renewal sent and not yet answered: one at a time, so each answer is known to be its answer.
    private var renewalInFlight: String?
    /// The reception loss last reported to the server in this session (it starts every session at 0).
    private(set) var reportedLoss = 0
    /// The receiver's latest figure, kept across reconnects: a link bad enough to drop the
    /// connection is still bad after it, so the new session is told at once rather than after the
    /// next window of audio.
    private var measuredLoss = 0
    /// The transport reports the server silent (`ConnectionEvent.stalled`): the channel shows
    /// `connecting` until it answers again or the connection is given up.
    private(set) var stalled = false
    /// What the server last said of its own health (`serviceStatus`), shown again when a stall ends.
    private var serverStatus = ServiceStatus.ready
    /// The number of the newest floor request (`floorRequest(request:)`), one per press, never reused
    /// within the session's life: the server names it in every answer about this member's place at
    /// the floor, so an answer to a request withdrawn since (by letting go or by a stall) is told from
    /// the current one's. Taken for the next press, a late grant would start a burst that ends at once.
    private var floorRequestNumber: UInt32 = 0
    /// Whether floor requests may wait in squelchd's queue (`ChannelManagerConfiguration.waitsForFloor`).
    var waitsForFloor = true
    /// This connection's server numbers its answers (it echoed a request number): `owedFloorAnswers`
    /// is not needed.
    private var serverNumbersAnswers = false
    /// For a server that doesn't number its answers (older than `FloorEvent.request`): floor requests
    /// withdrawn before their answer came. It answers every request (granted, queued or denied) in
    /// order, so the next that many answers are theirs, not a newer request's.
    private var owedFloorAnswers = 0
    /// This session's server did not announce `receptionReport` in `joined` (one older than the
    /// message): it gets no reports, which it would only answer with an error.
    private var reportsRefused = false
    /// The worst loss among this member's listeners, as the server last said in this session.
    private(set) var listenerLoss = 0
    /// The join under way uses a token the server has not accepted yet (tried because the one before
    /// it was refused): if this one is refused too, the channel waits for another rather than ending.
    private var tryingNewToken = false
    private var unheardSent: Set<String>?
    private var strategyDecisions: [String: SubscribeType] = [:]

    /// The APNs environment the push transport's tokens belong to.
    var pushEnvironment = PushEnvironment.sandbox

    private var outputs: [SessionOutput] = []

    mutating func takeOutputs() -> [SessionOutput] {
        defer { outputs.removeAll(keepingCapacity: true) }
        return outputs
    }

    /// The mode in force: the app's choice, else listen-only for a token without `talk`, else the channel's.
    var transmissionMode: TransmissionMode {
        if let modeOverride { return modeOverride }
        if let you, let me = roster[you], !me.canTalk { return .listenOnly }
        return serverInfo?.mode == .fullDuplex ? .fullDuplex : .halfDuplex
    }

    // MARK: App commands

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
        joinReason = reason
        joinReported = false
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
            if !tokenExpired {
                outputs.append(.oweLeave(uuid, credentials))
            } else if let pendingToken {
                var renewed = credentials
                renewed.token = pendingToken
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
        if appState != .foreground && source != .handsfreeButton {
            emit(.failedToBegin(uuid, ChannelError(.appNotForeground, "transmitting starts from the foreground (or an accessory button)")))
            return
        }
        if callActive {
            emit(.failedToBegin(uuid, ChannelError(.callActive, "a call holds the audio; talk after it ends")))
            return
        }
        if transmissionMode == .listenOnly {
            emit(.failedToBegin(uuid, ChannelError(.transmissionNotAllowed, "this channel is listen-only for you")))
            return
        }
        guard transmit == .idle else {
            emit(.failedToBegin(uuid, ChannelError(.transmissionInProgress, "already transmitting or waiting for the floor")))
            return
        }
        switch link {
        case .joined:
            guard serviceStatus == .ready, !stalled else {
                emit(.failedToBegin(uuid, ChannelError(.transmissionNotAllowed, "the service is \(stalled || serviceStatus == .connecting ? "connecting" : "unavailable"); wait until it is ready")))
                return
            }
            transmit = .requesting(source)
            floorRequestNumber &+= 1
            outputs.append(.send(.floorRequest(request: floorRequestNumber, queue: waitsForFloor)))
        case .down where tokenExpired:
            emit(.failedToBegin(uuid, ChannelError(.transmissionNotAllowed, "the participant token expired; hand the channel a new one with renewToken to talk again")))
        case .joining where stalled:
            // The join went out and squelchd has not answered it for the stall timeout: as a stall
            // while joined, refused now rather than held in silence.
            emit(.failedToBegin(uuid, ChannelError(.transmissionNotAllowed, "squelchd did not answer the join; the connection may be down")))
        case .suspended, .down, .connecting, .joining:
            // Not connected (woken from the background, or the connection is being remade): the
            // press is held, and the request goes out once the channel is rejoined, as a radio keys
            // up as soon as it has the network. Refused instead, it looked ignored: the failure was
            // soon replaced on screen by "connected again". A reconnect waiting out its backoff is
            // tried now; the user is waiting. The wait is bounded (`transmitWaitDue`).
            transmit = .requesting(source)
            floorRequestNumber &+= 1
            outputs.append(.scheduleTransmitWait(milliseconds: Self.transmitWaitMilliseconds, request: floorRequestNumber))
            if link == .suspended || link == .down { connect() }
        }
    }

    /// How long a press made while not connected waits for the channel to be rejoined before it
    /// fails: MCPTT's floor-request budget (T101 × C101) is seconds too, and a user holding the key
    /// must learn soon that nobody hears.
    static let transmitWaitMilliseconds = 4_000

    /// A press held while not connected (never sent) fails now, saying why: the channel it waits for
    /// is gone, or can't be rejoined without the app's help.
    private mutating func failHeldPress(_ message: String) {
        guard let channel, link != .joined, case .requesting = transmit else { return }
        transmit = .idle
        emit(.failedToBegin(channel, ChannelError(.transmissionNotAllowed, message)))
    }

    /// The wait of a press made while not connected is over. Still not rejoined (the request never
    /// went out): it fails, and the reconnecting goes on. Once the request is sent, the stall
    /// timeout and the floor's own answers take over.
    mutating func transmitWaitDue(request: UInt32) {
        guard let channel, request == floorRequestNumber, case .requesting = transmit, link != .joined else { return }
        transmit = .idle
        emit(.failedToBegin(channel, ChannelError(.transmissionNotAllowed, tokenExpired
            ? "the participant token expired; hand the channel a new one with renewToken to talk again"
            : "the channel could not be rejoined within \(Self.transmitWaitMilliseconds / 1_000) s; still trying, talk again once the service is ready")))
    }

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
            if activeRemoteParticipant != nil { activateAudio() }
        }
    }

    /// The app sets the remote speaker itself (Apple's `setActiveRemoteParticipant`).
    mutating func setActiveRemoteParticipant(_ participant: Participant?, _ uuid: UUID) throws(ChannelError) {
        guard channel == uuid else { throw ChannelError(.channelNotFound, "no active channel \(uuid)") }
        if participant != nil, case .active = transmit, transmissionMode == .halfDuplex {
            throw ChannelError(.transmissionInProgress, "you are transmitting; stop before showing a remote speaker")
        }
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

    // MARK: Participant token

    /// The app has a new participant token for the channel (Squelch's own: Apple's framework leaves
    /// credentials to the app's server). A joined session offers it to the server (`renewToken`) at
    /// once, any other once it is joined again; a session that ended because its token expired joins
    /// again with it now.
    mutating func renewToken(_ token: String, _ uuid: UUID) throws(ChannelError) {
        guard channel == uuid, var credentials else { throw ChannelError(.channelNotFound, "no active channel \(uuid)") }
        // A join doesn't check the user as a renewal does, and a pending token may be joined with: a
        // token for someone else must not get that far. (Read without verifying; the server verifies.)
        if let now = Self.subject(of: credentials.token), let new = Self.subject(of: token), now != new {
            throw ChannelError(.unknown, "the token is for user '\(new)', but this channel was joined as '\(now)'; renew with a token issued to '\(now)'",
                               refusal: .tokenWrongUser)
        }
        if link == .down && tokenExpired {
            // Nothing to lose: the old token is dead. Join with this one; a refusal comes back as
            // `tokenRenewalFailed` and the channel waits again.
            credentials.token = token
            self.credentials = credentials
            pendingToken = nil
            tokenExpired = false
            tryingNewToken = true
            connect()
            return
        }
        // Otherwise the session (or the next join) goes on with the accepted token, and this one is
        // offered with `renewToken` once joined; if the old one is refused first, this one is tried.
        pendingToken = token
        sendPendingRenewal()
    }

    /// A participant token's user, read without verifying it; nil if it isn't a participant token.
    static func subject(of token: String) -> String? { UnverifiedToken.subject(of: token) }

    private mutating func sendPendingRenewal() {
        guard link == .joined, renewalInFlight == nil, let pendingToken else { return }
        renewalInFlight = pendingToken
        outputs.append(.send(.renewToken(token: pendingToken)))
    }

    /// The server took the renewal in flight: it is the session's token now, and the one to restore.
    private mutating func renewalAccepted() {
        guard let accepted = renewalInFlight, var credentials else { return }
        renewalInFlight = nil
        credentials.token = accepted
        self.credentials = credentials
        if pendingToken == accepted { pendingToken = nil }
        saveRecord()
        sendPendingRenewal()
    }

    /// The server ended the session because its token expired. The channel stays (the server keeps
    /// the membership and the push token, so the device can still be woken): the app renews the token
    /// and the channel comes back.
    private mutating func sessionTokenExpired(_ reason: String, announce: Bool = true) {
        lostConnection()
        failHeldPress("the participant token expired; hand the channel a new one with renewToken to talk again")
        outputs.append(.disconnect)
        link = .down
        tokenExpired = true
        tryingNewToken = false
        updateStatus(.unavailable)
        if announce { outputs.append(.event(.tokenExpired(reason))) }
    }

    // MARK: Push

    /// The delegate's answer to a `pushtotalk` push.
    mutating func pushResult(_ result: PushResult, _ uuid: UUID) {
        guard channel == uuid else { return }
        switch result {
        case .leaveChannel:
            leave(uuid, reason: .developerRequest)
        case .activeRemoteParticipant where tokenExpired:
            // Nothing can be heard until a new token comes: no speaker shown, no audio held.
            outputs.append(.event(.notice("a push says someone is talking, but the participant token expired; renewToken to hear the channel")))
        case .activeRemoteParticipant where link == .joined:
            // A push late from APNs (or held by the server's push schedule) for a burst this joined
            // client already hears live, or that already ended: the live floor state is the truth,
            // and a speaker shown from the push would stay after the burst's `ended`, which clears
            // only live talkers.
            break
        case .activeRemoteParticipant(let participant):
            showRemote(participant)
            if link == .suspended || link == .down { connect() }  // not while the token is expired: see `connect`
        }
    }

    mutating func pushTokenIssued(_ token: Data, for uuid: UUID) {
        guard channel == uuid, pushToken != token else { return }
        pushToken = token
        // On disk before the app hears of it: a crash right after the callback still restores this token.
        saveRecord()
        emit(.receivedPushToken(token))
        if link == .joined { registerToken() }
    }

    // MARK: Subscriptions

    /// The app's strategy decided for these users (by id); sends the server the new list if it changed.
    mutating func applySubscriptions(_ decisions: [String: SubscribeType]) {
        strategyDecisions = decisions
        unheard = Set(decisions.compactMap { $0.value == .none ? $0.key : nil })
        sendSubscriptionsIfChanged()
        outputs.append(.event(.roster(rosterEntries)))
    }

    var rosterEntries: [RosterEntry] {
        roster.values.sorted { $0.slot < $1.slot }.map { p in
            RosterEntry(userID: p.userID, name: p.name, role: p.role, priority: p.priority, canTalk: p.canTalk,
                        canListen: p.canListen, connection: p.connection, talking: p.talking, muted: p.muted,
                        subscribe: unheard.contains(p.userID) ? .none : .audio, isLocal: p.slot == you, slot: p.slot)
        }
    }

    /// Users whose decision is unknown (new since the last evaluation).
    var undecidedEntries: [RosterEntry] { rosterEntries.filter { strategyDecisions[$0.userID] == nil && !$0.isLocal } }
    var decisions: [String: SubscribeType] { strategyDecisions }

    // MARK: Transport

    mutating func transportConnected() {
        serverAway = false
        guard link == .connecting, let channel, let credentials else { return }
        link = .joining
        outputs.append(.send(.join(token: credentials.token, channel: channel,
                                   reason: joinReported ? .developerRequest : (joinReason == .channelRestoration ? .channelRestoration : .developerRequest))))
    }

    /// The handshake failed or the connection ended for good.
    mutating func transportFailed(_ message: String, serverWentAway: Bool = false) {
        // A server that said it was going away: later failures (no answer while it restarts) say so
        // too, or its own notice would be replaced at once by "no answer … check that it runs".
        if serverWentAway { serverAway = true }
        let message = serverAway && !serverWentAway ? "squelchd went away (shutting down) and is not back yet: \(message)" : message
        guard let channel, link != .suspended, link != .down else { return }
        if !joinReported && joinReason == .developerRequest {
            // The first join never got through: it failed, and the channel is not active.
            failHeldPress("the channel could not be joined: \(message)")
            emit(.failedToJoin(channel, ChannelError(.unknown, message)))
            updateStatus(.unavailable)
            outputs.append(.flushPlayback)  // taking audio since the connection opened
            reset()
            outputs.append(.forgetRestoration)
            return
        }
        // A channel the user is in (joined before, or restored after a restart, perhaps before the
        // network is up) is not given up: it waits and tries again, backing off to 30 s.
        lostConnection()
        link = .down
        updateStatus(.unavailable)
        outputs.append(.event(.notice(message)))
        scheduleReconnect()
    }

    private mutating func scheduleReconnect() {
        let delay = Backoff.milliseconds(first: 500, failuresBefore: reconnectAttempts, ceiling: 30_000)
        reconnectAttempts += 1
        outputs.append(.scheduleReconnect(milliseconds: delay))
    }

    /// The backoff after a failed connection is over.
    mutating func reconnectDue() {
        guard channel != nil, link == .down else { return }
        connect()
    }

    /// The server stopped answering (nothing came back for the transport's stall timeout, 3 s), or
    /// answers again. The connection is kept: the liveness verdict comes later, and a server that was
    /// only slow carries on with no new join. Meanwhile the channel shows `connecting`, a floor
    /// request still waiting for its answer fails (MCPTT's T101 × C101: a user holding the button
    /// learns in seconds that nobody hears), and a new one is refused until the server is back. A
    /// burst already granted goes on: its audio reaches the server if the path was only slow.
    mutating func transportStalled(_ value: Bool) {
        guard let channel, link == .joined || link == .joining else {
            stalled = false
            return
        }
        guard value != stalled else { return }
        stalled = value
        if value, link == .joining, case .requesting = transmit {
            // A wake to talk whose join got no answer: the request was never sent, so there is
            // nothing to withdraw, only the user to tell.
            transmit = .idle
            emit(.failedToBegin(channel, ChannelError(.transmissionNotAllowed, "squelchd did not answer the join; the connection may be down")))
        }
        guard link == .joined else { return }
        if value {
            if case .requesting = transmit {
                // Withdrawn, in case the answer was only late: a grant that arrives after this is
                // released by the server rather than held by a user who has already given up.
                withdrawRequest(ChannelError(.transmissionNotAllowed, "squelchd did not answer the floor request; the connection may be down"))
            }
            updateStatus(.connecting)
            outputs.append(.event(.notice("squelchd stopped answering; waiting for it, and until it is back nobody hears this channel")))
        } else {
            updateStatus(serverStatus)
        }
    }

    /// The transport lost the connection and is handshaking again by itself.
    mutating func transportReconnecting() {
        guard channel != nil, link == .joined || link == .joining else { return }
        lostConnection()
        link = .connecting
        updateStatus(.connecting)
    }

    mutating func received(_ message: ServerMessage) {
        guard let channel else { return }
        switch message {
        case .joined(let info, let slot, let participants, let talkers, let features):
            guard link == .joining else { return }
            link = .joined
            reconnectAttempts = 0
            serverInfo = info
            you = slot
            roster = Dictionary(participants.map { ($0.slot, $0) }, uniquingKeysWith: { $1 })
            remoteTalkers = [:]
            serverStatus = .ready
            updateStatus(.ready)
            // The server keeps neither figure across sessions: the talker side starts at 0 again, and
            // this member's own figure goes out at once if it matters.
            reportedLoss = 0
            reportsRefused = !features.contains(.receptionReport)
            setListenerLoss(0)
            if measuredLoss >= 2 { receptionMeasured(measuredLoss) }
            if tryingNewToken {
                // The token tried after the last one ran out works: it is the one to restore (a first
                // join saves it below anyway).
                tryingNewToken = false
                if joinReported { saveRecord() }
            }
            if !joinReported {
                joinReported = true
                saveRecord()
                emit(.didJoin(channel, joinReason))
            }
            outputs.append(.event(.channelInfo(info)))
            outputs.append(.event(.transmissionMode(transmissionMode)))
            if pushToken == nil { outputs.append(.requestPushToken(channel)) } else { registerToken() }
            if (roster[slot]?.muted ?? false) != muted { outputs.append(.send(.setMuted(muted))) }
            unheardSent = nil
            sendSubscriptionsIfChanged()
            outputs.append(.event(.roster(rosterEntries)))
            for talker in talkers where talker.slot != slot { remoteTalkStarted(slot: talker.slot, burst: talker.burst) }
            // A speaker shown from a push, whose burst ended before this join: nobody is talking now,
            // unless the server's replay of that burst is already playing.
            if remoteTalkers.keys.allSatisfy({ unheardSlot($0) }) { showLiveOrReplayed() }
            // This member held the floor when the connection dropped and is back within the grace
            // period, so the server kept its burst going; the transmission ended here with the
            // connection, so the floor goes back at once rather than staying held in silence until
            // the maximum burst length. A press made meanwhile asks after it, for a burst of its own.
            if talkers.contains(where: { $0.slot == slot }) { outputs.append(.send(.floorRelease)) }
            if case .requesting = transmit { outputs.append(.send(.floorRequest(request: floorRequestNumber, queue: waitsForFloor))) }
            // A renewal in flight died with the old connection; the newest token is offered again.
            renewalInFlight = nil
            sendPendingRenewal()
        case .roster(let more):
            let mode = transmissionMode
            for p in more { roster[p.slot] = p }
            entriesArrived(more, modeBefore: mode)
        case .refused(let code, let reason):
            refused(code, reason)
        case .participant(let p):
            let mode = transmissionMode
            roster[p.slot] = p
            entriesArrived([p], modeBefore: mode)
        case .participantLeft(let slot, _):
            roster[slot] = nil
            if remoteTalkers[slot] != nil { remoteTalkEnded(slot: slot) }
            outputs.append(.event(.roster(rosterEntries)))
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
        case .error(let code, let reason) where renewalInFlight != nil && (code.isTokenProblem || code == .internalError):
            // The answer to the renewal in flight. A token the server could not check (its database
            // failed) stays pending: it is offered again after a reconnect, or tried if the old one
            // runs out first. A refused one is dropped.
            let refused = renewalInFlight
            renewalInFlight = nil
            if code != .internalError, pendingToken == refused { pendingToken = nil }
            outputs.append(.event(.tokenRenewalFailed(code, reason)))
            if pendingToken != refused { sendPendingRenewal() }
        case .error(.rateLimited, let reason):
            // The server dropped some of what was sent, and says so at most once a second, not which.
            // What the server must know is said again once the budget has refilled.
            if !resyncScheduled {
                resyncScheduled = true
                outputs.append(.scheduleResync(milliseconds: 1_500))
            }
            outputs.append(.event(.notice("server: \(reason)")))
        case .error(_, let reason):
            outputs.append(.event(.notice("server: \(reason)")))
        case .tokenExpiring(let expiresAt):
            outputs.append(.event(.tokenExpiring(expiresAt)))
        case .tokenRenewed(let expiresAt):
            renewalAccepted()
            outputs.append(.event(.tokenRenewed(expiresAt)))
        case .receptionLoss(let percent):
            setListenerLoss(percent)
        }
    }

    /// The receiver finished a window of heard audio, `percent` of it missing on arrival. The server
    /// hears of it when it moved by 2 points or more (or came back to 0), so a steady link costs no
    /// messages and a noisy one at most one per window.
    mutating func receptionMeasured(_ percent: Int) {
        measuredLoss = percent
        guard link == .joined, !reportsRefused, percent != reportedLoss,
              abs(percent - reportedLoss) >= 2 || percent == 0 else { return }
        reportedLoss = percent
        outputs.append(.send(.receptionReport(lossPercent: percent)))
    }

    /// `announce`: tell the app too. Not when the channel is left: nobody is listening then.
    private mutating func setListenerLoss(_ percent: Int, announce: Bool = true) {
        guard percent != listenerLoss else { return }
        listenerLoss = percent
        outputs.append(.adaptToListenerLoss(percent))
        if announce { outputs.append(.event(.listenerLoss(percent))) }
    }

    // MARK: Internals

    private mutating func connect() {
        // With an expired token every join would be refused; a push or a transmit request waits for
        // the app's new token (`renewToken`).
        guard let credentials, !tokenExpired else { return }
        link = .connecting
        updateStatus(.connecting)
        outputs.append(.connect(credentials))
    }

    private mutating func floor(_ event: FloorEvent) {
        guard let channel else { return }
        if event.kind == .granted || event.kind == .queued || event.kind == .denied {
            // The answer to a request already withdrawn, whose release went to the server after it
            // (or whose connection is gone): nothing to do. Told by its number, or, from a server
            // that doesn't number its answers, by counting.
            if let request = event.request {
                serverNumbersAnswers = true
                owedFloorAnswers = 0
                guard request == floorRequestNumber, transmit != .idle else { return }
            } else if owedFloorAnswers > 0 {
                owedFloorAnswers -= 1
                return
            }
        }
        switch event.kind {
        case .granted:
            guard let burst = event.burst else { return }
            switch transmit {
            case .requesting(let source), .queued(let source, _):
                if transmissionMode == .halfDuplex { clearRemote() }
                transmit = .active(source, burst: burst)
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
        case .denied:
            guard transmit != .idle else { return }
            transmit = .idle
            emit(.failedToBegin(channel, Self.error(for: event)))
        case .queued:
            switch transmit {
            case .requesting(let source), .queued(let source, _):
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
            for slot in Array(remoteTalkers.keys) { remoteTalkEnded(slot: slot) }
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

    private mutating func remoteTalkStarted(slot: UInt16, burst: UInt16) {
        remoteTalkers[slot] = burst
        guard !unheardSlot(slot) else { return }
        let name = roster[slot]?.name ?? Self.placeholderName(slot)
        if let participant = try? Participant(name: name.isEmpty ? Self.placeholderName(slot) : name) {
            if case .active = transmit, transmissionMode == .halfDuplex { return }
            showRemote(participant)
        }
    }

    private mutating func remoteTalkEnded(slot: UInt16) {
        guard remoteTalkers.removeValue(forKey: slot) != nil else { return }
        showLiveOrReplayed()
    }

    /// Shows a live talker this member hears, else the talker of the replay playing, else nobody.
    private mutating func showLiveOrReplayed() {
        let audible = remoteTalkers.keys.filter { !unheardSlot($0) }
        if let next = audible.first, let name = roster[next]?.name, let participant = try? Participant(name: name) {
            showRemote(participant)
        } else if let replaySpeaker, !unheardSlot(replaySpeaker), let participant = try? Participant(name: roster[replaySpeaker].map(\.name).flatMap { $0.isEmpty ? nil : $0 }
                                                                        ?? Self.placeholderName(replaySpeaker)) {
            showRemote(participant)
        } else {
            clearRemote()
        }
    }

    /// A replayed burst started playing: one that had ended (what a phone woken by a push hears when it
    /// joined after a short burst), or one still going whose start this member missed. Its talker is
    /// shown while it plays, unless someone is talking live (or this member is, in half duplex): a
    /// live burst's talker is shown already, and stays shown after the floor ends for as long as the
    /// replay is still playing what was said.
    mutating func replayStarted(slot: UInt16, burst: UInt16) {
        guard channel != nil, slot != you, !unheardSlot(slot) else { return }
        replay = (slot, burst)
        if case .active = transmit, transmissionMode == .halfDuplex { return }
        if remoteTalkers.keys.contains(where: { !unheardSlot($0) }) { return }
        showLiveOrReplayed()
    }

    /// A burst finished playing; if it was the replay shown, the speaker goes back to whoever talks live.
    mutating func replayFinished(slot: UInt16, burst: UInt16) {
        guard let replay, replay == (slot, burst) else { return }
        endReplay()
    }

    /// No replay plays any more: the speaker goes back to whoever talks live, if anyone.
    private mutating func endReplay() {
        replay = nil
        if case .active = transmit, transmissionMode == .halfDuplex { return }
        showLiveOrReplayed()
    }

    /// Roster entries arrived (a chunk, or a `participant`). The mode follows this member's own entry
    /// (a renewed token may take `talk` away, and in a big channel the entry may come after `joined`).
    /// A talker announced before its entry (a big roster still coming in) gets its name shown, or
    /// stops being shown if it turns out to be a user this member does not hear.
    private mutating func entriesArrived(_ entries: [ChannelProtocol.Participant], modeBefore: TransmissionMode) {
        outputs.append(.event(.roster(rosterEntries)))
        if transmissionMode != modeBefore { outputs.append(.event(.transmissionMode(transmissionMode))) }
        if let replaySpeaker, entries.contains(where: { $0.slot == replaySpeaker }),
           activeRemoteParticipant?.name == Self.placeholderName(replaySpeaker) {
            showLiveOrReplayed()
        }
        for entry in entries where remoteTalkers[entry.slot] != nil {
            if unheardSlot(entry.slot) {
                remoteTalkEnded(slot: entry.slot)
            } else if activeRemoteParticipant?.name == Self.placeholderName(entry.slot), !entry.name.isEmpty,
                      let participant = try? Participant(name: entry.name) {
                showRemote(participant)
            }
        }
    }

    /// What a talker is called until its roster entry arrives.
    static func placeholderName(_ slot: UInt16) -> String { "member \(slot)" }

    private func unheardSlot(_ slot: UInt16) -> Bool {
        guard let user = roster[slot]?.userID else { return false }
        return unheard.contains(user)
    }

    private mutating func showRemote(_ participant: Participant?) {
        guard participant != activeRemoteParticipant else { return }
        activeRemoteParticipant = participant
        outputs.append(.event(.activeRemoteParticipant(participant)))
        if participant != nil {
            audio.isReceiving = true
            if !callActive { activateAudio() }
        } else {
            audio.isReceiving = false
            deactivateAudioIfIdle()
        }
    }

    private mutating func clearRemote() { showRemote(nil) }

    private mutating func activateAudio() {
        guard !audioActive, !callActive else { return }
        audioActive = true
        emit(.didActivate(audio))
    }

    private mutating func deactivateAudioIfIdle(force: Bool = false) {
        guard audioActive else { return }
        if !force && (audio.isTransmitting || audio.isReceiving) { return }
        audioActive = false
        emit(.didDeactivate(audio))
    }

    /// Ends the local transmission: the end marker goes out before the release, so listeners close
    /// the burst at once instead of waiting for a timeout.
    private mutating func endTransmission(source: ChannelTransmitRequestSource, release: Bool) {
        guard let channel, case .active = transmit else { return }
        transmit = .idle
        outputs.append(.stopSending)
        if release && link == .joined { outputs.append(.send(.floorRelease)) }
        emit(.didEndTransmitting(channel, source))
        audio.isTransmitting = false
        // In half duplex a replay that started meanwhile wasn't shown; it is now.
        if activeRemoteParticipant == nil, replaySpeaker != nil { showLiveOrReplayed() }
        deactivateAudioIfIdle()
    }

    /// Withdraws a floor request still waiting for its answer or in the queue, and tells the app:
    /// why its begin failed, or (`nil`: the user let go) that it was cancelled. The release follows
    /// the request on the stream, so the server drops it (or ends the burst it granted meanwhile).
    private mutating func withdrawRequest(_ error: ChannelError?) {
        guard let channel else { return }
        switch transmit {
        case .requesting, .queued: break
        case .idle, .active: return
        }
        if case .requesting = transmit, link == .joined, !serverNumbersAnswers { owedFloorAnswers += 1 }
        transmit = .idle
        if link == .joined { outputs.append(.send(.floorRelease)) }
        if let error { emit(.failedToBegin(channel, error)) } else { outputs.append(.event(.transmitCancelled)) }
    }

    /// What the session knew of the connection it had: a new one starts with none of it.
    private mutating func forgetConnectionState() {
        stalled = false
        serverStatus = .ready
        owedFloorAnswers = 0
        serverNumbersAnswers = false
    }

    /// The connection is gone for now: what depended on it ends.
    private mutating func lostConnection() {
        let sent = link == .joined
        forgetConnectionState()
        if case .active = transmit { endTransmission(source: .unknown, release: false) }
        // A press made while not connected was never sent: it stays held for the next join, or until
        // its wait ends it (`transmitWaitDue`). One sent on this connection dies with it.
        if transmit != .idle, sent {
            // A request in flight dies with the connection; the app hears why.
            if let channel { emit(.failedToBegin(channel, ChannelError(.transmissionNotAllowed, "the connection dropped before the floor was granted"))) }
            transmit = .idle
        }
        for slot in Array(remoteTalkers.keys) { remoteTalkEnded(slot: slot) }
    }

    private mutating func refused(_ code: RefusalCode, _ reason: String) {
        guard let channel else { return }
        // A newer token is waiting (a restored channel whose saved token ran out, a session whose
        // token expired while the new one was being checked): try it before giving up.
        if code.isTokenProblem, let pending = pendingToken, var credentials {
            credentials.token = pending
            self.credentials = credentials
            pendingToken = nil
            renewalInFlight = nil
            tryingNewToken = true
            lostConnection()
            outputs.append(.disconnect)
            link = .down
            connect()
            return
        }
        // A restored channel is one the user is in, though this process has not joined it yet: what
        // would only end a session (a server briefly unable, an expired token) doesn't forget it. The
        // app renews the token (a saved one often runs out while the app is not running), or the
        // connection is tried again; refusals that end the membership still do.
        let inChannel = joinReported || joinReason == .channelRestoration
        // That token, tried after the old one was refused, is refused too: the channel waits for
        // another, as after an expiry, rather than ending.
        if code.isTokenProblem, tryingNewToken, inChannel {
            sessionTokenExpired(reason, announce: false)
            outputs.append(.event(.tokenRenewalFailed(code, reason)))
            return
        }
        // The server could not check the token (its database is failing) or is full: that passes, so
        // a channel the user is in tries again with backoff, as after a failed connection.
        if inChannel, code == .internalError || code == .serverBusy {
            lostConnection()
            outputs.append(.disconnect)
            link = .down
            updateStatus(.unavailable)
            outputs.append(.event(.notice(reason)))
            scheduleReconnect()
            return
        }
        if inChannel, code == .tokenExpired {
            sessionTokenExpired(reason)
            return
        }
        if !joinReported {
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
            return
        }
        if code == .replaced {
            // Another connection of this user joined: a one-shot `walkie talk`, the same account on a
            // second device. Leaving would forget a channel the user is still in (and drop the push
            // token that wakes this device), and joining again at once would replace the other, which
            // would do the same back. So this one steps aside as if suspended: channel, record and
            // push token kept, the service unavailable. A transmit request, or `resume`, takes the
            // channel back; a push does too, where the member's push token is still this device's
            // (the other connection, a one-shot, registered none) and the server sends pushes.
            lostConnection()
            failHeldPress("\(reason); this one stepped aside, talk again to take the channel back")
            link = .suspended
            outputs.append(.disconnect)
            outputs.append(.event(.notice("\(reason): this one stepped aside and keeps the channel; talk to take it back")))
            // Suspended before unavailable: an app reading the status sees why it went.
            outputs.append(.event(.suspended(true)))
            updateStatus(.unavailable)
            return
        }
        outputs.append(.event(.notice(reason)))
        switch code {
        case .removedByAdmin, .channelDeleted, .tokenRevoked: finish(reason: .systemPolicy)
        default: finish(reason: .unknown)
        }
    }

    /// Leaves the channel for good: everything stops, the token dies, the record goes.
    private mutating func finish(reason: ChannelLeaveReason) {
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

    private mutating func reset() {
        channel = nil
        descriptor = nil
        credentials = nil
        link = .down
        transmit = .idle
        activeRemoteParticipant = nil
        replay = nil
        audio = AudioSession(isTransmitting: false, isReceiving: false)
        audioActive = false
        pushToken = nil
        modeOverride = nil
        serverInfo = nil
        you = nil
        roster = [:]
        remoteTalkers = [:]
        joinReported = false
        unheardSent = nil
        serviceStatus = .ready
        forgetConnectionState()
        reconnectAttempts = 0
        tokenExpired = false
        pendingToken = nil
        renewalInFlight = nil
        tryingNewToken = false
        reportedLoss = 0
        measuredLoss = 0
        reportsRefused = false
        setListenerLoss(0, announce: false)
    }

    /// After messages dropped for their rate: the subscriptions, the muted flag (if the server's entry
    /// disagrees), the push token and a token renewal waiting for its answer are sent again. Each is idempotent on the server; a floor request
    /// was answered with `denied` and a release is never dropped, so the floor needs nothing.
    mutating func resyncDue() {
        resyncScheduled = false
        guard link == .joined else { return }  // a new join says everything anyway
        unheardSent = nil
        sendSubscriptionsIfChanged()
        if let you, let own = roster[you], own.muted != muted { outputs.append(.send(.setMuted(muted))) }
        registerToken()
        // A renewal dropped too would block every later one until a reconnect, and the session would
        // end with the old token. A second answer to it is ignored (`renewalAccepted`).
        if renewalInFlight != nil {
            renewalInFlight = nil
            sendPendingRenewal()
        }
    }

    /// Playout stopped (the audio output failed): no replay is playing any more.
    mutating func playbackStopped() {
        guard replay != nil else { return }
        endReplay()
    }

    private mutating func registerToken() {
        guard let pushToken else { return }
        outputs.append(.send(.registerPushToken(token: pushToken.map { String(format: "%02x", $0) }.joined(), environment: pushEnvironment)))
    }

    private mutating func sendSubscriptionsIfChanged() {
        guard link == .joined, unheardSent != unheard else { return }
        unheardSent = unheard
        outputs.append(.send(.setSubscriptions(unheard: unheard.sorted())))
        // A talker just unsubscribed from stops being the active speaker.
        for (slot, _) in remoteTalkers where unheardSlot(slot) { remoteTalkEnded(slot: slot) }
    }

    private mutating func saveRecord() {
        guard let channel, let descriptor, let credentials else { return }
        outputs.append(.save(RestorationRecord(channel: channel, descriptor: descriptor, credentials: credentials,
                                               pushToken: pushToken.map { Array($0) })))
    }

    private mutating func updateStatus(_ status: ServiceStatus) {
        guard status != serviceStatus else { return }
        serviceStatus = status
        outputs.append(.event(.serviceStatus(status)))
    }

    private mutating func emit(_ call: DelegateCall) { outputs.append(.delegate(call)) }
}

extension ServiceStatus {
    init(_ status: ChannelProtocol.ServiceStatus) {
        switch status {
        case .ready: self = .ready
        case .connecting: self = .connecting
        case .unavailable: self = .unavailable
        }
    }
}
