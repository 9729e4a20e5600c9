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
        case leave(UUID, ChannelLeaveReason)
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
        /// The generation, and whether the server took the connection's entry pass.
        case transportConnected(Int, entered: Bool = false)
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
        case rosterSettleDue(Int)
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
    let eventSink: EventBroadcast
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
    /// The address the last voice connection went to, for a push stream that follows it.
    var lastConnectAddress: String?
    var reconnectTask: Task<Void, Never>?
    var playbackMuted = false
    var pushToken: Data?

    let transmitter: Transmitter
    let receiver: Receiver

    init(configuration: ChannelManagerConfiguration, store: RestorationStore, delegate: any ChannelManagerDelegate,
         restorationDelegate: any ChannelRestorationDelegate, events: EventBroadcast,
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
            case .inputDevice(let status): eventSink.yield(.inputDevice(status))
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
            case .outputDevice(let status): eventSink.yield(.outputDevice(status))
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

    // MARK: Statistics

    func statistics() async -> ChannelStatistics {
        var result = ChannelStatistics(roundTripMilliseconds: nil, packetsLost: 0, packetsSent: 0, reception: nil,
                                       jitterTargetMilliseconds: 0, inputLevel: transmitter.level, inputPeak: transmitter.peak,
                                       framesSent: transmitter.framesSent, encoder: transmitter.encoderConfiguration)
        if let client {
            let figures = try? await client.withClient { client -> (Double?, Int, Int)? in
                guard let connection = client?.connection else { return nil }
                return (connection.rtt.hasSample ? Double(connection.rtt.smoothed) / 1e6 : nil,
                        connection.stats.packetsLost, connection.stats.ackElicitingSent)
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
