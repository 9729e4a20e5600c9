import APNs
import Foundation

/// Whether wake pushes are getting through, for `/healthz` and `squelch_push_failing`.
///
/// A wrong APNs key or topic, or an APNs host the server can't reach, leaves the voice service working
/// for everyone connected while nobody asleep is woken: the failure an operator otherwise learns of
/// from users. Only failures that say something about the server's side count: a configuration error
/// (one is proof enough: a wrong key, team or topic fails every push alike), or three in a row of
/// the kind that passes (no connection, timeouts, APNs's own 5xx, retries out of time) or of a token
/// refused before APNs has accepted anything (`BadDeviceToken`, `DeviceTokenNotForTopic`: a wrong
/// topic or host, or only one stale token, which must not flip the health alone). A dead or throttled
/// device token otherwise is that device's business and changes nothing. A delivery ends it.
///
/// A plain value: the dispatcher keeps it under its lock and stamps each result with the wall clock.
public struct PushHealth: Sendable, Equatable {
    /// Transient failures in a row, with no delivery between, before pushes count as failing.
    public static let transientFailuresToFail = 3

    public private(set) var failuresSinceDelivery = 0
    public private(set) var lastDelivered: Date?
    public private(set) var failingSince: Date?
    public private(set) var lastProblem: String?
    public private(set) var attempted = false

    public init() {}

    public var isFailing: Bool { failingSince != nil }

    public mutating func delivered(at time: Date) {
        attempted = true
        lastDelivered = time
        failuresSinceDelivery = 0
        failingSince = nil
        lastProblem = nil
    }

    public mutating func failed(_ failure: APNsPushFailure, at time: Date) {
        attempted = true
        guard let problem = Self.serverSideProblem(failure) else { return }
        failuresSinceDelivery += 1
        lastProblem = problem
        if failingSince == nil, Self.failsAtOnce(failure) || failuresSinceDelivery >= Self.transientFailuresToFail {
            failingSince = time
        }
    }

    /// A configuration error that is no single token's answer.
    static func failsAtOnce(_ failure: APNsPushFailure) -> Bool {
        guard failure.isConfigurationError else { return false }
        if case .rejected(let response) = failure.reason, response.reason == .badDeviceToken || response.reason == .deviceTokenNotForTopic {
            return false
        }
        return true
    }

    /// What a failure says is wrong on the server's side, in words an operator can act on; nil for a
    /// failure that is one device's (a dead, misdirected or throttled token) or the server stopping.
    static func serverSideProblem(_ failure: APNsPushFailure) -> String? {
        let label = failure.reason.label
        if failure.isConfigurationError {
            return "APNs refused the push as \(label): check the APNs key file, key ID, team ID, topic (<bundle id>.voip-ptt) and environment"
        }
        switch failure.reason {
        case .transport(let transport):
            switch transport {
            case .connectFailed(let detail):
                return "no connection to APNs (\(detail)): check the apns setting, DNS, the firewall towards port 443, and the CA file"
            case .connectionLost(let detail):
                return "the connection to APNs was lost mid-push (\(detail))"
            case .goAway, .timeout:
                return "APNs did not answer (\(label))"
            }
        case .budgetExhausted:
            return "pushes kept failing until their 2 s were spent (BudgetExhausted): APNs is unreachable or slow"
        case .signing(let detail):
            return "the APNs provider token could not be signed (\(detail)): check the .p8 key file"
        case .rejected(let response) where response.status >= 500:
            return "APNs answered \(response.status) \(label): Apple's side is failing; it usually passes"
        case .rejected, .tokenBackedOff, .request, .shutdown:
            return nil
        }
    }

    /// How `/healthz` shows it.
    public var status: AdminAPI.PushStatus {
        AdminAPI.PushStatus(status: isFailing ? "failing" : (attempted ? "ok" : "idle"),
                            reason: isFailing ? lastProblem : nil, failingSince: failingSince,
                            failuresSinceLastDelivery: failuresSinceDelivery, lastDelivered: lastDelivered)
    }
}
