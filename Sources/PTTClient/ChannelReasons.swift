import ChannelProtocol
import Foundation

// Apple's PushToTalk value types, without the `PT` prefix and with Apple's raw values (as its
// headers declare them), so that code written against PushToTalk reads the same here.

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
