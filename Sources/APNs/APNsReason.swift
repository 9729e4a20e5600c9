import Foundation

/// Every `reason` string APNs documents for a rejected request (Apple's "Handling notification
/// responses from APNs").
///
/// The raw values are Apple's exact spellings, so a reason can be used as a metric label as it is.
public enum APNsReason: String, Sendable, CaseIterable, Codable {
    case badCollapseId = "BadCollapseId"
    case badDeviceToken = "BadDeviceToken"
    case badExpirationDate = "BadExpirationDate"
    case badMessageId = "BadMessageId"
    case badPriority = "BadPriority"
    case badTopic = "BadTopic"
    case deviceTokenNotForTopic = "DeviceTokenNotForTopic"
    case duplicateHeaders = "DuplicateHeaders"
    case idleTimeout = "IdleTimeout"
    case invalidPushType = "InvalidPushType"
    case missingDeviceToken = "MissingDeviceToken"
    case missingTopic = "MissingTopic"
    case payloadEmpty = "PayloadEmpty"
    case topicDisallowed = "TopicDisallowed"
    case badCertificate = "BadCertificate"
    case badCertificateEnvironment = "BadCertificateEnvironment"
    case expiredProviderToken = "ExpiredProviderToken"
    case forbidden = "Forbidden"
    case invalidProviderToken = "InvalidProviderToken"
    case missingProviderToken = "MissingProviderToken"
    case unrelatedKeyIdInToken = "UnrelatedKeyIdInToken"
    case badEnvironmentKeyIdInToken = "BadEnvironmentKeyIdInToken"
    /// A second spelling seen in the wild for the same condition (APNSwift accepts both).
    case badEnvironmentKeyInToken = "BadEnvironmentKeyInToken"
    case badPath = "BadPath"
    case methodNotAllowed = "MethodNotAllowed"
    case expiredToken = "ExpiredToken"
    case unregistered = "Unregistered"
    case payloadTooLarge = "PayloadTooLarge"
    case tooManyProviderTokenUpdates = "TooManyProviderTokenUpdates"
    case tooManyRequests = "TooManyRequests"
    case internalServerError = "InternalServerError"
    case serviceUnavailable = "ServiceUnavailable"
    case shutdown = "Shutdown"

    /// The HTTP status APNs answers this reason with.
    public var status: Int {
        switch self {
        case .badCollapseId, .badDeviceToken, .badExpirationDate, .badMessageId, .badPriority, .badTopic,
             .deviceTokenNotForTopic, .duplicateHeaders, .idleTimeout, .invalidPushType, .missingDeviceToken,
             .missingTopic, .payloadEmpty, .topicDisallowed:
            return 400
        case .badCertificate, .badCertificateEnvironment, .expiredProviderToken, .forbidden, .invalidProviderToken,
             .missingProviderToken, .unrelatedKeyIdInToken, .badEnvironmentKeyIdInToken, .badEnvironmentKeyInToken:
            return 403
        case .badPath: return 404
        case .methodNotAllowed: return 405
        case .expiredToken, .unregistered: return 410
        case .payloadTooLarge: return 413
        case .tooManyProviderTokenUpdates, .tooManyRequests: return 429
        case .internalServerError: return 500
        case .serviceUnavailable, .shutdown: return 503
        }
    }
}

/// An error response from APNs as read off the wire: the status, and the body's `reason` and `timestamp`.
public struct APNsErrorResponse: Sendable, Equatable {
    public var status: Int
    /// Apple's reason string, verbatim. It may be one this build doesn't know yet.
    public var rawReason: String
    /// For 410 `Unregistered`: when the token stopped being valid, in milliseconds since 1970.
    public var timestamp: Int64?

    public init(status: Int, rawReason: String, timestamp: Int64? = nil) {
        self.status = status
        self.rawReason = rawReason
        self.timestamp = timestamp
    }

    /// The documented reason, or nil for one APNs added after this build.
    public var reason: APNsReason? { APNsReason(rawValue: rawReason) }

    /// Parses an error body (`{"reason":"…","timestamp":…}`). A body that isn't that shape still gives a
    /// response: the status alone decides the policy, so an unreadable body must not lose the status.
    public static func parse(status: Int, body: [UInt8]) -> APNsErrorResponse {
        struct Body: Decodable {
            var reason: String?
            var timestamp: Int64?
        }
        guard !body.isEmpty, body.count <= 4096,
              let decoded = try? JSONDecoder().decode(Body.self, from: Data(body)) else {
            return APNsErrorResponse(status: status, rawReason: "")
        }
        return APNsErrorResponse(status: status, rawReason: decoded.reason ?? "", timestamp: decoded.timestamp)
    }
}
