import Foundation

/// Which APNs to talk to.
public enum APNsEnvironment: Sendable, Equatable {
    /// `api.push.apple.com`, for App Store and TestFlight builds.
    case production
    /// `api.sandbox.push.apple.com`, for development builds (their tokens are sandbox tokens).
    case sandbox
    /// Any other server, such as the local simulator. With `caPath`, only that CA is trusted; without, the
    /// system trust store.
    case custom(host: String, port: Int, caPath: String?)

    public var host: String {
        switch self {
        case .production: return "api.push.apple.com"
        case .sandbox: return "api.sandbox.push.apple.com"
        case .custom(let host, _, _): return host
        }
    }

    public var port: Int {
        switch self {
        case .production, .sandbox: return 443
        case .custom(_, let port, _): return port
        }
    }

    /// One of Apple's two hosts. squelchd sends each token to the one of the environment its device
    /// registered it in (`APNsRoute`), so a `BadDeviceToken` there is never the setting's fault.
    public var isApple: Bool {
        if case .custom = self { return false }
        return true
    }
}

/// Everything the APNs client needs. The defaults suit `pushtotalk` wakes.
public struct APNsConfiguration: Sendable {
    public var environment: APNsEnvironment
    public var identity: APNsProviderIdentity
    /// `<bundle id>.voip-ptt`.
    public var topic: String
    /// Long-lived HTTP/2 connections kept open. Each carries up to the server's `MAX_CONCURRENT_STREAMS`.
    public var poolSize: Int
    /// Longest wait for one response. A push's attempts together are bounded by `retry.budget` as well.
    public var requestTimeout: Duration
    public var connectTimeout: Duration
    /// A connection that has read nothing for this long is PINGed…
    public var pingInterval: Duration
    /// …and closed if the PING isn't answered within this.
    public var pingTimeout: Duration
    public var retry: APNsRetryPolicy
    /// How long one provider JWT is reused (APNs: at least 20, at most 60 minutes).
    public var providerTokenLifetime: Duration
    /// Where a cluster's nodes share one provider JWT; nil: this process mints its own, one per connection.
    public var providerTokenShare: (any ProviderTokenShare)?
    /// The wall clock for the JWT's `iat`. Tests inject one to cross the hour without waiting.
    public var now: @Sendable () -> Date

    public init(environment: APNsEnvironment, identity: APNsProviderIdentity, topic: String, poolSize: Int = 2,
                requestTimeout: Duration = .seconds(2), connectTimeout: Duration = .seconds(3),
                pingInterval: Duration = .seconds(60), pingTimeout: Duration = .seconds(5),
                retry: APNsRetryPolicy = APNsRetryPolicy(), providerTokenLifetime: Duration = .seconds(50 * 60),
                providerTokenShare: (any ProviderTokenShare)? = nil, now: @escaping @Sendable () -> Date = { Date() }) {
        self.environment = environment
        self.identity = identity
        self.topic = topic
        self.poolSize = poolSize
        self.requestTimeout = requestTimeout
        self.connectTimeout = connectTimeout
        self.pingInterval = pingInterval
        self.pingTimeout = pingTimeout
        self.retry = retry
        self.providerTokenLifetime = providerTokenLifetime
        self.providerTokenShare = providerTokenShare
        self.now = now
    }

    /// Checks what can be checked before connecting, so a bad setting fails at start-up and not on the
    /// first burst.
    public func validate() throws(APNsConfigurationError) {
        guard poolSize >= 1, poolSize <= 64 else { throw .invalidSetting("poolSize must be 1-64, got \(poolSize)") }
        guard topic.hasSuffix(".voip-ptt"), topic.count > ".voip-ptt".count else {
            throw .invalidTopic(topic)
        }
        guard requestTimeout > .zero, connectTimeout > .zero, pingInterval > .zero, pingTimeout > .zero else {
            throw .invalidSetting("timeouts and the ping interval must be positive")
        }
        guard (Duration.seconds(20 * 60)...Duration.seconds(60 * 60)).contains(providerTokenLifetime) else {
            throw .invalidSetting("providerTokenLifetime must be 20-60 minutes (APNs rejects a JWT older than an hour and punishes changes more often than every 20 minutes)")
        }
    }
}

/// A configuration problem: nothing can be pushed until it is fixed, so it is never retried.
public enum APNsConfigurationError: Error, Sendable, Equatable, CustomStringConvertible {
    case unreadableKey(path: String)
    case invalidKey(String)
    case invalidIdentifiers(keyID: String, teamID: String)
    case unreadableCA(path: String)
    case invalidTopic(String)
    case invalidSetting(String)

    public var description: String {
        switch self {
        case .unreadableKey(let path):
            return "cannot read the APNs key \(path): download the .p8 from the Apple Developer account (Keys), or run `make certs` for the dev key"
        case .invalidKey(let detail):
            return "the APNs key is not an EC P-256 PKCS#8 PEM (.p8) key: \(detail)"
        case .invalidIdentifiers(let keyID, let teamID):
            return "APNs key ID '\(keyID)' and team ID '\(teamID)' must both be 10 characters, as in the Apple Developer account"
        case .unreadableCA(let path):
            return "cannot read the CA certificate \(path) for the APNs server: run `make certs` or pass the right --apns-ca"
        case .invalidTopic(let topic):
            return "APNs topic '\(topic)' must be '<bundle id>.voip-ptt' for pushtotalk pushes"
        case .invalidSetting(let detail):
            return "invalid APNs setting: \(detail)"
        }
    }
}
