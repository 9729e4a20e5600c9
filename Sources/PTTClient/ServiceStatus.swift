import ChannelProtocol
import Foundation

// Apple's PushToTalk value types, without the `PT` prefix and with Apple's raw values (as its
// headers declare them), so that code written against PushToTalk reads the same here.

/// Whether the channel's service can carry speech right now (`PTServiceStatus`).
public enum ServiceStatus: Int, Sendable, Codable, CaseIterable {
    case ready = 0
    case connecting = 1
    case unavailable = 2
}
