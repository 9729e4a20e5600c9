import ChannelProtocol
import Foundation

/// A member as operators see it (admin API, `squelchd channel show`): the push token itself never
/// leaves the server, only whether there is one and for which APNs environment.
public struct MemberSummary: Codable, Sendable, Equatable {
    public var userID: String
    public var displayName: String
    public var joinedAt: Date
    public var lastSeen: Date
    public var hasPushToken: Bool
    public var pushEnvironment: PushEnvironment?
    public var pushRegisteredAt: Date?
    /// From the member's last token (all nil for a member stored before the store kept them).
    public var capabilities: [String]?
    public var role: String?
    public var priority: Int?
    public var tokenExpiresAt: Date?
    /// The `jti` of that token: what `squelchd token revoke --channel … --id …` and the admin API's
    /// revocations take. An identifier, not a credential: it lets nobody in.
    public var tokenID: String?

    public init(_ member: MemberRecord) {
        userID = member.userID
        displayName = member.displayName
        joinedAt = member.joinedAt
        lastSeen = member.lastSeen
        hasPushToken = member.pushToken != nil
        pushEnvironment = member.pushToken != nil ? member.pushEnvironment : nil
        pushRegisteredAt = member.pushToken != nil ? member.pushRegisteredAt : nil
        if let grant = member.grant {
            capabilities = grant.capabilities
            role = grant.role
            priority = Int(grant.priority)
            tokenExpiresAt = grant.tokenExpiresAt
            tokenID = grant.tokenID
        }
    }

    /// Absent push fields are written as `null`, so every member has the same JSON shape.
    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(userID, forKey: .userID)
        try container.encode(displayName, forKey: .displayName)
        try container.encode(joinedAt, forKey: .joinedAt)
        try container.encode(lastSeen, forKey: .lastSeen)
        try container.encode(hasPushToken, forKey: .hasPushToken)
        try container.encode(pushEnvironment, forKey: .pushEnvironment)
        try container.encode(pushRegisteredAt, forKey: .pushRegisteredAt)
        try container.encode(capabilities, forKey: .capabilities)
        try container.encode(role, forKey: .role)
        try container.encode(priority, forKey: .priority)
        try container.encode(tokenExpiresAt, forKey: .tokenExpiresAt)
        try container.encode(tokenID, forKey: .tokenID)
    }
}
