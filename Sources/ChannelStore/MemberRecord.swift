import ChannelProtocol
import Foundation

/// A member of a channel: someone who joined it with a token and has not left. Members persist, so
/// a member with a push token can be woken while disconnected.
public struct MemberRecord: Codable, Sendable, Equatable {
    public var channelID: UUID
    public var userID: String
    public var displayName: String
    public var joinedAt: Date
    public var lastSeen: Date
    /// The ephemeral push token as lowercase hex, if the member registered one.
    public var pushToken: String?
    public var pushEnvironment: PushEnvironment?
    public var pushRegisteredAt: Date?
    /// What the token the member last joined with allows, and which token it was. Nil for a member
    /// stored before the store kept it (schema v3), until it joins again.
    public var grant: MemberGrant?
    /// The user ids whose audio the member chose not to hear (`setSubscriptions`), sorted. Kept so
    /// that after a restart a member the server has not heard from since is neither woken by nor
    /// replayed the talkers it unsubscribed from.
    public var unheard: [String]

    public init(channelID: UUID, userID: String, displayName: String, joinedAt: Date = Date(), lastSeen: Date = Date(),
                pushToken: String? = nil, pushEnvironment: PushEnvironment? = nil, pushRegisteredAt: Date? = nil,
                grant: MemberGrant? = nil, unheard: [String] = []) {
        self.channelID = channelID
        self.userID = userID
        self.displayName = displayName
        self.joinedAt = joinedAt
        self.lastSeen = lastSeen
        self.pushToken = pushToken
        self.pushEnvironment = pushEnvironment
        self.pushRegisteredAt = pushRegisteredAt
        self.grant = grant
        self.unheard = unheard
    }
}
