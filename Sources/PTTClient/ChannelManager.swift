import Audio
import ChannelProtocol
import Foundation
import JitterBuffer
import NIOConcurrencyHelpers
import NIOCore
import Wire
import WireNIO

/// Settings for a channel manager. One app (one `stateDirectory`) has one manager.
public struct ChannelManagerConfiguration: Sendable {
    /// Where the restoration record lives; by default `$XDG_STATE_HOME/squelch/<appIdentifier>`.
    public var stateDirectory: String
    /// Pushes and ephemeral tokens; nil for none (the channel then can't be woken while suspended).
    public var pushTransport: (any PushTransport)?
    public var audio: AudioConfiguration
    public var subscriptionStrategy: any SubscriptionStrategy
    /// Transport settings (keepalive, idle timeout).
    public var connection: ConnectionConfiguration
    /// Whether a transmit request made while others hold the floor waits in squelchd's queue
    /// (`ChannelManagerEvent.floorQueued`, then `didBeginTransmitting` when its turn comes), as a
    /// radio user holding the key expects; false: it fails at once with `transmissionInProgress`,
    /// taking nobody's place in the queue, for an app that would not wait (a one-shot announcement).
    public var waitsForFloor: Bool

    public init(appIdentifier: String = "default", stateDirectory: String? = nil, pushTransport: (any PushTransport)? = nil,
                audio: AudioConfiguration = .none, subscriptionStrategy: any SubscriptionStrategy = SubscribeToAll(),
                connection: ConnectionConfiguration = .client, waitsForFloor: Bool = true) {
        self.stateDirectory = stateDirectory ?? RestorationStore.defaultDirectory(app: appIdentifier)
        self.pushTransport = pushTransport
        self.audio = audio
        self.subscriptionStrategy = subscriptionStrategy
        self.connection = connection
        self.waitsForFloor = waitsForFloor
    }
}

/// Apple's `PTChannelManager` for Linux: one active channel, joined and left, transmitting through a
/// floor request, woken by pushes, restored after a restart. Underneath it speaks Squelch's transport
/// to squelchd and runs the audio pipeline.
///
/// Commands return at once and report through the delegate, in order, as Apple's do. The setters have
/// an async-throws form and a completion-handler form.
public final class ChannelManager: Sendable {
    let engine: ManagerEngine
    let snapshot: NIOLockedValueBox<Snapshot>
    /// UI state changes beyond Apple's delegate, from the manager's start. One consumer (a stream's
    /// elements are shared out among those who loop over it): others call `makeEventStream()`. The
    /// newest 1,000 are kept for a consumer that lags.
    public let events: AsyncStream<ChannelManagerEvent>
    private let broadcast: EventBroadcast

    /// Another stream of every event from now on, for another consumer (a stage renderer beside the
    /// status bar, a logger); it ends when the manager is invalidated.
    public func makeEventStream() -> AsyncStream<ChannelManagerEvent> { broadcast.makeStream() }
    /// Where this manager keeps its restoration record.
    public let stateDirectory: String

    struct Snapshot: Sendable {
        var activeChannelUUID: UUID?
        var serviceStatus = ServiceStatus.ready
        var transmissionMode = TransmissionMode.halfDuplex
        var activeRemoteParticipant: Participant?
        var roster: [RosterEntry] = []
        var isTransmitting = false
        var isSuspended = false
        var isJoined = false
        var tokenExpired = false
        var canBeWokenByPush = false
        /// Numbers the push tasks, so that only the newest sets `canBeWokenByPush`.
        var pushGeneration = 0
        var restorationError: RestorationError?
        var channelInfo: ChannelInfo?
        var owedLeaves: Set<UUID> = []
        /// Where the voice connection goes (a cluster's home, once known), with the session's
        /// credentials (renewed tokens included), for the push transport; and the entry point the
        /// app gave, where it falls back to.
        var credentials: ChannelCredentials?
        var entryCredentials: ChannelCredentials?
    }

    // MARK: Instantiation

    /// Apple hands out one manager per app process; here an app is its state directory, so that tests
    /// and tools can run several "devices" in one process. The registry is a `let` behind a lock, so
    /// it is not unsynchronised global state.
    private static let registry = NIOLockedValueBox<[String: Registration]>([:])
    private enum Registration: Sendable {
        case inProgress
        case ready(ChannelManager)
    }

