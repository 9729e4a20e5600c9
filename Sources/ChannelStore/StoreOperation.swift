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

extension StoreOperation {
    /// The channel the write is for: what a cluster node's fencing checks it holds.
    public var channel: UUID {
        switch self {
        case .upsertMember(let member): member.channelID
        case .touchMember(let channel, _, _), .setPushToken(let channel, _, _, _, _), .removeMember(let channel, _),
             .clearPushToken(let channel, _), .setSubscriptions(let channel, _, _):
            channel
        case .logTransmission(let record): record.channelID
        }
    }

    /// What the write does, for error messages: "store member 'ann' of channel …".
    public var action: String {
        switch self {
        case .upsertMember(let member): "store member '\(member.userID)' of channel \(member.channelID)"
        case .touchMember(let channel, let user, _): "update last seen of member '\(user)' of channel \(channel)"
        case .setPushToken(let channel, let user, _, _, _): "store the push token of member '\(user)' of channel \(channel)"
        case .removeMember(let channel, let user): "remove member '\(user)' of channel \(channel)"
        case .clearPushToken(let channel, let user): "clear the push token of member '\(user)' of channel \(channel)"
        case .setSubscriptions(let channel, let user, _): "store the subscriptions of member '\(user)' of channel \(channel)"
        case .logTransmission(let record): "log a transmission on channel \(record.channelID)"
        }
    }
}
