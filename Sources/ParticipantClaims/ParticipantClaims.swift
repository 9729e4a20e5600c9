import Foundation

/// What a participant may do in its channel.
public enum Capability: String, Codable, Sendable, CaseIterable, Comparable {
    case talk, listen
    public static func < (a: Self, b: Self) -> Bool { a.rawValue < b.rawValue }
}

/// The claims of a participant token (in the manner of Amazon IVS participant tokens): who, in which
/// channel, with which capabilities and attributes, until when.
public struct ParticipantClaims: Sendable, Equatable {
    public var userID: String
    public var name: String
    public var channel: UUID
    public var capabilities: Set<Capability>
    public var role: String?
    /// The participant's picture, an https URL: it travels in the roster, and a listener's app shows
    /// it with the active speaker (`Participant.image`).
    public var image: String?
    /// Floor priority, 0–255: a higher one pre-empts a lower one.
    public var priority: UInt8
    public var issuedAt: Date
    public var expiresAt: Date
    /// Unique per token (`jti`), for logs and revocation.
    public var tokenID: String

    public init(userID: String, name: String, channel: UUID, capabilities: Set<Capability>, role: String? = nil,
                image: String? = nil, priority: UInt8 = 0, issuedAt: Date = Date(), expiresAt: Date,
                tokenID: String = UUID().uuidString) {
        self.image = image
        self.userID = userID
        self.name = name
        self.channel = channel
        self.capabilities = capabilities
        self.role = role
        self.priority = priority
        self.issuedAt = issuedAt
        self.expiresAt = expiresAt
        self.tokenID = tokenID
    }

    /// Longest user id, in UTF-8 bytes (the control protocol's own limit for user ids).
    public static let maxUserIDBytes = 256
    /// Longest display name and role, in UTF-8 bytes. These travel in every roster entry, so they are
    /// kept short; the roster is split by size (`RosterChunker`), so any fits.
    public static let maxNameBytes = 64
    public static let maxRoleBytes = 64
    /// Longest image URL: it travels in every roster entry too.
    public static let maxImageBytes = 512
    public static let maxTokenIDBytes = 128
    /// Longest lifetime squelchd's issuers (`squelchd token issue`, the admin API) sign: a stolen
    /// token works until it expires or is revoked, and an app renews in place (`renew`), so long
    /// lifetimes buy nothing. Verification does not check it, so tokens issued before stay valid.
    public static let maxLifetime: TimeInterval = 30 * 86_400

    /// Checks the fields a token may carry; the message says which one and what is allowed.
    public func validate() throws(InvalidClaims) {
        func check(_ value: String, _ field: String, max: Int, empty: Bool = false) throws(InvalidClaims) {
            if !empty && value.isEmpty { throw InvalidClaims("\(field) is empty") }
            if value.utf8.count > max { throw InvalidClaims("\(field) is \(value.utf8.count) bytes; at most \(max)") }
            if value.unicodeScalars.contains(where: { $0.properties.generalCategory == .control }) {
                throw InvalidClaims("\(field) contains control characters")
            }
        }
        try check(userID, "the user id", max: Self.maxUserIDBytes)
        try check(name, "the name", max: Self.maxNameBytes)
        if let role { try check(role, "the role", max: Self.maxRoleBytes, empty: true) }
        if let image {
            try check(image, "the image URL", max: Self.maxImageBytes)
            // A URL the client may fetch: https only (no file:, no data: megabytes in every roster).
            guard let url = URL(string: image), url.scheme?.lowercased() == "https", url.host?.isEmpty == false else {
                throw InvalidClaims("the image URL '\(image)' is not an https URL; give one such as https://example.org/ann.png")
            }
        }
        try check(tokenID, "the token id", max: Self.maxTokenIDBytes)
        if capabilities.isEmpty { throw InvalidClaims("the token grants no capability (talk, listen)") }
    }

    /// What squelchd's issuers (`squelchd token issue`, the admin API) check before signing, over
    /// `validate`: what every roster shows must read as what it is. A user id or name of spaces
    /// shows as a blank entry; line separators and bidirectional overrides or isolates make a name
    /// display as something else (the same rules as channel names). Not part of `validate`, which
    /// verification also runs, so tokens issued before these rules still join.
    public func validateForIssue() throws(InvalidClaims) {
        try validate()
        func check(_ value: String, _ field: String) throws(InvalidClaims) {
            // Empty is `validate`'s to judge (a role may be); blank is spaces or characters that draw
            // nothing (zero-width, Hangul fillers, a blank Braille pattern).
            let invisible: Set<UInt32> = [0x115F, 0x1160, 0x2800, 0x3164, 0xFFA0]
            if !value.isEmpty, value.unicodeScalars.allSatisfy({ $0.properties.isWhitespace || $0.properties.generalCategory == .format
                                                                || invisible.contains($0.value) }) {
                throw InvalidClaims("\(field) is only spaces or invisible characters; give a visible one")
            }
            if value != value.trimmingCharacters(in: .whitespacesAndNewlines) {
                throw InvalidClaims("\(field) starts or ends with spaces; give it without them")
            }
            if value.unicodeScalars.contains(where: { $0 == "\u{2028}" || $0 == "\u{2029}" || (0x202A...0x202E).contains($0.value)
                                                   || (0x2066...0x2069).contains($0.value) }) {
                throw InvalidClaims("\(field) contains line separators or bidirectional text controls (U+2028-2029, U+202A-202E, U+2066-2069); use plain text")
            }
        }
        try check(userID, "the user id")
        try check(name, "the name")
        if let role { try check(role, "the role") }
    }
}

/// Claims no token may carry, with what is wrong in words for whoever asked for the token.
public struct InvalidClaims: Error, Sendable, CustomStringConvertible {
    public let message: String
    public init(_ message: String) { self.message = message }
    public var description: String { message }
}