    /// Returns the app's channel manager, creating it (and restoring its channel) on the first call.
    /// Later calls return the same instance; a call while another is still creating it fails with
    /// `instantiationAlreadyInProgress`. Call it at every start, as on iOS: that is what restores the
    /// channel (`didJoinChannel` with reason `channelRestoration`).
    public static func channelManager(delegate: any ChannelManagerDelegate, restorationDelegate: any ChannelRestorationDelegate,
                                      configuration: ChannelManagerConfiguration = ChannelManagerConfiguration())
        async throws(InstantiationError) -> ChannelManager {
        let key = (configuration.stateDirectory as NSString).standardizingPath
        let existing = registry.withLockedValue { registry -> Result<ChannelManager?, InstantiationError> in
            switch registry[key] {
            case .ready(let manager)?: return .success(manager)
            case .inProgress?: return .failure(InstantiationError(.instantiationAlreadyInProgress, "a channel manager for \(key) is being created; await that call"))
            case nil:
                registry[key] = .inProgress
                return .success(nil)
            }
        }
        if let manager = try existing.get() { return manager }
        do {
            let manager = try await ChannelManager(delegate: delegate, restorationDelegate: restorationDelegate,
                                                   configuration: configuration, key: key)
            registry.withLockedValue { $0[key] = .ready(manager) }
            return manager
        } catch {
            registry.withLockedValue { $0[key] = nil }
            throw error
        }
    }

