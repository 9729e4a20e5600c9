import Foundation

/// What went wrong with one attempt below HTTP: no APNs status to go by.
public enum APNsTransportFailure: Sendable, Equatable {
    /// No TLS connection could be made.
    case connectFailed(String)
    /// The connection closed or failed with the request in flight.
    case connectionLost(String)
    /// APNs sent GOAWAY before it processed this stream, so the request is known not to have been handled.
    case goAway
    /// No response within the request timeout.
    case timeout
}

/// The result of one attempt, as the policy sees it.
public enum APNsAttemptResult: Sendable, Equatable {
    case accepted
    case rejected(APNsErrorResponse)
    case transport(APNsTransportFailure)
}

/// Timing knobs for delivery. The defaults follow the reference (§3, §6): a wake that arrives after the burst
/// has ended is useless, so all retries of one push fit in about two seconds.
public struct APNsRetryPolicy: Sendable, Equatable {
    /// All attempts of one push, backoff included, end within this.
    public var budget: Duration
    /// The first backoff; each retry doubles it up to `maximumBackoff`, then full jitter picks a point in it.
    public var initialBackoff: Duration
    public var maximumBackoff: Duration
    /// After 429 `TooManyRequests`, further pushes to that token fail fast for this long.
    public var tooManyRequestsBackoff: Duration

    public init(budget: Duration = .seconds(2), initialBackoff: Duration = .milliseconds(50),
                maximumBackoff: Duration = .milliseconds(800), tooManyRequestsBackoff: Duration = .seconds(30)) {
        self.budget = budget
        self.initialBackoff = initialBackoff
        self.maximumBackoff = maximumBackoff
        self.tooManyRequestsBackoff = tooManyRequestsBackoff
    }
}

/// Why a push ended without delivery. Its `label` is the metric label: Apple's reason string where there is one.
public enum APNsFailureReason: Sendable, Equatable {
    case rejected(APNsErrorResponse)
    case transport(APNsTransportFailure)
    /// The last attempt failed transiently and no time was left in the budget for another.
    case budgetExhausted(last: APNsAttemptResult)
    /// The token is in its `TooManyRequests` backoff; nothing was sent.
    case tokenBackedOff
    /// Refused before sending (body too large, bad token).
    case request(APNsRequestError)
    /// The provider token could not be signed (bad .p8); nothing can be sent until the configuration is fixed.
    case signing(String)
    /// The client was shut down.
    case shutdown

    public var label: String {
        switch self {
        case .rejected(let response):
            return response.reason?.rawValue ?? (response.rawReason.isEmpty ? "HTTP\(response.status)" : "Unknown")
        case .transport(let failure): return Self.label(failure)
        case .budgetExhausted: return "BudgetExhausted"
        case .tokenBackedOff: return "TokenBackedOff"
        case .request(.payloadTooLarge): return "PayloadTooLargeLocal"
        case .request: return "InvalidRequest"
        case .signing: return "SigningFailed"
        case .shutdown: return "ClientShutdown"
        }
    }

    static func label(_ failure: APNsTransportFailure) -> String {
        switch failure {
        case .connectFailed: return "ConnectFailed"
        case .connectionLost: return "ConnectionLost"
        case .goAway: return "GoAway"
        case .timeout: return "Timeout"
        }
    }
}

/// What the policy says to do next with a push.
public enum APNsNextStep: Sendable, Equatable {
    case delivered
    /// Try again after `delay`. With `refreshProviderToken`, mint a new JWT first.
    case retry(after: Duration, refreshProviderToken: Bool)
    case failed(APNsPushFailure)
}

/// A push that ended without delivery, with what the caller must do about it.
public struct APNsPushFailure: Error, Sendable, Equatable, CustomStringConvertible {
    public var reason: APNsFailureReason
    /// The device token is dead: forget it, and don't push to it again.
    public var dropToken: Bool
    /// Retrying can't help until someone fixes the configuration (key, team, topic, environment).
    public var isConfigurationError: Bool
    /// Further pushes to this token should wait this long (429 `TooManyRequests`).
    public var backOffToken: Duration?
    public var attempts: Int

    public init(reason: APNsFailureReason, dropToken: Bool = false, isConfigurationError: Bool = false,
                backOffToken: Duration? = nil, attempts: Int) {
        self.reason = reason
        self.dropToken = dropToken
        self.isConfigurationError = isConfigurationError
        self.backOffToken = backOffToken
        self.attempts = attempts
    }

    public var description: String {
        var text = "push failed after \(attempts) attempt(s): \(reason.label)"
        if dropToken { text += " (token dropped)" }
        if isConfigurationError { text += " (configuration error: check the APNs key ID, team ID, topic and environment)" }
        return text
    }
}

/// The failure policy for one push, as a sans-I/O state machine: attempt results and elapsed time in,
/// the next step out. The caller owns the clock, the randomness and the sending.
public struct APNsDeliveryAttempts: Sendable {
    public let policy: APNsRetryPolicy
    /// When the device registered the token; a 410 `Unregistered` only kills it if APNs saw it die later.
    public let tokenRegisteredAt: Date?
    /// Whether APNs has shown that the topic and host are right: it accepted a push, or called a token
    /// `Unregistered` (which it can only know of a token of this topic). Until then, a token refused
    /// as `DeviceTokenNotForTopic` (or, on a host that takes every token, `BadDeviceToken`) is kept
    /// and the failure is called a configuration error: a mistyped bundle ID gets that answer for
    /// every token, as does a host of the wrong environment, and dropping them all would take every
    /// member's wake-ups with it until each device registers again. Once proven, the answer is the
    /// token's own. The caller updates it before each `next(after:…)`, since pushes run side by side.
    public var configurationProven: Bool
    /// Each token goes to the host of the environment its device registered it in (Apple's two hosts),
    /// so no setting makes every token `BadDeviceToken`: that answer is the token's (or its app's)
    /// fault and drops it even before the proof.
    public let environmentChosenPerToken: Bool
    public private(set) var attempts = 0
    private var refreshedProviderToken = false

