import ChannelProtocol
import Foundation

// The value types of Apple's PushToTalk framework, without the `PT` prefix and with Apple's raw values
// (as Apple's headers declare them), so that code written against PushToTalk reads the same here.

/// Whether the channel's service can carry speech right now (`PTServiceStatus`).
public enum ServiceStatus: Int, Sendable, Codable, CaseIterable {
    case ready = 0
    case connecting = 1
    case unavailable = 2
}

/// How the channel carries speech (`PTTransmissionMode`).
public enum TransmissionMode: Int, Sendable, Codable, CaseIterable {
    case fullDuplex = 0
    case halfDuplex = 1
    case listenOnly = 2
}

/// Why a channel was joined (`PTChannelJoinReason`).
public enum ChannelJoinReason: Int, Sendable, Codable, CaseIterable {
    case developerRequest = 0
    case channelRestoration = 1
}

/// Why a channel was left (`PTChannelLeaveReason`).
public enum ChannelLeaveReason: Int, Sendable, Codable, CaseIterable {
    case unknown = 0
    case userRequest = 1
    case developerRequest = 2
    /// Policy took the channel away: on Squelch, an admin removed the member or deleted the channel.
    case systemPolicy = 3
}

/// What asked to begin or end a transmission (`PTChannelTransmitRequestSource`).
public enum ChannelTransmitRequestSource: Int, Sendable, Codable, CaseIterable {
    /// Nobody asked: the floor was taken away (pre-emption, the burst limit, a lost connection, a call).
    case unknown = 0
    case userRequest = 1
    case developerRequest = 2
    /// A hands-free accessory button (see `ChannelManager.accessoryButton(pressed:channelUUID:)`).
    case handsfreeButton = 3
}

/// An image for a channel or a participant. Apple's is a `UIImage`; here it is a URL (http, https, file
/// or a `data:image/png;base64,…` URL) that the app renders however it likes.
public struct ChannelImage: Sendable, Hashable, Codable {
    public var url: String
    public init(url: String) { self.url = url }
}

/// A channel's name and image as the system shows them (`PTChannelDescriptor`).
public struct ChannelDescriptor: Sendable, Hashable, Codable {
    public let name: String
    public let image: ChannelImage?
    public init(name: String, image: ChannelImage? = nil) {
        self.name = name
        self.image = image
    }
}

/// A remote speaker (`PTParticipant`).
public struct Participant: Sendable, Hashable, Codable {
    public let name: String
    public let image: ChannelImage?

    /// Apple's header requires a name; an empty one is refused here rather than trapping as Objective-C
    /// would.
    public init(name: String, image: ChannelImage? = nil) throws(ParticipantError) {
        guard !name.isEmpty else { throw ParticipantError.emptyName }
        self.name = name
        self.image = image
    }
}

/// Why a `Participant` could not be made.
public enum ParticipantError: Error, Sendable, Equatable, CustomStringConvertible {
    case emptyName
    public var description: String { "a participant's name must not be empty" }
}

/// What the app decides for an incoming push (`PTPushResult`): exactly one of two, never nothing.
public enum PushResult: Sendable, Hashable {
    /// Someone is speaking: the channel shows them, activates audio and plays the burst.
    case activeRemoteParticipant(Participant)
    /// Leave the channel: the push token dies with it.
    case leaveChannel
}

/// The app's state, which gates joining and transmitting as iOS does (foreground only).
public enum AppState: Sendable, Equatable {
    case foreground
    case background
}

/// Where a channel lives and how to get in: the squelchd voice address, the CA that signs its
/// certificate, and a participant token. Apple's API has no counterpart because iOS apps bring their
/// own server connection; this library is that connection.
public struct ChannelCredentials: Sendable, Hashable, Codable {
    public var host: String
    public var port: Int
    /// The name the server's certificate must carry; the host when nil.
    public var serverName: String?
    /// PEM file of the CA that signs squelchd's certificate (`certs/ca.pem` in development). A
    /// relative path given to `init` is made absolute against the current directory: the credentials
    /// are saved for restoration, and an app restored from another directory must still find it.
    public var caPath: String
    /// The participant token (`squelchd token issue`).
    public var token: String

    public init(host: String, port: Int, serverName: String? = nil, caPath: String, token: String) {
        self.host = host
        self.port = port
        self.serverName = serverName
        self.caPath = caPath.hasPrefix("/") || caPath.isEmpty
            ? caPath : URL(fileURLWithPath: caPath, relativeTo: URL(fileURLWithPath: FileManager.default.currentDirectoryPath, isDirectory: true)).standardizedFileURL.path
        self.token = token
    }

    /// The server's address as a person types it: `host:port`, an IPv6 address in brackets.
    public var address: String { host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)" }
}

/// Whether the app wants to hear a participant (Amazon IVS stage strategy's `SubscribeType`).
public enum SubscribeType: String, Sendable, Hashable, Codable {
    case none
    case audio
}

/// A channel member as the roster shows it, with the app's subscription decision for them.
public struct RosterEntry: Sendable, Hashable {
    public var userID: String
    public var name: String
    /// Token attributes.
    public var role: String?
    public var priority: UInt8
    public var canTalk: Bool
    public var canListen: Bool
    public var connection: ConnectionState
    public var talking: Bool
    /// They muted the channel's playback: they will not hear you.
    public var muted: Bool
    /// Whether this client hears them (always `.audio` for yourself, whom you never hear anyway).
    public var subscribe: SubscribeType
    /// This is you.
    public var isLocal: Bool
    /// Their number in the channel while the server runs: what `BurstStatistics.slot` and the audio
    /// name them by.
    public var slot: UInt16
}

/// Decides, per participant, whether to hear them (after the IVS stage strategy). Evaluated when a
/// participant appears and on `ChannelManager.refreshStrategy()`; must be quick and side-effect free.
public protocol SubscriptionStrategy: Sendable {
    func subscribeType(for participant: RosterEntry) -> SubscribeType
}

/// Hears everyone: the default.
public struct SubscribeToAll: SubscriptionStrategy {
    public init() {}
    public func subscribeType(for participant: RosterEntry) -> SubscribeType { .audio }
}
