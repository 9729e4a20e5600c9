import ChannelHub
import ChannelProtocol
import ChannelStore
import Foundation

/// What the admin API asks of the live part of the server (the channel hub), so that an edit made
/// over HTTP takes effect on connected members at once rather than at the next store poll.
public protocol AdminHubHooks: Sendable {
    /// A channel was created or updated: members get a descriptor update.
    func channelChanged(_ id: UUID) async
    /// A channel was deleted: its members are told and disconnected.
    func channelDeleted(_ id: UUID) async
    /// An admin removed a member (`revocation` is the member revocation stored for it): it is told
    /// and disconnected, and its push token is gone.
    func memberRemoved(channel: UUID, user: String, revocation: RevocationRecord) async
    /// Whether the hub holds the member: connected, reconnecting, or joined moments ago, before the
    /// store writer has written its row. The API asks before it answers "no such member".
    func isMember(channel: UUID, user: String) async -> Bool
    /// A token was revoked: a member connected with it is told and removed.
    func tokenRevoked(_ revocation: RevocationRecord) async
    /// The live roster of a channel (connected and recently disconnected members), empty if unknown.
    func roster(of channel: UUID) async -> [LiveMember]
    /// Number of live connections, for /healthz.
    func connectionCount() async -> Int
}
