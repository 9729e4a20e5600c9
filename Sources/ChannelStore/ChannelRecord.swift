import ChannelProtocol
import Foundation

/// A channel as stored and as the admin API shows it.
public struct ChannelRecord: Codable, Sendable, Equatable, Identifiable {
    public var id: UUID
    public var name: String
    /// An http(s) URL, or a small inline image as a `data:image/png;base64,…` URL (at most
    /// `ChannelRecord.maxImageBytes`).
    public var image: String?
    public var mode: TransmissionMode
    /// A talk burst longer than this is revoked.
    public var maxBurstSeconds: Int
    public var createdAt: Date
    public var updatedAt: Date

    public static let maxNameLength = 64
    /// Characters are counted as people see them, and one of them may hold any number of combining
    /// marks: the bytes are bounded too, so that a name and an inline image always fit the control
    /// message that carries them (`descriptor`, `joined`: 64 KiB).
    public static let maxNameBytes = 1_024
    public static let maxImageBytes = 16 * 1024
    public static let maxBurstRange = 1...600

    public init(id: UUID = UUID(), name: String, image: String? = nil, mode: TransmissionMode = .halfDuplex,
                maxBurstSeconds: Int = 60, createdAt: Date = Date(), updatedAt: Date = Date()) {
        self.id = id
        self.name = name
        self.image = image
        self.mode = mode
        self.maxBurstSeconds = maxBurstSeconds
        self.createdAt = createdAt
        self.updatedAt = updatedAt
    }

    /// Largest width and height of an inline image, in pixels: a channel icon, not a photo.
    public static let maxImagePixels = 1_024

    /// Checks the fields a user typed; the message says what to change.
    public func validate() throws(StoreError) {
        let trimmed = name.trimmingCharacters(in: .whitespacesAndNewlines)
        guard !trimmed.isEmpty, trimmed.count <= Self.maxNameLength else {
            throw .invalid("channel name must be 1-\(Self.maxNameLength) characters")
        }
        guard trimmed.utf8.count <= Self.maxNameBytes else {
            throw .invalid("channel name is \(trimmed.utf8.count) bytes of UTF-8; at most \(Self.maxNameBytes) (fewer combining marks)")
        }
        if let problem = Self.plainTextProblem(name) { throw .invalid("channel name contains \(problem); use plain text") }
        guard Self.maxBurstRange.contains(maxBurstSeconds) else {
            throw .invalid("maximum burst must be \(Self.maxBurstRange.lowerBound)-\(Self.maxBurstRange.upperBound) seconds, not \(maxBurstSeconds)")
        }
        if let image { try Self.validateImage(image) }
    }

    /// What keeps `text` from being shown as it is on a member's screen or terminal, if anything: a
    /// control character (an escape sequence, a line break) could rewrite a terminal or break a
    /// layout, and bidirectional overrides and isolates make text display as something else.
    public static func plainTextProblem(_ text: String) -> String? {
        if text.unicodeScalars.contains(where: { $0.properties.generalCategory == .control || $0 == "\u{2028}" || $0 == "\u{2029}" }) {
            return "control characters (escape sequences, tabs or line breaks)"
        }
        if text.unicodeScalars.contains(where: { (0x202A...0x202E).contains($0.value) || (0x2066...0x2069).contains($0.value) }) {
            return "bidirectional text controls (U+202A-202E, U+2066-2069)"
        }
        return nil
    }

    /// An image is an http(s) URL with a host, or a `data:image/png;base64,` URL whose bytes are a PNG
    /// (signature and header) of at most `maxImagePixels` a side: every client that joins receives and
    /// decodes it, so what isn't an image is refused here, where the operator can fix it.
    static func validateImage(_ image: String) throws(StoreError) {
        guard image.utf8.count <= maxImageBytes else {
            throw .invalid("channel image is \(image.utf8.count) bytes; inline images must be at most \(maxImageBytes) bytes, or use an https URL")
        }
        let lower = image.lowercased()
        let inlinePrefix = "data:image/png;base64,"
        if lower.hasPrefix(inlinePrefix) {
            guard let bytes = Data(base64Encoded: String(image.dropFirst(inlinePrefix.count))) else {
                throw .invalid("channel image's inline data is not base64; encode the PNG file with 'base64 -w0 icon.png'")
            }
            let size: (width: UInt32, height: UInt32)
            do throws(PNGHeaderError) { size = try PNGHeader.size(of: bytes) } catch {
                throw .invalid("channel image's inline data is not a PNG (\(error.description)); convert the image to PNG first")
            }
            guard size.width <= maxImagePixels, size.height <= maxImagePixels else {
                throw .invalid("channel image is \(size.width)×\(size.height) pixels; at most \(maxImagePixels)×\(maxImagePixels), so scale it down")
            }
            return
        }
        guard lower.hasPrefix("https://") || lower.hasPrefix("http://") else {
            throw .invalid("channel image must be an http(s) URL or a data:image/png;base64, URL")
        }
        guard !image.unicodeScalars.contains(where: { $0.properties.isWhitespace || $0.properties.generalCategory == .control }),
              let url = URL(string: image), let host = url.host, !host.isEmpty else {
            throw .invalid("channel image '\(image.prefix(80))' is not a valid URL; give one like https://example.com/icon.png")
        }
    }
}
