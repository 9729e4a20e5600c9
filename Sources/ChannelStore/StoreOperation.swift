import ChannelProtocol
import Foundation

/// A write the hub wants persisted, as the store's own methods of the same names do it: what
/// `ChannelStore.apply(_:)` takes many of at once.
public enum StoreOperation: Sendable, Equatable {
    case upsertMember(MemberRecord)
    case touchMember(channel: UUID, user: String, lastSeen: Date)
    case setPushToken(channel: UUID, user: String, token: String, environment: PushEnvironment, registeredAt: Date)
    case removeMember(channel: UUID, user: String)
    /// APNs said the token is dead.
    case clearPushToken(channel: UUID, user: String)
    /// The member's subscription list (`MemberRecord.unheard`) changed.
    case setSubscriptions(channel: UUID, user: String, unheard: [String])
    case logTransmission(TransmissionRecord)
}
