/// Everything the interactive screen shows, as plain values. The app builds one from its channel manager
/// state on every change and hands it to ``Screen/render(_:width:height:)``.
public struct ScreenModel: Hashable, Sendable {
    /// The server's ability to serve the channel (Apple's `PTServiceStatus`).
    public enum ServiceStatus: Hashable, Sendable {
        case ready, connecting, unavailable
    }

    public enum TransmissionMode: Hashable, Sendable {
        case halfDuplex, fullDuplex
        /// The member's token has no `talk`: the keys that talk do nothing, and the hints say so.
        case listenOnly
    }

    /// What this walkie is doing.
    public enum LocalState: Hashable, Sendable {
        case idle
        /// Key is down, floor requested, not granted yet.
        case requestingFloor
        case transmitting
        /// Transmitting after a tap (legacy keyboard): the next press stops it.
        case latched
        /// Someone else is talking and we are playing them.
        case receiving
        /// Voice connection suspended; a push will wake us.
        case background
    }

    public enum Connection: Hashable, Sendable {
        case connected, reconnecting, offline
    }

    public struct Member: Hashable, Sendable {
        public var name: String
        public var role: String?
        public var talking: Bool
        public var muted: Bool
        public var connection: Connection
        /// This walkie's own entry, marked "(you)".
        public var isSelf: Bool

        public init(name: String, role: String? = nil, talking: Bool = false, muted: Bool = false,
                    connection: Connection = .connected, isSelf: Bool = false) {
            self.name = name
            self.role = role
            self.talking = talking
            self.muted = muted
            self.connection = connection
            self.isSelf = isSelf
        }
    }

    /// Microphone level as linear amplitudes (0...1 of full scale); the meter shows them on a -60...0 dBFS scale.
    public struct InputLevel: Hashable, Sendable {
        public var rms: Double
        public var peak: Double

        public init(rms: Double, peak: Double) {
            self.rms = rms
            self.peak = peak
        }
    }

    public struct NetworkStats: Hashable, Sendable {
        public var roundTripMilliseconds: Double
        public var lossPercent: Double
        /// Current jitter buffer depth (playout delay) in milliseconds.
        public var jitterBufferMilliseconds: Double

        public init(roundTripMilliseconds: Double, lossPercent: Double, jitterBufferMilliseconds: Double) {
            self.roundTripMilliseconds = roundTripMilliseconds
            self.lossPercent = lossPercent
            self.jitterBufferMilliseconds = jitterBufferMilliseconds
        }
    }

    /// The one-line message above the key hints.
    public struct StatusMessage: Hashable, Sendable {
        public var text: String
        public var isError: Bool

        public init(_ text: String, isError: Bool = false) {
            self.text = text
            self.isError = isError
        }
    }

    public var channelName: String
    public var serviceStatus: ServiceStatus
    public var transmissionMode: TransmissionMode
    public var localState: LocalState
    /// Who holds the floor (ourselves included), if anyone.
    public var activeSpeaker: String?
    /// Members in display order; the caller decides the order (e.g. talking first, then by name).
    public var roster: [Member]
    /// Nil until the capture device delivers audio.
    public var inputLevel: InputLevel?
    /// The speaker is muted (walkie's `m`): the channel plays nothing, but talking still works.
    public var muted: Bool
    public var network: NetworkStats?
    /// Decides the key hints: in legacy mode taps latch and Esc stops.
    public var keyboard: HoldToTalk.Mode
    public var bindings: KeyBindings
    public var status: StatusMessage?
    /// How long the current transmission has lasted, and its limit, in nanoseconds.
    public var transmitElapsed: UInt64?
    public var maximumTransmit: UInt64?

    public init(channelName: String,
                serviceStatus: ServiceStatus = .connecting,
                transmissionMode: TransmissionMode = .halfDuplex,
                localState: LocalState = .idle,
                activeSpeaker: String? = nil,
                roster: [Member] = [],
                inputLevel: InputLevel? = nil,
                muted: Bool = false,
                network: NetworkStats? = nil,
                keyboard: HoldToTalk.Mode = .legacy,
                bindings: KeyBindings = KeyBindings(),
                status: StatusMessage? = nil,
                transmitElapsed: UInt64? = nil,
                maximumTransmit: UInt64? = nil) {
        self.channelName = channelName
        self.serviceStatus = serviceStatus
        self.transmissionMode = transmissionMode
        self.localState = localState
        self.activeSpeaker = activeSpeaker
        self.roster = roster
        self.inputLevel = inputLevel
        self.muted = muted
        self.network = network
        self.keyboard = keyboard
        self.bindings = bindings
        self.status = status
        self.transmitElapsed = transmitElapsed
        self.maximumTransmit = maximumTransmit
    }
}
