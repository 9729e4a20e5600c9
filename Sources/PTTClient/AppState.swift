import ChannelProtocol
import Foundation

/// The app's state, which gates joining and transmitting as iOS does (foreground only).
public enum AppState: Sendable, Equatable {
    case foreground
    case background
}
