import ChannelProtocol
import Foundation

/// The channel manager's logic as a plain state machine (the project's sans-I/O rule): commands from
/// the app, events from the transport and the server go in; delegate calls, messages and media
/// actions come out of `takeOutputs()`. No sockets, clocks, threads or audio here, so every path of
/// Apple's API can be driven deterministically in tests.
///
/// The parts with state of their own are small machines it delegates to: `FloorRequests`,
/// `TokenRenewal`, `ReceptionLoss` and `TalkerDisplay`. The rest is split by concern into
/// `ChannelSession+*.swift`: the app's commands, the transport, what the server says, its refusals,
/// the floor, the talkers shown, the token, pushes and the roster.
struct ChannelSession {
    enum LinkState: Sendable, Equatable {
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

    /// Whether the app heard `didJoin` for the current channel: reconnects don't repeat it, and until
    /// it goes out the reason the app joined for decides what a failure means (a channel being
    /// restored is one the user is in; a fresh join that fails was never joined).
    enum JoinReport: Sendable, Equatable {
        case due(ChannelJoinReason)
        case made
    }

    var channel: UUID?
    var descriptor: ChannelDescriptor?
    var credentials: ChannelCredentials?
    var link = LinkState.down
    var appState = AppState.foreground
    var callActive = false
    /// Playback silenced by the user (`setMuted`), as the roster should show it.
    var muted = false
    /// A `resyncDue` is on its way (the server said it dropped messages for their rate).
    var resyncScheduled = false
    var serviceStatus = ServiceStatus.ready
    var transmit = Transmit.idle
    var talkers = TalkerDisplay()
    var audio = AudioSession(isTransmitting: false, isReceiving: false)
    var audioActive = false
    var pushToken: Data?
    var accessoryButtonEventsEnabled = true
    /// The mode the app set (`setTransmissionMode`); the server's otherwise.
    var modeOverride: TransmissionMode?
    var serverInfo: ChannelInfo?
    var you: UInt16?
    var roster: [UInt16: RosterMember] = [:]
    /// Pictures the app gave speakers (`setActiveRemoteParticipant`), by name: they win over the
    /// roster's, for this channel.
    var appImages: [String: ChannelImage] = [:]
    /// The other members as the app was last told of them, by user (`ParticipantEvents`).
    var announced: [String: RosterEntry] = [:]
    /// After a rejoin, the roster is still arriving (in chunks): who left while this member was away
    /// is known once it settles (`rosterSettled`). The number tells the latest wait from older ones.
    var rosterSettling: Int?
    var rosterGeneration = 0
    var joinReport = JoinReport.due(.developerRequest)
    /// Failed connection attempts in a row, for the backoff.
    var reconnectAttempts = 0
    /// squelchd closed saying it was going away, and no connection has come up since.
    var serverAway = false
    var unheard: Set<String> = []
    var token = TokenRenewal()
    var reception = ReceptionLoss()
    /// The transport reports the server silent (`ConnectionEvent.stalled`): the channel shows
    /// `connecting` until it answers again or the connection is given up.
    var stalled = false
    /// What the server last said of its own health (`serviceStatus`), shown again when a stall ends.
    var serverStatus = ServiceStatus.ready
    var floorRequests = FloorRequests()
    var unheardSent: Set<String>?
    var strategyDecisions: [String: SubscribeType] = [:]
    /// The APNs environment the push transport's tokens belong to.
    var pushEnvironment = PushEnvironment.sandbox
    /// Where to connect in a cluster: the channel's home node, once known.
    var route = ClusterRoute()

    var outputs: [SessionOutput] = []

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

    // Read-only views of the sub-machines, as the engine and the tests knew them.

    var activeRemoteParticipant: Participant? { talkers.shown }
    /// Remote slots holding the floor now.
    var remoteTalkers: [UInt16: UInt16] { talkers.live }
    var joinReported: Bool { joinReport == .made }
    var tokenExpired: Bool { token.isExpired }
    var pendingToken: String? { token.pending }
    var listenerLoss: Int { reception.listenerLoss }
    /// Whether floor requests may wait in squelchd's queue (`ChannelManagerConfiguration.waitsForFloor`).
    var waitsForFloor: Bool {
        get { floorRequests.waitsForFloor }
        set { floorRequests.waitsForFloor = newValue }
    }

    mutating func emit(_ call: DelegateCall) { outputs.append(.delegate(call)) }

    mutating func updateStatus(_ status: ServiceStatus) {
        guard status != serviceStatus else { return }
        serviceStatus = status
        outputs.append(.event(.serviceStatus(status)))
    }

    mutating func saveRecord() {
        guard let channel, let descriptor, let credentials else { return }
        outputs.append(.save(RestorationRecord(channel: channel, descriptor: descriptor, credentials: credentials,
                                               pushToken: pushToken.map { Array($0) })))
    }
}

extension ServiceStatus {
    init(_ status: ServerStatus) {
        switch status {
        case .ready: self = .ready
        case .connecting: self = .connecting
        case .unavailable: self = .unavailable
        }
    }
}
