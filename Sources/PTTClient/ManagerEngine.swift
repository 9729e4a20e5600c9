import Audio
import ChannelProtocol
import Foundation
import JitterBuffer
import NIOConcurrencyHelpers
import NIOCore
import Wire
import WireNIO

/// Carries out what `ChannelSession` decides: one task takes commands in order, feeds the session,
/// and performs its outputs (delegate calls, the voice connection, the media threads, the push
/// transport, the restoration file). Everything that arrives from elsewhere (server messages,
/// transport events, pushes) comes back in as a command, so the session sees one ordered stream.
actor ManagerEngine {
    enum Command: Sendable {
        case join(UUID, ChannelDescriptor, ChannelCredentials)
        case restore(RestorationRecord, ChannelDescriptor)
        case leave(UUID)
        case begin(UUID, ChannelTransmitRequestSource)
        case stop(UUID, ChannelTransmitRequestSource)
        case appState(AppState)
        case systemCall(Bool)
        case accessory(Bool, UUID)
        case suspend
        case resume
        case setter(@Sendable (inout ChannelSession) throws(ChannelError) -> Void, CheckedContinuation<Void, any Error>)
        case strategy(any SubscriptionStrategy)
        case refreshStrategy
        case transportConnected(Int)
        /// The connection failed or closed: what to tell the user, and whether squelchd said it was
        /// going away (shutting down for a restart or an upgrade) as it closed.
        case transportFailed(Int, String, serverWentAway: Bool = false)
        case transportReconnecting(Int)
        /// The server stopped answering (`ConnectionEvent.stalled`), or answers again.
        case transportStalled(Int, Bool)
        case server(Int, ServerMessage)
        case pushToken(Data, UUID)
        case push(IncomingPush)
        case inputEnded(burst: UInt16)
        case notice(String)
        case reconnectDue
        case resyncDue
        case transmitWaitDue(UInt32)
        case playbackStopped
        case playbackMuted(Bool)
        case receptionMeasured(Int)
        /// A replayed burst (one that ended before this member heard it) started or stopped playing.
        case replayPlaying(slot: UInt16, burst: UInt16, playing: Bool)
        /// The delivery of an owed leave ended (`id` tells it from a newer one for the same channel).
        case leaveSettled(UUID, id: Int, OwedLeaveOutcome)
    }

    let configuration: ChannelManagerConfiguration
    let store: RestorationStore
    weak var delegate: (any ChannelManagerDelegate)?
    weak var restorationDelegate: (any ChannelRestorationDelegate)?
    weak var manager: ChannelManager?
    let eventSink: AsyncStream<ChannelManagerEvent>.Continuation
    let snapshot: NIOLockedValueBox<ChannelManager.Snapshot>
    nonisolated let commands: AsyncStream<Command>
    nonisolated let commandSink: AsyncStream<Command>.Continuation

    var session = ChannelSession()
    var strategy: any SubscriptionStrategy
    var serviceBudget = ServiceUpdateBudget()
    var processor: Task<Void, Never>?

    // The voice connection of the moment; `generation` tells its events from a closed one's.
    var client: WireClientChannel?
    var generation = 0
    var connectionTasks: [Task<Void, Never>] = []

    /// Leaves the server has not heard yet, by channel, with the task delivering each.
    var owedLeaves: [UUID: (leave: OwedLeave, id: Int, task: Task<Void, Never>)] = [:]
    var nextLeaveID = 0

    var pushTask: Task<Void, Never>?
    var reconnectTask: Task<Void, Never>?
    var playbackMuted = false
    var pushToken: Data?

    let transmitter: Transmitter
    let receiver: Receiver

    init(configuration: ChannelManagerConfiguration, store: RestorationStore, delegate: any ChannelManagerDelegate,
         restorationDelegate: any ChannelRestorationDelegate, events: AsyncStream<ChannelManagerEvent>.Continuation,
         snapshot: NIOLockedValueBox<ChannelManager.Snapshot>) {
        self.configuration = configuration
        self.store = store
        self.delegate = delegate
        self.restorationDelegate = restorationDelegate
        eventSink = events
        self.snapshot = snapshot
        strategy = configuration.subscriptionStrategy
        (commands, commandSink) = AsyncStream.makeStream(of: Command.self)
        let sink = commandSink
        let eventSink = events
        transmitter = Transmitter(configuration: configuration.audio) { event in
            switch event {
            case .inputEnded(let burst): sink.yield(.inputEnded(burst: burst))
            case .inputFailed(let message): sink.yield(.notice(message))
            }
        }
        receiver = Receiver(configuration: configuration.audio) { event in
            switch event {
            case .burstStarted(let slot, let burst, let replayed):
                if replayed { sink.yield(.replayPlaying(slot: slot, burst: burst, playing: true)) }
            case .burstFinished(let statistics):
                eventSink.yield(.burstFinished(statistics))
                sink.yield(.replayPlaying(slot: statistics.slot, burst: statistics.burst, playing: false))
            case .receptionLoss(let percent): sink.yield(.receptionMeasured(percent))
            case .outputFailed(let message):
                eventSink.yield(.outputFailed(message))
                sink.yield(.notice(message))
                sink.yield(.playbackStopped)
            }
        }
        session.pushEnvironment = configuration.pushTransport?.environment ?? .sandbox
        session.waitsForFloor = configuration.waitsForFloor
    }

    nonisolated func submit(_ command: Command) { commandSink.yield(command) }

    func set(_ body: @escaping @Sendable (inout ChannelSession) throws(ChannelError) -> Void) async throws(ChannelError) {
        do {
            try await withCheckedThrowingContinuation { continuation in
                // After `invalidate` the stream takes nothing: the setter fails rather than waiting
                // for ever (a dropped command's continuation would never be resumed).
                if case .terminated = commandSink.yield(.setter(body, continuation)) {
                    continuation.resume(throwing: ChannelError(.unknown, "the channel manager was invalidated; make a new one"))
                }
            }
        } catch let error as ChannelError {
            throw error
        } catch {
            throw ChannelError(.unknown, "\(error)")
        }
    }

    /// Restores the saved channel, if any (so that `activeChannelUUID` is set when the factory
    /// returns, as on iOS), then starts the command loop.
    func start(manager: ChannelManager) async {
        self.manager = manager
        defer {
            processor = Task { [commands] in
                for await command in commands { await self.handle(command) }
            }
        }
        do {
            for leave in try store.loadOwedLeaves() { startLeaveDelivery(leave) }
        } catch {
            eventSink.yield(.notice(error.description))
        }
        do {
            guard let record = try store.load() else { return }
            let descriptor = record.descriptor ?? restorationDelegate?.channelDescriptor(restoredChannelUUID: record.channel)
                ?? ChannelDescriptor(name: "Channel")
            await handle(.restore(record, descriptor))
        } catch {
            snapshot.withLockedValue { $0.restorationError = error }
            eventSink.yield(.notice(error.description))
        }
    }

    func shutdown() async {
        commandSink.finish()
        // The commands already queued run to their end for a moment: a leave waiting for its
        // acknowledgement (`closeConnection`) is what an app that leaves and exits needs finished.
        if let processor {
            await withTaskGroup(of: Void.self) { group in
                group.addTask { await processor.value }
                group.addTask { try? await Task.sleep(for: .seconds(2)) }
                await group.next()
                processor.cancel()
                group.cancelAll()
            }
        }
        await transmitter.stop()
        await receiver.stop()
        // Deliveries under way stop here; the file keeps them for the next start.
        for owed in owedLeaves.values { owed.task.cancel() }
        owedLeaves = [:]
        pushTask?.cancel()
        reconnectTask?.cancel()
        await closeConnection()
        eventSink.finish()
    }

    // MARK: Commands

    func handle(_ command: Command) async {
        switch command {
        case .join(let uuid, let descriptor, let credentials):
            session.requestJoin(uuid, descriptor: descriptor, credentials: credentials, reason: .developerRequest)
            if session.channel == uuid { settleLeave(uuid, id: nil, .superseded) }
        case .restore(let record, let descriptor):
            let token = record.pushToken.map { Data($0) }
            session.requestJoin(record.channel, descriptor: descriptor, credentials: record.credentials, reason: .channelRestoration,
                                pushToken: token)
            // The device keeps the token it had: pushes sent while the app was dead still reach it.
            if let token, session.channel == record.channel { startPushes(token: token, channel: record.channel) }
            if session.channel == record.channel { settleLeave(record.channel, id: nil, .superseded) }
        case .leave(let uuid): session.leave(uuid)
        case .begin(let uuid, let source): session.beginTransmitting(uuid, source: source)
        case .stop(let uuid, let source): session.stopTransmitting(uuid, source: source)
        case .appState(let state): session.setAppState(state)
        case .systemCall(let active): session.setSystemCall(active: active)
        case .accessory(let pressed, let uuid): session.accessoryButton(pressed: pressed, uuid)
        case .suspend: session.suspend()
        case .resume: session.resume()
        case .setter(let body, let continuation):
            do {
                try body(&session)
                await perform()
                continuation.resume()
            } catch {
                await perform()
                continuation.resume(throwing: error)
            }
            return
        case .strategy(let strategy):
            self.strategy = strategy
            evaluateStrategy(all: true)
        case .refreshStrategy:
            evaluateStrategy(all: true)
        case .transportConnected(let g):
            guard g == generation else { return }
            session.transportConnected()
        case .transportFailed(let g, let message, let serverWentAway):
            guard g == generation else { return }
            session.transportFailed(message, serverWentAway: serverWentAway)
        case .transportReconnecting(let g):
            guard g == generation else { return }
            session.transportReconnecting()
        case .transportStalled(let g, let stalled):
            guard g == generation else { return }
            session.transportStalled(stalled)
        case .server(let g, let message):
            guard g == generation else { return }
            session.received(message)
            switch message {
            case .joined, .participant, .roster: evaluateStrategy(all: false)
            default: break
            }
        case .pushToken(let token, let uuid):
            session.pushTokenIssued(token, for: uuid)
        case .push(let push):
            handlePush(push)
        case .inputEnded(let burst):
            // Only the transmission the input was feeding: by now the app may have stopped it and
            // begun another, whose input is fresh.
            if configuration.audio.endTransmissionWhenInputEnds, let channel = session.channel,
               case .active(let source, burst) = session.transmit {
                session.stopTransmitting(channel, source: source)
            }
            eventSink.yield(.inputEnded)
        case .notice(let message):
            eventSink.yield(.notice(message))
        case .reconnectDue:
            session.reconnectDue()
        case .resyncDue:
            session.resyncDue()
        case .transmitWaitDue(let request):
            session.transmitWaitDue(request: request)
        case .playbackStopped:
            session.playbackStopped()
        case .playbackMuted(let muted):
            playbackMuted = muted
            receiver.setMuted(muted || session.callActive)
            session.setMuted(muted)
        case .receptionMeasured(let percent):
            session.receptionMeasured(percent)
        case .replayPlaying(let slot, let burst, let playing):
            if playing { session.replayStarted(slot: slot, burst: burst) } else { session.replayFinished(slot: slot, burst: burst) }
        case .leaveSettled(let channel, let id, let outcome):
            settleLeave(channel, id: id, outcome)
        }
        await perform()
    }

    func evaluateStrategy(all: Bool) {
        let entries = all ? session.rosterEntries.filter { !$0.isLocal } : session.undecidedEntries
        guard !entries.isEmpty || all else { return }
        var decisions = all ? [:] : session.decisions
        for entry in entries { decisions[entry.userID] = strategy.subscribeType(for: entry) }
        if decisions != session.decisions || all { session.applySubscriptions(decisions) }
    }

    func handlePush(_ push: IncomingPush) {
        // No channel, no wake: iOS drops pushtotalk pushes that arrive without an active channel.
        guard let channel = session.channel, let manager, let delegate else { return }
        // A push that names another channel was sent for one this device has left (it waited in
        // APNs, or in the command queue while the app left and joined another): answered now, its
        // speaker would show, or its leave be obeyed, in the wrong channel.
        if case .string(let named)? = push.payload["channel"], let other = UUID(uuidString: named), other != channel {
            eventSink.yield(.notice("ignored a push for channel \(other), which this device has left"))
            return
        }
        if push.isServiceUpdate {
            let remaining = serviceBudget.spend(highPriority: push.isHighPriority, at: push.receivedAt)
            delegate.incomingServiceUpdatePush(channelManager: manager, channelUUID: channel, pushPayload: push.payload,
                                               isHighPriority: push.isHighPriority, remainingHighPriorityBudget: remaining,
                                               completion: {})
            return
        }
        let result = delegate.incomingPushResult(channelManager: manager, channelUUID: channel, pushPayload: push.payload)
        session.pushResult(result, channel)
    }

    // MARK: Outputs

    func perform() async {
        // The snapshot is current before any delegate call, so a delegate (or a test) reading the
        // manager's state from inside a callback sees what caused it.
        updateSnapshot()
        while true {
            let outputs = session.takeOutputs()
            if outputs.isEmpty { break }
            for output in outputs { await perform(output) }
        }
        // A channel that ended without a push token to invalidate (none was issued yet, or a
        // restored one was refused) still stops its push task.
        if session.channel == nil, pushTask != nil { stopPushes() }
        updateSnapshot()
    }

    func updateSnapshot() {
        let s = session
        snapshot.withLockedValue { snap in
            snap.activeChannelUUID = s.channel
            snap.serviceStatus = s.serviceStatus
            snap.transmissionMode = s.transmissionMode
            snap.activeRemoteParticipant = s.activeRemoteParticipant
            snap.roster = s.rosterEntries
            if case .active = s.transmit { snap.isTransmitting = true } else { snap.isTransmitting = false }
            snap.isSuspended = s.link == .suspended
            snap.isJoined = s.link == .joined
            snap.tokenExpired = s.tokenExpired
            snap.channelInfo = s.serverInfo
        }
    }

    func perform(_ output: SessionOutput) async {
        switch output {
        case .delegate(let call):
            deliver(call)
        case .connect(let credentials):
            // Audio is taken before the join is answered: the server's catch-up of a burst in progress
            // follows `joined` at once (25 packets, then 10 every 10 ms). Taken only from `didJoin`,
            // after the event and command hops and the restoration record's write, the start of the
            // burst a late joiner came for was lost. The output opens at `didJoin`.
            receiver.arm()
            await openConnection(credentials)
        case .disconnect:
            await closeConnection()
        case .send(let message):
            guard let client else { return }
            do {
                try await client.send(control: MessageCodec().encode(message))
            } catch {
                eventSink.yield(.notice("could not send \(message): \(error)"))
            }
        case .startSending(let burst):
            guard let client else { return }
            transmitter.start(burst: burst, client: client)
        case .stopSending:
            await transmitter.stop()
        case .adaptToListenerLoss(let percent):
            transmitter.setListenerLoss(percent)
        case .mutePlayback(let muted):
            receiver.setMuted(muted || playbackMuted)
        case .flushPlayback:
            await receiver.stop()
            receiver.discardAll()
        case .scheduleReconnect(let milliseconds):
            let sink = commandSink
            reconnectTask?.cancel()
            let wait = Backoff.jittered(milliseconds)
            reconnectTask = Task {
                try? await Task.sleep(for: .milliseconds(wait))
                if !Task.isCancelled { sink.yield(.reconnectDue) }
            }
        case .scheduleTransmitWait(let milliseconds, let request):
            let sink = commandSink
            Task {
                try? await Task.sleep(for: .milliseconds(milliseconds))
                sink.yield(.transmitWaitDue(request))
            }
        case .scheduleResync(let milliseconds):
            let sink = commandSink
            Task {
                try? await Task.sleep(for: .milliseconds(milliseconds))
                sink.yield(.resyncDue)
            }
        case .requestPushToken(let channel):
            startPushes(token: nil, channel: channel)
        case .invalidatePushToken(let token):
            stopPushes()
            if let transport = configuration.pushTransport { await transport.unregister(token: token) }
        case .save(let record):
            do { try store.save(record) } catch { eventSink.yield(.notice(error.description)) }
        case .forgetRestoration:
            store.remove()
        case .oweLeave(let channel, let credentials):
            startLeaveDelivery(OwedLeave(channel: channel, credentials: credentials, leftAt: Date()))
            saveOwedLeaves()
        case .event(let event):
            eventSink.yield(event)
        }
    }

    func deliver(_ call: DelegateCall) {
        guard let delegate, let manager else { return }
        switch call {
        case .didJoin(let uuid, let reason):
            receiver.start()
            delegate.channelManager(manager, didJoinChannel: uuid, reason: reason)
        case .didLeave(let uuid, let reason): delegate.channelManager(manager, didLeaveChannel: uuid, reason: reason)
        case .didBeginTransmitting(let uuid, let source): delegate.channelManager(manager, channelUUID: uuid, didBeginTransmittingFrom: source)
        case .didEndTransmitting(let uuid, let source): delegate.channelManager(manager, channelUUID: uuid, didEndTransmittingFrom: source)
        case .receivedPushToken(let token): delegate.channelManager(manager, receivedEphemeralPushToken: token)
        case .didActivate(let audio): delegate.channelManager(manager, didActivate: audio)
        case .didDeactivate(let audio): delegate.channelManager(manager, didDeactivate: audio)
        case .failedToJoin(let uuid, let error): delegate.channelManager(manager, failedToJoinChannel: uuid, error: error)
        case .failedToLeave(let uuid, let error): delegate.channelManager(manager, failedToLeaveChannel: uuid, error: error)
        case .failedToBegin(let uuid, let error): delegate.channelManager(manager, failedToBeginTransmittingInChannel: uuid, error: error)
        case .failedToStop(let uuid, let error): delegate.channelManager(manager, failedToStopTransmittingInChannel: uuid, error: error)
        }
    }

    // MARK: Connection

    func openConnection(_ credentials: ChannelCredentials) async {
        // A connection replaced by a new one closes as going away, not normally: squelchd shows a
        // member whose client closed normally offline at once and gives its floor away, while this
        // one is back in a moment (its grace period covers that).
        await closeConnection(code: .goingAway)
        generation += 1
        let g = generation
        let sink = commandSink
        let client: WireClientChannel
        // Audio goes from the event loop straight into the jitter buffer, stamped as it arrives,
        // rather than through a task that a busy thread pool (or a delegate blocking one of its
        // threads) can hold back past the buffer's patience.
        let receiver = self.receiver
        do throws(SetupProblem) {
            client = try Self.makeClient(credentials, connection: configuration.connection, onDatagram: { bytes in receiver.receive(bytes) })
        } catch {
            sink.yield(.transportFailed(g, error.message))
            return
        }
        self.client = client
        let codec = MessageCodec()
        connectionTasks = [
            Task {
                for await event in client.events {
                    switch event {
                    case .connection(.control(let bytes)):
                        if let message = try? codec.decodeServerMessage(bytes) { sink.yield(.server(g, message)) }
                    case .reconnecting:
                        sink.yield(.transportReconnecting(g))
                    case .connection(.connected):
                        sink.yield(.transportConnected(g))
                    case .connection(.stalled):
                        sink.yield(.transportStalled(g, true))
                    case .connection(.stallEnded):
                        sink.yield(.transportStalled(g, false))
                    case .connection(.closed(let error)) where error.clientReconnects:
                        // The client is already handshaking again; `.reconnecting` comes next and says
                        // so. Taking this for a failure would mark the channel unavailable and open a
                        // second connection after the backoff.
                        break
                    case .connection(.closed(let error)):
                        sink.yield(.transportFailed(g, Self.describe(error, credentials), serverWentAway: Self.isGoingAway(error)))
                    default:
                        break
                    }
                }
            },
            Task {
                do {
                    try await client.connect()
                } catch {
                    sink.yield(.transportFailed(g, Self.describe(error, credentials)))
                }
            },
        ]
    }

    func closeConnection(code: CloseCode = .normal) async {
        guard let client else { return }
        self.client = nil
        generation += 1
        let tasks = connectionTasks
        connectionTasks = []
        await Self.waitUntilControlAcknowledged(client, atMost: .milliseconds(1_500))
        await client.close(code: code.rawValue, reason: code == .normal ? "client closed" : "client reconnecting")
        for task in tasks { task.cancel() }
    }

    /// Waits, at most `limit`, until the server has acknowledged everything sent on the control
    /// stream. A closing connection sends nothing but CONNECTION_CLOSE, so a `leave` (or the
    /// `floorRelease` before a suspend) lost on the way would be lost for good: the server would take
    /// the close for a dropped connection and keep the member, and its push token, in the channel.
    /// Returns at once when nothing waits or the connection is no longer up.
    static func waitUntilControlAcknowledged(_ client: WireClientChannel, atMost limit: Duration) async {
        let deadline = ContinuousClock.now + limit
        while ContinuousClock.now < deadline, !Task.isCancelled {
            let waiting = (try? await client.withClient { client -> Bool in
                guard let connection = client?.connection, connection.state == .established else { return false }
                return connection.controlSendSpace < connection.controlSendLimit
            }) ?? false
            guard waiting else { return }
            try? await Task.sleep(for: .milliseconds(10))
        }
    }

    static func describeSetup(_ error: any Error, _ credentials: ChannelCredentials) -> String {
        "can't reach \(credentials.address): \(error); check the server address"
    }

    /// Why no client could be made, in words: the CA file, or the address.
    struct SetupProblem: Error { var message: String }

    /// A client for the server `credentials` name, not yet connected: the session's, or an owed
    /// leave's. Fails with what to fix: a CA file that can't be used, an address that doesn't resolve.
    static func makeClient(_ credentials: ChannelCredentials, connection: ConnectionConfiguration,
                           onDatagram: @escaping WireClientChannel.DatagramHandler) throws(SetupProblem) -> WireClientChannel {
        let validator = try loadCA(credentials.caPath)
        do {
            var clientConfiguration = ClientConfiguration(serverName: credentials.serverName ?? credentials.host, validator: validator)
            clientConfiguration.connection = connection
            let address = try SocketAddress.makeAddressResolvingHost(credentials.host, port: credentials.port)
            return try WireClientChannel(configuration: clientConfiguration, server: address, onDatagram: onDatagram)
        } catch {
            throw SetupProblem(message: describeSetup(error, credentials))
        }
    }

    /// The CA certificates in `path`, or what is wrong with the file in words: missing, a directory,
    /// not readable, not text, or text without a certificate.
    static func loadCA(_ path: String) throws(SetupProblem) -> CertificateValidator {
        let advice = "pass the CA that signed the server's certificate (certs/ca.pem in development)"
        let pem: String
        do throws(PEMText.Problem) { pem = try PEMText.read(path) } catch {
            switch error {
            case .missing: throw SetupProblem(message: "the CA file \(path) does not exist; \(advice)")
            case .directory: throw SetupProblem(message: "the CA file \(path) is a directory; \(advice)")
            case .unreadable: throw SetupProblem(message: "can't read the CA file \(path) (check its permissions); \(advice)")
            case .notText: throw SetupProblem(message: "the CA file \(path) is not a PEM certificate (it isn't text); \(advice)")
            }
        }
        do { return try CertificateValidator(caPEM: pem) } catch {
            throw SetupProblem(message: "the CA file \(path) holds no readable CA certificate (\(error)); \(advice)")
        }
    }

    /// squelchd closed saying it is going away: it is shutting down (SIGTERM, a restart, an upgrade).
    static func isGoingAway(_ error: ConnectionError) -> Bool {
        if case .peer(let code, _, true) = error { return code == CloseCode.goingAway.rawValue }
        return false
    }

    static func describe(_ error: any Error, _ credentials: ChannelCredentials) -> String {
        let server = credentials.address
        if let error = error as? ConnectionError {
            if isGoingAway(error), case .peer(_, let reason, _) = error {
                return "squelchd at \(server) is going away (\(reason.isEmpty ? "shutting down" : reason)): a restart or an upgrade, most likely; reconnecting on its own once it is back"
            }
            switch error {
            case .handshakeTimeout:
                return "no answer from squelchd at \(server); check that it runs and the address and port are right"
            default:
                return "connection to \(server) failed: \(error.description)"
            }
        }
        return "connection to \(server) failed: \(error)"
    }

    // MARK: Owed leaves

    /// Starts delivering `leave` (replacing a delivery for the same channel).
    func startLeaveDelivery(_ leave: OwedLeave) {
        owedLeaves[leave.channel]?.task.cancel()
        nextLeaveID += 1
        let id = nextLeaveID
        let sink = commandSink
        let connection = configuration.connection
        let task = Task {
            var delivery = LeaveDelivery(leave)
            while true {
                let result = await Self.attemptLeave(delivery, connection: connection)
                if Task.isCancelled { return }
                switch delivery.ended(result) {
                case .finished(let outcome):
                    sink.yield(.leaveSettled(leave.channel, id: id, outcome))
                    return
                case .retry(let milliseconds):
                    do { try await Task.sleep(for: .milliseconds(Backoff.jittered(milliseconds))) } catch { return }
                }
            }
        }
        owedLeaves[leave.channel] = (leave, id, task)
        snapshot.withLockedValue { $0.owedLeaves = Set(owedLeaves.keys) }
    }

    /// The delivery `id` for `channel` ended with `outcome`; with `id` nil, whichever is under way
    /// gives way (the channel was joined again).
    func settleLeave(_ channel: UUID, id: Int?, _ outcome: OwedLeaveOutcome) {
        guard let owed = owedLeaves[channel], id == nil || id == owed.id else { return }
        owed.task.cancel()
        owedLeaves[channel] = nil
        snapshot.withLockedValue { $0.owedLeaves = Set(owedLeaves.keys) }
        saveOwedLeaves()
        switch outcome {
        case .delivered, .superseded: break
        case .nothingToLeave(let why):
            eventSink.yield(.notice("the server had no membership left to leave in channel \(channel): \(why)"))
        case .undeliverable(let why):
            eventSink.yield(.notice("the server could not be told that you left channel \(channel) (\(why)); it lists you there until an administrator removes you"))
        }
        eventSink.yield(.leaveSettled(channel, outcome))
    }

    func saveOwedLeaves() {
        do {
            try store.saveOwedLeaves(owedLeaves.values.map(\.leave).sorted { $0.leftAt < $1.leftAt })
        } catch {
            eventSink.yield(.notice(error.description))
        }
    }

    /// One attempt at an owed leave, on a connection of its own: `join`, then `leave` once joined,
    /// then close once the server acknowledged it. Gives up after `limit`.
    static func attemptLeave(_ delivery: LeaveDelivery, connection: ConnectionConfiguration,
                             limit: Duration = .seconds(15)) async -> LeaveDelivery.AttemptResult {
        let credentials = delivery.leave.credentials
        let client: WireClientChannel
        do throws(SetupProblem) { client = try makeClient(credentials, connection: connection, onDatagram: { _ in }) } catch {
            return .failed(error.message)
        }
        let codec = MessageCodec()
        // Closing the client ends its event stream, which ends the attempt: on time, or on cancellation.
        let deadline = Task {
            try? await Task.sleep(for: limit)
            await client.close(code: CloseCode.normal.rawValue, reason: "client closed")
        }
        let connecting = Task { try? await client.connect() }
        defer {
            deadline.cancel()
            connecting.cancel()
        }
        let result = await withTaskCancellationHandler { () async -> LeaveDelivery.AttemptResult in
            var attempt = delivery.attempt()
            for await event in client.events {
                switch event {
                case .connection(.connected):
                    try? await client.send(control: codec.encode(attempt.join))
                case .connection(.control(let bytes)):
                    guard let message = try? codec.decodeServerMessage(bytes), let action = attempt.received(message) else { continue }
                    switch action {
                    case .send(let message):
                        do { try await client.send(control: codec.encode(message)) } catch {
                            return .failed("could not send \(message): \(error)")
                        }
                    case .end(let ended):
                        return ended
                    }
                case .connection(.closed(let error)):
                    return attempt.closed(error)
                default:
                    break
                }
            }
            return .failed("no answer from squelchd at \(credentials.address) within \(limit)")
        } onCancel: {
            Task { await client.close(code: CloseCode.normal.rawValue, reason: "client closed") }
        }
        await client.close(code: CloseCode.normal.rawValue, reason: "client closed")
        return result
    }

    // MARK: Pushes

    /// Receives pushes for the channel's token until the channel is left (`pushTask` cancelled). A
    /// transport that fails (the APNs simulator inside a squelchd that restarted, a push channel
    /// that dropped) is registered again with the same token, after 1 s and then up to every 15 s:
    /// a walkie-talkie in the background that stopped listening for pushes for good would miss every
    /// call after a server upgrade, with nothing to show it. The token is announced on the first
    /// registration, and again only if the transport hands out another.
    func startPushes(token: Data?, channel: UUID) {
        guard let transport = configuration.pushTransport else { return }
        // A task left from before (a channel that ended without a token, a registration still
        // retrying) gives way: this session needs its token announced to it.
        stopPushes()
        let sink = commandSink
        let snapshot = self.snapshot
        let generation = snapshot.withLockedValue { snap -> Int in
            snap.pushGeneration += 1
            return snap.pushGeneration
        }
        // Only the newest task speaks for the flag: a cancelled one still inside `register` must not
        // clear what its successor set.
        @Sendable func canBeWoken(_ value: Bool) {
            snapshot.withLockedValue { if $0.pushGeneration == generation { $0.canBeWokenByPush = value } }
        }
        pushTask = Task {
            defer { canBeWoken(false) }
            var current = token
            var announced = false
            var delay: Duration = .seconds(1)
            var lostSince: Date?
            while !Task.isCancelled {
                var why = "the push channel closed"
                do {
                    let (issued, pushes) = try await transport.register(token: current)
                    if !announced || issued != current { sink.yield(.pushToken(issued, channel)) }
                    announced = true
                    current = issued
                    if lostSince != nil {
                        sink.yield(.notice("push delivery is back; the channel can be woken again"))
                        lostSince = nil
                    }
                    delay = .seconds(1)
                    canBeWoken(true)
                    for try await push in pushes { sink.yield(.push(push)) }
                } catch is CancellationError {
                    return
                } catch {
                    why = "\(Self.describePushFailure(error))"
                }
                guard !Task.isCancelled else { return }
                canBeWoken(false)
                if lostSince == nil {
                    lostSince = Date()
                    sink.yield(.notice("push delivery lost (\(why)); trying again, and until it is back the channel can't be woken while suspended"))
                }
                do { try await Task.sleep(for: delay) } catch { return }
                delay = min(delay * 2, .seconds(15))
                // The channel ended meanwhile without a token to invalidate (none was issued, or a
                // restored one was refused): nothing is left to wake.
                guard snapshot.withLockedValue({ $0.activeChannelUUID }) == channel else { return }
            }
        }
    }

    func stopPushes() {
        pushTask?.cancel()
        pushTask = nil
        snapshot.withLockedValue { snap in
            snap.pushGeneration += 1
            snap.canBeWokenByPush = false
        }
    }

    /// A push transport's failure in words: NIO's connection errors print as nested structures.
    static func describePushFailure(_ error: any Error) -> String {
        let text = "\(error)"
        if text.contains("connectionRefused") || text.contains("Connection refused") || text.contains("SingleConnectionFailure") {
            return "nothing answers on the push port; is the APNs simulator (squelchd's --apns-simulator-control-port) running?"
        }
        return text.count > 160 ? String(text.prefix(160)) + "…" : text
    }

    // MARK: Statistics

    func statistics() async -> ChannelStatistics {
        var result = ChannelStatistics(roundTripMilliseconds: nil, packetsLost: 0, packetsSent: 0, reception: nil,
                                       jitterTargetMilliseconds: 0, inputLevel: transmitter.level, inputPeak: transmitter.peak,
                                       framesSent: transmitter.framesSent, encoder: transmitter.encoderConfiguration)
        if let client {
            let figures = try? await client.withClient { client -> (Double?, Int, Int)? in
                guard let connection = client?.connection else { return nil }
                return (connection.rtt.hasSample ? Double(connection.rtt.smoothed) / 1e6 : nil,
                        connection.stats.packetsLost, connection.stats.packetsSent)
            }
            if let figures = figures ?? nil {
                result.roundTripMilliseconds = figures.0
                result.packetsLost = figures.1
                result.packetsSent = figures.2
            }
        }
        let reception = receiver.statistics
        result.reception = reception.current
        result.jitterTargetMilliseconds = reception.target
        result.malformedDatagrams = reception.malformed
        result.droppedTooManyTalkers = reception.tooManyTalkers
        return result
    }
}
