import Foundation

// squelchd's device push service: how a device that Apple doesn't serve (a Linux walkie) takes its
// wake-ups. It holds one HTTPS GET open to the voice host, on TCP at the voice port's number unless
// the server says otherwise, authenticated with its participant token:
//
//   GET /v1/device-pushes/stream?token=<push token, hex>
//   Authorization: Bearer <participant token>
//
// The answer is NDJSON: first `DevicePushSubscribed`, then one `DevicePushDelivery` per push, and an
// empty line every `keepaliveSeconds`. The subscription is bound to the token's user and channel: a
// push goes only to a stream opened with a participant token of the member it is for. The server
// ends the stream when the participant token expires (the device opens it again with its renewed
// token); refusals are JSON `{"error": "…"}`: 400 (a push token that isn't hex), 401 (no, a forged
// or an expired participant token), 403 (revoked, or its channel is gone), 409 (another member's
// stream holds the push token: make a new one) and 503 (the server is stopping, is full, or can't
// read its database).
public enum DevicePushProtocol {
    public static let streamPath = "/v1/device-pushes/stream"
    /// How often the server sends a keepalive line.
    public static let keepaliveSeconds: Int64 = 20
    /// A device takes a stream silent for this long (three keepalives) for dead and opens another.
    public static let silenceLimitSeconds: Int64 = 60

    /// The request path for `token` (lowercase hex).
    public static func path(token: String) -> String { "\(streamPath)?token=\(token)" }

    /// Dates as ISO 8601, on both ends.
    public static func decoder() -> JSONDecoder {
        let decoder = JSONDecoder()
        decoder.dateDecodingStrategy = .iso8601
        return decoder
    }

    public static func encoder() -> JSONEncoder {
        let encoder = JSONEncoder()
        encoder.dateEncodingStrategy = .iso8601
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return encoder
    }
}

/// The stream's first line: the subscription is live, and lasts until `expiresAt` (the participant
/// token's expiry) at most.
public struct DevicePushSubscribed: Codable, Sendable, Equatable {
    public var subscribed: String
    public var channel: UUID
    public var user: String
    public var expiresAt: Date

    public init(subscribed: String, channel: UUID, user: String, expiresAt: Date) {
        self.subscribed = subscribed
        self.channel = channel
        self.user = user
        self.expiresAt = expiresAt
    }
}

/// One push on the stream: the same JSON body an iPhone gets from APNs, so one parser reads both.
public struct DevicePushDelivery: Codable, Sendable, Equatable {
    /// The push's id (what APNs calls `apns-id`), for joining the server's and the device's logs.
    public var id: String
    /// The `pushtotalk` JSON body.
    public var body: String
    /// 10, as every wake is sent.
    public var priority: Int

    public init(id: String, body: String, priority: Int = 10) {
        self.id = id
        self.body = body
        self.priority = priority
    }
}
