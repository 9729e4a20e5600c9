import ChannelProtocol
import Foundation

// Apple's PushToTalk value types, without the `PT` prefix and with Apple's raw values (as its
// headers declare them), so that code written against PushToTalk reads the same here.

/// A remote speaker (`PTParticipant`).
public struct Participant: Sendable, Hashable, Codable {
    public let name: String
    public let image: ChannelImage?

    /// Apple's header requires a name; an empty one is refused here rather than trapping as Objective-C
    /// would.
    public init(name: String, image: ChannelImage? = nil) throws(ParticipantError) {
        guard !name.isEmpty else { throw ParticipantError.emptyName }
        self.name = name
        self.image = image
    }
}

/// Why a `Participant` could not be made.
public enum ParticipantError: Error, Sendable, Equatable, CustomStringConvertible {
    case emptyName
    public var description: String { "a participant's name must not be empty" }
}
