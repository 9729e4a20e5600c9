import ChannelProtocol
import Foundation

/// One membership: a channel and a user.
public struct MemberKey: Hashable, Sendable {
    public var channel: UUID
    public var user: String
    public init(channel: UUID, user: String) {
        self.channel = channel
        self.user = user
    }
}
