import Foundation
// The fuzz build (Makefile) compiles RandomUUID.swift into its one module instead.
#if canImport(RandomUUID)
import RandomUUID
#endif

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

    public init(deviceToken: String, activeSpeaker: String?, channel: UUID, id: UUID = .randomVersion4()) {
        self.deviceToken = deviceToken
        self.activeSpeaker = activeSpeaker
        self.channel = channel
        self.id = id
    }

    /// Notifications sent together (a burst's wakes), their ids drawn at once.
    public static func batch(_ pushes: [(deviceToken: String, activeSpeaker: String?, channel: UUID)]) -> [PushToTalkNotification] {
        zip(pushes, UUID.randomVersion4(count: pushes.count)).map { push, id in
            PushToTalkNotification(deviceToken: push.deviceToken, activeSpeaker: push.activeSpeaker, channel: push.channel, id: id)
        }
    }

    /// Whether `other`'s body is the same as this one's (what it is about, not whom it is for).
    func hasSameBody(as other: PushToTalkNotification) -> Bool {
        activeSpeaker == other.activeSpeaker && channel == other.channel
    }

    /// True for the leave push sent when an admin removes the member or deletes the channel.
    public var isLeave: Bool { activeSpeaker == nil }

    /// The JSON body APNs gets, which squelchd's device push service hands its devices too.
    public func jsonBody() throws(APNsRequestError) -> [UInt8] { try APNsRequest.encodeBody(self) }
}

/// The largest body APNs accepts for a push other than VoIP (Apple documents 4 KB).
public let apnsMaximumPayloadBytes = 4096

/// A push as it goes on the wire: the `:path`, the header list and the JSON body.
///
/// Building it is pure, so the exact headers are testable without a connection.
public struct APNsRequest: Sendable {
    public var path: String
    public var topic: String
    public var body: [UInt8]
    public var apnsID: String

    /// Everything but the pseudo-headers and `authorization`, in the order sent.
    public var headers: [(String, String)] {
        var headers: [(String, String)] = []
        forEachHeader { headers.append(($0, $1)) }
        return headers
    }

    /// The same fields without an array of them (a push's wire headers are written straight from these).
    /// Priority 10 and expiration 0, because a wake that arrives late is worse than none (the talk burst
    /// is over by then).
    public func forEachHeader(_ body: (String, String) -> Void) {
        body("apns-push-type", "pushtotalk")
        body("apns-topic", topic)
        body("apns-priority", "10")
        body("apns-expiration", "0")
        body("apns-id", apnsID)
        body("content-type", "application/json")
    }

    /// Builds the `pushtotalk` request.
    /// - Parameter body: `notification`'s body, already encoded (`jsonBody()`): a burst's wakes all
    ///   carry the same speaker and channel, so one encoded body serves the lot.
    public static func pushToTalk(_ notification: PushToTalkNotification, topic: String,
                                  body: [UInt8]? = nil) throws(APNsRequestError) -> APNsRequest {
        guard isValidDeviceToken(notification.deviceToken) else {
            throw .invalidDeviceToken(notification.deviceToken)
        }
        let bytes: [UInt8]
        if let body { bytes = body } else { bytes = try encodeBody(notification) }
        return APNsRequest(path: "/3/device/\(notification.deviceToken.lowercased())", topic: topic,
                           body: bytes, apnsID: notification.id.lowercaseString)
    }

    static func encodeBody(_ notification: PushToTalkNotification) throws(APNsRequestError) -> [UInt8] {
        // Written directly rather than by JSONEncoder, which took a tenth of a push's CPU for these
        // three keys (sorted, as JSONEncoder's `.sortedKeys` wrote them; slashes unescaped).
        var bytes: [UInt8] = []
        bytes.reserveCapacity(64 + (notification.activeSpeaker?.utf8.count ?? 0))
        bytes.append(UInt8(ascii: "{"))
        if let speaker = notification.activeSpeaker {
            bytes.append(contentsOf: #""activeSpeaker":"#.utf8)
            appendJSONString(speaker, to: &bytes)
            bytes.append(UInt8(ascii: ","))
        }
        bytes.append(contentsOf: #""channel":"#.utf8)
        appendJSONString(notification.channel.lowercaseString, to: &bytes)
        if notification.isLeave { bytes.append(contentsOf: #","leave":true"#.utf8) }
        bytes.append(UInt8(ascii: "}"))
        guard bytes.count <= apnsMaximumPayloadBytes else { throw .payloadTooLarge(bytes: bytes.count) }
        return bytes
    }

    /// A JSON string (RFC 8259 §7): quotes, backslashes and control characters escaped, the rest as UTF-8.
    static func appendJSONString(_ string: String, to bytes: inout [UInt8]) {
        let hex = Array("0123456789abcdef".utf8)
        bytes.append(UInt8(ascii: "\""))
        for byte in string.utf8 {
            switch byte {
            case UInt8(ascii: "\""), UInt8(ascii: "\\"): bytes += [UInt8(ascii: "\\"), byte]
            case 0x0A: bytes += [UInt8(ascii: "\\"), UInt8(ascii: "n")]
            case 0x0D: bytes += [UInt8(ascii: "\\"), UInt8(ascii: "r")]
            case 0x09: bytes += [UInt8(ascii: "\\"), UInt8(ascii: "t")]
            case 0..<0x20: bytes += Array(#"\u00"#.utf8) + [hex[Int(byte >> 4)], hex[Int(byte & 0xF)]]
            default: bytes.append(byte)
            }
        }
        bytes.append(UInt8(ascii: "\""))
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

    public var description: String {
        switch self {
        case .payloadTooLarge(let bytes):
            return "the push body is \(bytes) bytes; APNs accepts at most \(apnsMaximumPayloadBytes). Shorten the speaker's display name."
        case .invalidDeviceToken(let token):
            return "the device token '\(token.prefix(40))' is not hex of even length (2-200 characters); the client registered a bad token"
        }
    }
}
