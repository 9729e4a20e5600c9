import Foundation

/// A push the simulator answered 200, as `acceptedPushes()` and `GET /v1/pushes` show it.
public struct APNsAcceptedPush: Codable, Sendable, Equatable {
    /// The `apns-id` of the response: the request's, or the one the simulator generated.
    public var apnsID: String
    /// Lowercase hex.
    public var token: String
    public var topic: String
    public var pushType: String
    public var priority: Int?
    public var expiration: Int?
    public var collapseID: String?
    /// The body as sent (JSON text, unless the client sent something else).
    public var body: String
    /// The `kid` and `iss` of the provider token that authorised it.
    public var keyID: String
    public var teamID: String
    /// Numbers the TCP connections from 1 in the order they were accepted.
    public var connection: Int
    public var streamID: Int
    public var receivedAt: Date

    public init(apnsID: String, token: String, topic: String, pushType: String, priority: Int?, expiration: Int?,
                collapseID: String?, body: String, keyID: String, teamID: String, connection: Int, streamID: Int,
                receivedAt: Date) {
        self.apnsID = apnsID
        self.token = token
        self.topic = topic
        self.pushType = pushType
        self.priority = priority
        self.expiration = expiration
        self.collapseID = collapseID
        self.body = body
        self.keyID = keyID
        self.teamID = teamID
        self.connection = connection
        self.streamID = streamID
        self.receivedAt = receivedAt
    }
}

/// A request the simulator answered with an error.
public struct APNsRejection: Codable, Sendable, Equatable {
    public var status: Int
    public var reason: String
    /// What followed `/3/device/` in the path, lowercased; nil when the path had no token.
    public var token: String?
    /// The `apns-id` of the response: the request's when it was a canonical UUID, else a generated one.
    public var apnsID: String?
    /// True when a fault plan chose this answer; false when the request itself was wrong.
    public var injected: Bool
    public var receivedAt: Date

    public init(status: Int, reason: String, token: String?, apnsID: String?, injected: Bool, receivedAt: Date) {
        self.status = status
        self.reason = reason
        self.token = token
        self.apnsID = apnsID
        self.injected = injected
        self.receivedAt = receivedAt
    }
}

/// Counters since start (or the last `clearLog()`).
public struct APNsSimulatorStats: Codable, Sendable, Equatable {
    /// Requests answered 200.
    public var accepted = 0
    /// Requests answered with an error, injected ones included.
    public var rejected = 0
    /// Rejections by `reason`, injected ones included.
    public var rejectedByReason: [String: Int] = [:]
    /// Rejections a fault plan chose.
    public var injected = 0
    /// Accepted pushes whose body was not a JSON object (Apple takes them; a correct client sends none).
    public var malformedBodies = 0
    /// TCP connections accepted on the APNs port.
    public var connectionsOpened = 0
    /// Connections open right now (not reset by `clearLog()`).
    public var connectionsOpen = 0
    /// GOAWAY frames the fault plan made the simulator send.
    public var goAwaysSent = 0
    /// The most streams one connection had open at once.
    public var maxStreamsInFlight = 0

    public init() {}
}