    public init(policy: APNsRetryPolicy, tokenRegisteredAt: Date?, configurationProven: Bool = true,
                environmentChosenPerToken: Bool = false) {
        self.policy = policy
        self.tokenRegisteredAt = tokenRegisteredAt
        self.configurationProven = configurationProven
        self.environmentChosenPerToken = environmentChosenPerToken
    }

    /// Whether this answer shows the topic and host are right (see `configurationProven`).
    public static func provesConfiguration(_ result: APNsAttemptResult) -> Bool {
        switch result {
        case .accepted: return true
        case .rejected(let response): return response.reason == .unregistered
        case .transport: return false
        }
    }

    /// Decides what follows an attempt.
    /// - Parameters:
    ///   - elapsed: time since the push was first tried.
    ///   - random: uniform in [0, 1), for the jitter.
    public mutating func next(after result: APNsAttemptResult, elapsed: Duration, random: Double) -> APNsNextStep {
        attempts += 1
        switch result {
        case .accepted:
            return .delivered
        case .transport:
            return retryOrGiveUp(result, elapsed: elapsed, random: random)
        case .rejected(let response):
            return decide(response, result: result, elapsed: elapsed, random: random)
        }
    }

    private mutating func decide(_ response: APNsErrorResponse, result: APNsAttemptResult, elapsed: Duration,
                                 random: Double) -> APNsNextStep {
        switch response.reason {
        case .badDeviceToken, .deviceTokenNotForTopic:
            let trusted = configurationProven || (response.reason == .badDeviceToken && environmentChosenPerToken)
            return .failed(APNsPushFailure(reason: .rejected(response), dropToken: trusted,
                                           isConfigurationError: !trusted, attempts: attempts))
        case .expiredToken:
            return .failed(APNsPushFailure(reason: .rejected(response), dropToken: true, attempts: attempts))
        case .unregistered:
            return .failed(APNsPushFailure(reason: .rejected(response), dropToken: unregisteredAfterRegistration(response),
                                           attempts: attempts))
        case .expiredProviderToken:
            // APNs already refuses the current JWT, so replacing it can't cost a working token; but only once,
            // because a fresh JWT that is still "expired" means the clock is wrong, which retrying won't fix.
            guard !refreshedProviderToken else {
                return .failed(APNsPushFailure(reason: .rejected(response), isConfigurationError: true, attempts: attempts))
            }
            // All attempts of a push end within the budget, this one too: a wake that late is useless.
            guard elapsed < policy.budget else {
                return .failed(APNsPushFailure(reason: .budgetExhausted(last: result), attempts: attempts))
            }
            refreshedProviderToken = true
            return .retry(after: .zero, refreshProviderToken: true)
        case .tooManyRequests:
            return .failed(APNsPushFailure(reason: .rejected(response), backOffToken: policy.tooManyRequestsBackoff,
                                           attempts: attempts))
        case .tooManyProviderTokenUpdates, .internalServerError, .serviceUnavailable, .shutdown, .idleTimeout:
            // Transient: the JWT stays as it is (changing it again is what TooManyProviderTokenUpdates punishes).
            return retryOrGiveUp(result, elapsed: elapsed, random: random)
        case .some:
            return .failed(APNsPushFailure(reason: .rejected(response), isConfigurationError: true, attempts: attempts))
        case nil:
            // A reason newer than this build: the status class is all there is to go on.
            if response.status >= 500 { return retryOrGiveUp(result, elapsed: elapsed, random: random) }
            return .failed(APNsPushFailure(reason: .rejected(response), isConfigurationError: response.status != 429,
                                           attempts: attempts))
        }
    }

    private func unregisteredAfterRegistration(_ response: APNsErrorResponse) -> Bool {
        guard let registered = tokenRegisteredAt, let timestamp = response.timestamp else { return true }
        return Double(timestamp) / 1000 > registered.timeIntervalSince1970
    }

    private func retryOrGiveUp(_ result: APNsAttemptResult, elapsed: Duration, random: Double) -> APNsNextStep {
        let delay = backoff(random: random)
        guard elapsed + delay < policy.budget else {
            return .failed(APNsPushFailure(reason: .budgetExhausted(last: result), attempts: attempts))
        }
        return .retry(after: delay, refreshProviderToken: false)
    }

    /// Exponential backoff with full jitter: retries from many pushes that failed together spread out
    /// instead of hitting APNs again in one wave.
    func backoff(random: Double) -> Duration {
        let exponent = min(max(attempts - 1, 0), 16)
        let ceiling = min(policy.initialBackoff * (1 << exponent), policy.maximumBackoff)
        return ceiling * min(max(random, 0), 1)
    }
}

/// Tokens in their `TooManyRequests` backoff. Pure state; the caller passes the time.
public struct APNsTokenBackoff: Sendable {
    private var until: [String: ContinuousClock.Instant] = [:]

    public init() {}

    public func isBackedOff(_ token: String, now: ContinuousClock.Instant) -> Bool {
        guard let end = until[token] else { return false }
        return now < end
    }

    public mutating func backOff(_ token: String, for duration: Duration, now: ContinuousClock.Instant) {
        until[token] = now + duration
        // Expired entries go on each insert, so the table stays as large as the tokens currently backed off.
        if until.count > 64 { until = until.filter { $0.value > now } }
    }

    public var count: Int { until.count }
}
