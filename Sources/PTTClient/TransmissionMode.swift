import ChannelProtocol
import Foundation

// Apple's PushToTalk value types, without the `PT` prefix and with Apple's raw values (as its
// headers declare them), so that code written against PushToTalk reads the same here.

/// How the channel carries speech (`PTTransmissionMode`).
public enum TransmissionMode: Int, Sendable, Codable, CaseIterable {
    case fullDuplex = 0
    case halfDuplex = 1
    case listenOnly = 2
}
