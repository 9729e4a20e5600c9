import ChannelProtocol
import Foundation

// Apple's PushToTalk value types, without the `PT` prefix and with Apple's raw values (as its
// headers declare them), so that code written against PushToTalk reads the same here.

/// An image for a channel or a participant. Apple's is a `UIImage`; here it is a URL (http, https, file
/// or a `data:image/png;base64,…` URL) that the app renders however it likes.
public struct ChannelImage: Sendable, Hashable, Codable {
    public var url: String
    public init(url: String) { self.url = url }
}

/// A channel's name and image as the system shows them (`PTChannelDescriptor`).
public struct ChannelDescriptor: Sendable, Hashable, Codable {
    public let name: String
    public let image: ChannelImage?
    public init(name: String, image: ChannelImage? = nil) {
        self.name = name
        self.image = image
    }
}
