import Foundation

/// The audio path the channel activated. Apple hands over an `AVAudioSession`; here the library runs
/// the capture and playback itself, and this tells the app what is live. Audio starts with
/// `didActivate` and stops with `didDeactivate`, as on iOS: never start audio yourself.
public struct AudioSession: Sendable, Hashable {
    /// The microphone is being sent (you hold the floor).
    public var isTransmitting: Bool
    /// A remote participant is being played.
    public var isReceiving: Bool
    public init(isTransmitting: Bool, isReceiving: Bool) {
        self.isTransmitting = isTransmitting
        self.isReceiving = isReceiving
    }
}

/// Callbacks from the channel manager (`PTChannelManagerDelegate`): Apple's 8 required and 5 optional
/// methods. They are called one at a time, in order, from the manager's own task; return quickly.
public protocol ChannelManagerDelegate: AnyObject, Sendable {
    func channelManager(_ channelManager: ChannelManager, didJoinChannel channelUUID: UUID, reason: ChannelJoinReason)
    func channelManager(_ channelManager: ChannelManager, didLeaveChannel channelUUID: UUID, reason: ChannelLeaveReason)
    func channelManager(_ channelManager: ChannelManager, channelUUID: UUID, didBeginTransmittingFrom source: ChannelTransmitRequestSource)
    func channelManager(_ channelManager: ChannelManager, channelUUID: UUID, didEndTransmittingFrom source: ChannelTransmitRequestSource)
    /// The ephemeral push token for the channel just joined. It is registered with the server already;
    /// an app with its own push server sends it there too.
    func channelManager(_ channelManager: ChannelManager, receivedEphemeralPushToken pushToken: Data)
    /// A `pushtotalk` push arrived. Return at once and never fail to decide: an active participant, or
    /// leave the channel. Apple's sample leaves when the payload has no `activeSpeaker`.
    func incomingPushResult(channelManager: ChannelManager, channelUUID: UUID, pushPayload: [String: PushValue]) -> PushResult
    func channelManager(_ channelManager: ChannelManager, didActivate audioSession: AudioSession)
    func channelManager(_ channelManager: ChannelManager, didDeactivate audioSession: AudioSession)

    func channelManager(_ channelManager: ChannelManager, failedToJoinChannel channelUUID: UUID, error: ChannelError)
    func channelManager(_ channelManager: ChannelManager, failedToLeaveChannel channelUUID: UUID, error: ChannelError)
    func channelManager(_ channelManager: ChannelManager, failedToBeginTransmittingInChannel channelUUID: UUID, error: ChannelError)
    func channelManager(_ channelManager: ChannelManager, failedToStopTransmittingInChannel channelUUID: UUID, error: ChannelError)
    /// A service-update push (`{"aps":{"ptt-push-type":"service-update"}}`): news for the channel that
    /// needs no audio. High-priority ones are budgeted at six an hour; call `completion` when done.
    func incomingServiceUpdatePush(channelManager: ChannelManager, channelUUID: UUID, pushPayload: [String: PushValue],
                                   isHighPriority: Bool, remainingHighPriorityBudget: Int, completion: @escaping @Sendable () -> Void)
}

extension ChannelManagerDelegate {
    public func channelManager(_ channelManager: ChannelManager, failedToJoinChannel channelUUID: UUID, error: ChannelError) {}
    public func channelManager(_ channelManager: ChannelManager, failedToLeaveChannel channelUUID: UUID, error: ChannelError) {}
    public func channelManager(_ channelManager: ChannelManager, failedToBeginTransmittingInChannel channelUUID: UUID, error: ChannelError) {}
    public func channelManager(_ channelManager: ChannelManager, failedToStopTransmittingInChannel channelUUID: UUID, error: ChannelError) {}
    public func incomingServiceUpdatePush(channelManager: ChannelManager, channelUUID: UUID, pushPayload: [String: PushValue],
                                          isHighPriority: Bool, remainingHighPriorityBudget: Int,
                                          completion: @escaping @Sendable () -> Void) { completion() }
}

/// Gives the descriptor of a channel being restored when the manager's own record lacks it
/// (`PTChannelRestorationDelegate`). Must return at once, without network I/O.
public protocol ChannelRestorationDelegate: AnyObject, Sendable {
    func channelDescriptor(restoredChannelUUID channelUUID: UUID) -> ChannelDescriptor
}