    private init(delegate: any ChannelManagerDelegate, restorationDelegate: any ChannelRestorationDelegate,
                 configuration: ChannelManagerConfiguration, key: String) async throws(InstantiationError) {
        var isDirectory: ObjCBool = false
        do {
            try FileManager.default.createDirectory(atPath: key, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        } catch {
            throw InstantiationError(.invalidPlatform, "can't use the state directory \(key): \(error.localizedDescription); set XDG_STATE_HOME to a writable directory")
        }
        guard FileManager.default.fileExists(atPath: key, isDirectory: &isDirectory), isDirectory.boolValue,
              FileManager.default.isWritableFile(atPath: key) else {
            throw InstantiationError(.invalidPlatform, "the state directory \(key) is not a writable directory; set XDG_STATE_HOME to one")
        }
        stateDirectory = key
        let broadcast = EventBroadcast()
        self.broadcast = broadcast
        events = broadcast.makeStream()
        let snapshot = NIOLockedValueBox(Snapshot())
        self.snapshot = snapshot
        engine = ManagerEngine(configuration: configuration, store: RestorationStore(directory: key), delegate: delegate,
                               restorationDelegate: restorationDelegate, events: broadcast, snapshot: snapshot)
        await engine.start(manager: self)
    }

    /// Stops this manager as if the app quit: connections close and audio stops, but the channel is
    /// not left, so the next `channelManager(...)` for the same directory restores it. (Linux only:
    /// on iOS the process simply ends.) Commands already submitted get up to 2 s to finish first, so
    /// that a `leaveChannel` just before is acknowledged by the server; this can take a few seconds.
    public func invalidate() async {
        await engine.shutdown()
        let key = stateDirectory
        ChannelManager.registry.withLockedValue { $0[key] = nil }
    }

    // MARK: Apple's members

    /// Channels left while not connected whose leave the server has not heard yet. The manager
    /// delivers each on a connection of its own, retrying with backoff, and again at the next start
    /// if the app stops first; `ChannelManagerEvent.leaveSettled` says how each ended. Until then the
    /// server lists the member, and may wake the device by push. (Apple's framework leaves telling the
    /// app's server to the app.)
    public var owedLeaves: Set<UUID> { snapshot.withLockedValue { $0.owedLeaves } }

    /// The channel joined, or being joined or restored. One at a time.
    public var activeChannelUUID: UUID? { snapshot.withLockedValue { $0.activeChannelUUID } }

    public func requestJoinChannel(channelUUID: UUID, descriptor: ChannelDescriptor, credentials: ChannelCredentials) {
        engine.submit(.join(channelUUID, descriptor, credentials))
    }

    public func leaveChannel(channelUUID: UUID) { engine.submit(.leave(channelUUID, .developerRequest)) }

    /// How long a press made while not connected (suspended, reconnecting) waits for the channel to
    /// be rejoined before `failedToBeginTransmitting` (`transmissionNotAllowed`).
    public static let heldPressWaitSeconds = ChannelSession.transmitWaitMilliseconds / 1_000

    /// Asks for the floor. Not connected (suspended, reconnecting, or between reconnect attempts),
    /// the request is held and sent once the channel is rejoined, for up to `heldPressWaitSeconds`.
    public func requestBeginTransmitting(channelUUID: UUID, source: ChannelTransmitRequestSource = .developerRequest) {
        engine.submit(.begin(channelUUID, source))
    }

    public func stopTransmitting(channelUUID: UUID, source: ChannelTransmitRequestSource = .developerRequest) {
        engine.submit(.stop(channelUUID, source))
    }

    public func setChannelDescriptor(_ descriptor: ChannelDescriptor, channelUUID: UUID) async throws(ChannelError) {
        try await engine.set { session throws(ChannelError) in try session.setChannelDescriptor(descriptor, channelUUID) }
    }

    public func setChannelDescriptor(_ descriptor: ChannelDescriptor, channelUUID: UUID,
                                     completionHandler: (@Sendable ((any Error)?) -> Void)? = nil) {
        complete(completionHandler) { try await self.setChannelDescriptor(descriptor, channelUUID: channelUUID) }
    }

    public func setActiveRemoteParticipant(_ participant: Participant?, channelUUID: UUID) async throws(ChannelError) {
        try await engine.set { session throws(ChannelError) in try session.setActiveRemoteParticipant(participant, channelUUID) }
    }

    public func setActiveRemoteParticipant(_ participant: Participant?, channelUUID: UUID,
                                           completionHandler: (@Sendable ((any Error)?) -> Void)? = nil) {
        complete(completionHandler) { try await self.setActiveRemoteParticipant(participant, channelUUID: channelUUID) }
    }

    public func setServiceStatus(_ status: ServiceStatus, channelUUID: UUID) async throws(ChannelError) {
        try await engine.set { session throws(ChannelError) in try session.setServiceStatus(status, channelUUID) }
    }

    public func setServiceStatus(_ status: ServiceStatus, channelUUID: UUID, completionHandler: (@Sendable ((any Error)?) -> Void)? = nil) {
        complete(completionHandler) { try await self.setServiceStatus(status, channelUUID: channelUUID) }
    }

    public func setTransmissionMode(_ mode: TransmissionMode, channelUUID: UUID) async throws(ChannelError) {
        try await engine.set { session throws(ChannelError) in try session.setTransmissionMode(mode, channelUUID) }
    }

    public func setTransmissionMode(_ mode: TransmissionMode, channelUUID: UUID, completionHandler: (@Sendable ((any Error)?) -> Void)? = nil) {
        complete(completionHandler) { try await self.setTransmissionMode(mode, channelUUID: channelUUID) }
    }

    public func setAccessoryButtonEventsEnabled(_ enabled: Bool, channelUUID: UUID) async throws(ChannelError) {
        try await engine.set { session throws(ChannelError) in try session.setAccessoryButtonEventsEnabled(enabled, channelUUID) }
    }

    public func setAccessoryButtonEventsEnabled(_ enabled: Bool, channelUUID: UUID,
                                                completionHandler: (@Sendable ((any Error)?) -> Void)? = nil) {
        complete(completionHandler) { try await self.setAccessoryButtonEventsEnabled(enabled, channelUUID: channelUUID) }
    }

    private func complete(_ handler: (@Sendable ((any Error)?) -> Void)?, _ body: @escaping @Sendable () async throws -> Void) {
        Task {
            do {
                try await body()
                handler?(nil)
            } catch {
                handler?(error)
            }
        }
    }

    // MARK: Participant tokens (Squelch's own)

    /// Hands the channel a new participant token for the same user. Apple's framework leaves
    /// credentials to the app's server; here the server ends a session when its token expires, so an
    /// app renews when it sees `ChannelManagerEvent.tokenExpiring`, and the session carries on without
    /// a gap. A joined channel sends it at once (answered by `tokenRenewed` or `tokenRenewalFailed`),
    /// and the restoration record keeps it once the server has taken it; one whose session ended
    /// (`tokenExpired`) joins again with it. Throws `channelNotFound` for another channel, and an error
    /// with refusal `tokenWrongUser` for a token that names another user than the current one.
    public func renewToken(_ token: String, channelUUID: UUID) async throws(ChannelError) {
        try await engine.set { session throws(ChannelError) in try session.renewToken(token, channelUUID) }
    }

    public func renewToken(_ token: String, channelUUID: UUID, completionHandler: (@Sendable ((any Error)?) -> Void)? = nil) {
        complete(completionHandler) { try await self.renewToken(token, channelUUID: channelUUID) }
    }

    // MARK: What iOS does for the app, as API

    /// The app moved to the foreground or background; joining and transmitting need the foreground.
    public func setAppState(_ state: AppState) { engine.submit(.appState(state)) }

    /// Simulates a system call taking the audio (true) and giving it back (false): transmission stops,
    /// playback is silenced, and `requestBeginTransmitting` fails with `callActive` meanwhile.
    public func setSystemCallActive(_ active: Bool) { engine.submit(.systemCall(active)) }

    /// A hands-free accessory button (a headset or pedal) went down or up: begin or stop with source
    /// `handsfreeButton`, unless `setAccessoryButtonEventsEnabled(false)`. Works in the background.
    public func accessoryButton(pressed: Bool, channelUUID: UUID) { engine.submit(.accessory(pressed, channelUUID)) }

    /// The user left the channel from the system's own controls (on iOS, the PTT banner; here, a
    /// walkie's `leave` or quit-and-leave): reason `userRequest`, where the app's own `leaveChannel` is
    /// `developerRequest`.
    public func userLeftChannel(channelUUID: UUID) { engine.submit(.leave(channelUUID, .userRequest)) }

    /// Silences (or unmutes) what the channel plays, without leaving it or touching the floor. Every
    /// member's roster then shows this member as muted (`RosterEntry.muted`).
    public func setPlaybackMuted(_ muted: Bool) { engine.submit(.playbackMuted(muted)) }

    /// Silences the floor's tones (`AudioConfiguration.tones` picks which play), or lets them play
    /// again; the channel's audio is untouched.
    public func setTonesMuted(_ muted: Bool) { engine.receiver.setTonesMuted(muted) }

    /// Closes the voice connection to save power, as iOS does to a suspended app; the channel stays,
    /// and a push (or `resume()`, or a transmit request) brings the connection back.
    public func suspend() { engine.submit(.suspend) }

    /// Reopens a suspended voice connection.
    public func resume() { engine.submit(.resume) }

    // MARK: Subscriptions (after the Amazon IVS stage strategy)

    /// Replaces the strategy and applies it to everyone.
    public func setSubscriptionStrategy(_ strategy: any SubscriptionStrategy) { engine.submit(.strategy(strategy)) }

    /// Asks the strategy again about every participant; only changed decisions reach the server.
    public func refreshStrategy() { engine.submit(.refreshStrategy) }

    // MARK: State for a UI

    public var serviceStatus: ServiceStatus { snapshot.withLockedValue { $0.serviceStatus } }
    public var transmissionMode: TransmissionMode { snapshot.withLockedValue { $0.transmissionMode } }
    public var activeRemoteParticipant: Participant? { snapshot.withLockedValue { $0.activeRemoteParticipant } }
    public var roster: [RosterEntry] { snapshot.withLockedValue { $0.roster } }
    public var isTransmitting: Bool { snapshot.withLockedValue { $0.isTransmitting } }
    public var isSuspended: Bool { snapshot.withLockedValue { $0.isSuspended } }
    /// The channel is joined on a connection: a press asks for the floor at once (or, while the
    /// server has stopped answering, fails at once). Otherwise (suspended, reconnecting, between
    /// attempts) a press is held for `heldPressWaitSeconds`.
    public var isJoined: Bool { snapshot.withLockedValue { $0.isJoined } }
    /// The server ended the session because its participant token expired (or refused a restored
    /// channel's saved token as expired): the channel is kept, and nothing connects until the app
    /// hands over a new token with `renewToken`.
    public var needsNewToken: Bool { snapshot.withLockedValue { $0.tokenExpired } }
    /// Whether the push transport is receiving pushes for the channel's token now: false without a
    /// transport, before the token is registered, and while a failed transport is being registered
    /// again. A suspended channel is woken only while this holds.
    public var canBeWokenByPush: Bool { snapshot.withLockedValue { $0.canBeWokenByPush } }
    /// The channel as the server describes it (name, image, mode, burst limit), once joined.
    public var channelInfo: ChannelInfo? { snapshot.withLockedValue { $0.channelInfo } }
    /// Why the saved channel could not be restored at start, if it could not.
    public var restorationError: RestorationError? { snapshot.withLockedValue { $0.restorationError } }

    /// Network and audio figures now.
    public func statistics() async -> ChannelStatistics { await engine.statistics() }
}
