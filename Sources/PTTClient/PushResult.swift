import ChannelProtocol
import Foundation

// Apple's PushToTalk value types, without the `PT` prefix and with Apple's raw values (as its
// headers declare them), so that code written against PushToTalk reads the same here.

/// What the app decides for an incoming push (`PTPushResult`): exactly one of two, never nothing.
public enum PushResult: Sendable, Hashable {
    /// Someone is speaking: the channel shows them, activates audio and plays the burst.
    case activeRemoteParticipant(Participant)
    /// Leave the channel: the push token dies with it.
    case leaveChannel
}
