import Foundation

/// One `pushtotalk` notification for one device token.
///
/// With a speaker it wakes the device and reports them as the active remote participant; without one it
/// tells the device to leave the channel (Apple: a pushtotalk push with no active remote participant means "leave").
public struct PushToTalkNotification: Sendable, Equatable {
    /// The ephemeral push token, as lowercase hex.
    public var deviceToken: String
    /// The speaker's display name, or nil for a leave push.
    public var activeSpeaker: String?
    /// The channel the push is about.
    public var channel: UUID
    /// Sent as `apns-id`; APNs echoes it back, so logs on both sides can be joined on it.
    public var id: UUID

    public init(deviceToken: String, activeSpeaker: String?, channel: UUID, id: UUID = UUID()) {
        self.deviceToken = deviceToken
        self.activeSpeaker = activeSpeaker
        self.channel = channel
        self.id = id
    }

    /// True for the leave push sent when an admin removes the member or deletes the channel.
    public var isLeave: Bool { activeSpeaker == nil }
}

/// The largest body APNs accepts for a push other than VoIP (Apple documents 4 KB).
public let apnsMaximumPayloadBytes = 4096

/// A push as it goes on the wire: the `:path`, the header list and the JSON body.
///
/// Building it is pure, so the exact headers are testable without a connection.
public struct APNsRequest: Sendable {
    public var path: String
    /// Everything but the pseudo-headers and `authorization`, in the order sent.
    public var headers: [(String, String)]
    public var body: [UInt8]
    public var apnsID: String

    /// Builds the `pushtotalk` request: priority 10 and expiration 0, because a wake that arrives late is
    /// worse than none (the talk burst is over by then).
    public static func pushToTalk(_ notification: PushToTalkNotification, topic: String) throws(APNsRequestError) -> APNsRequest {
        guard isValidDeviceToken(notification.deviceToken) else {
            throw .invalidDeviceToken(notification.deviceToken)
        }
        let body = try encodeBody(notification)
        let apnsID = notification.id.uuidString.lowercased()
        return APNsRequest(
            path: "/3/device/\(notification.deviceToken.lowercased())",
            headers: [
                ("apns-push-type", "pushtotalk"),
                ("apns-topic", topic),
                ("apns-priority", "10"),
                ("apns-expiration", "0"),
                ("apns-id", apnsID),
                ("content-type", "application/json"),
            ],
            body: body,
            apnsID: apnsID)
    }

    static func encodeBody(_ notification: PushToTalkNotification) throws(APNsRequestError) -> [UInt8] {
        struct Body: Encodable {
            var activeSpeaker: String?
            var channel: String
            var leave: Bool?
        }
        let body = Body(activeSpeaker: notification.activeSpeaker, channel: notification.channel.uuidString.lowercased(),
                        leave: notification.isLeave ? true : nil)
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        let bytes: [UInt8]
        do { bytes = Array(try encoder.encode(body)) } catch { throw .unencodable(String(describing: error)) }
        guard bytes.count <= apnsMaximumPayloadBytes else { throw .payloadTooLarge(bytes: bytes.count) }
        return bytes
    }

    /// Apple says tokens are of variable length: check only that it is hex, of even length, and not absurd.
    public static func isValidDeviceToken(_ token: String) -> Bool {
        let utf8 = token.utf8
        guard utf8.count >= 2, utf8.count <= 200, utf8.count % 2 == 0 else { return false }
        return utf8.allSatisfy { ($0 >= 0x30 && $0 <= 0x39) || ($0 >= 0x61 && $0 <= 0x66) || ($0 >= 0x41 && $0 <= 0x46) }
    }
}

/// A push refused before anything was sent.
public enum APNsRequestError: Error, Sendable, Equatable, CustomStringConvertible {
    case payloadTooLarge(bytes: Int)
    case invalidDeviceToken(String)
    case unencodable(String)

    public var description: String {
        switch self {
        case .payloadTooLarge(let bytes):
            return "the push body is \(bytes) bytes; APNs accepts at most \(apnsMaximumPayloadBytes). Shorten the speaker's display name."
        case .invalidDeviceToken(let token):
            return "the device token '\(token.prefix(40))' is not hex of even length (2-200 characters); the client registered a bad token"
        case .unencodable(let detail):
            return "the push body could not be encoded as JSON: \(detail)"
        }
    }
}
