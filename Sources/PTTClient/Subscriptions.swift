import ChannelProtocol
import Foundation

/// Whether the app wants to hear a participant (Amazon IVS stage strategy's `SubscribeType`).
public enum SubscribeType: String, Sendable, Hashable, Codable {
    case none
    case audio
}

/// Whether a member is sending audio (IVS's `ParticipantPublishState`): on a push-to-talk channel,
/// while they hold the floor.
public enum PublishState: String, Sendable, Hashable {
    case notPublished
    case published
}

/// Whether this member receives a member's audio (IVS's `ParticipantSubscribeState`).
public enum SubscribeState: String, Sendable, Hashable {
    case notSubscribed
    case subscribed
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
    /// Their picture, from their participant token.
    public var image: ChannelImage?
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
