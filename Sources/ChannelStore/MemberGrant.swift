import ChannelProtocol
import Foundation

/// The claims of a member's last participant token that outlive its connection. Kept so that after a
/// restart an offline member is shown with its real role, priority and capabilities, is woken only
/// if it may listen, and is removed when its token is revoked by id.
public struct MemberGrant: Codable, Sendable, Equatable {
    public var canTalk: Bool
    public var canListen: Bool
    public var role: String?
    public var priority: UInt8
    /// The token's `jti`, `iat` and `exp`.
    public var tokenID: String
    public var tokenIssuedAt: Date
    public var tokenExpiresAt: Date

    public init(canTalk: Bool, canListen: Bool, role: String?, priority: UInt8, tokenID: String, tokenIssuedAt: Date,
                tokenExpiresAt: Date) {
        self.canTalk = canTalk
        self.canListen = canListen
        self.role = role
        self.priority = priority
        self.tokenID = tokenID
        self.tokenIssuedAt = tokenIssuedAt
        self.tokenExpiresAt = tokenExpiresAt
    }

    /// The token's capabilities as its claim spells them, "talk" first.
    public var capabilities: [String] { (canTalk ? ["talk"] : []) + (canListen ? ["listen"] : []) }
}
