import APNs
import Foundation
import PTTServer
import Testing

/// When `/healthz` calls wake pushes failing: a configuration error at once, transient failures only
/// three in a row, a device's own dead or throttled token never; a delivery ends it.
@Suite struct PushHealthTests {
    let start = Date(timeIntervalSince1970: 1_800_000_000)

    func rejected(_ status: Int, _ reason: String, dropToken: Bool = false, configuration: Bool = false) -> APNsPushFailure {
        APNsPushFailure(reason: .rejected(APNsErrorResponse(status: status, rawReason: reason)), dropToken: dropToken,
                        isConfigurationError: configuration, attempts: 1)
    }

    @Test func aConfigurationErrorFailsAtOnceAndADeliveryEndsIt() {
        var health = PushHealth()
        #expect(health.status.status == "idle")
        health.failed(rejected(403, "InvalidProviderToken", configuration: true), at: start)
        #expect(health.isFailing)
        #expect(health.status.status == "failing")
        #expect(health.status.failingSince == start)
        #expect(health.status.reason?.contains("InvalidProviderToken") == true)
        #expect(health.status.reason?.contains("key ID") == true)
        health.delivered(at: start.addingTimeInterval(60))
        #expect(!health.isFailing)
        #expect(health.status == AdminAPI.PushStatus(status: "ok", reason: nil, failingSince: nil, failuresSinceLastDelivery: 0,
                                                     lastDelivered: start.addingTimeInterval(60)))
    }

    @Test func transientFailuresCountOnlyThreeInARow() {
        var health = PushHealth()
        let timeout = APNsPushFailure(reason: .transport(.timeout), attempts: 3)
        let unreachable = APNsPushFailure(reason: .budgetExhausted(last: .transport(.connectFailed("connection refused"))), attempts: 4)
        health.failed(timeout, at: start)
        health.failed(unreachable, at: start.addingTimeInterval(1))
        #expect(!health.isFailing, "two in a row may be a blip")
        health.delivered(at: start.addingTimeInterval(2))
        health.failed(timeout, at: start.addingTimeInterval(3))
        health.failed(timeout, at: start.addingTimeInterval(4))
        #expect(!health.isFailing, "the delivery started the count again")
        health.failed(rejected(503, "ServiceUnavailable"), at: start.addingTimeInterval(5))
        #expect(health.isFailing)
        #expect(health.status.failingSince == start.addingTimeInterval(5))
        #expect(health.status.failuresSinceLastDelivery == 3)
        #expect(health.status.reason?.contains("503") == true)
    }

    @Test func tokensRefusedBeforeAnyDeliveryFailItOnlyThreeInARow() {
        // Before APNs accepted anything, a refused token may mean a wrong topic (every token) or one
        // stale token: one alone must not flip the health.
        var health = PushHealth()
        let notForTopic = rejected(400, "DeviceTokenNotForTopic", configuration: true)
        health.failed(notForTopic, at: start)
        health.failed(notForTopic, at: start)
        #expect(!health.isFailing)
        health.failed(notForTopic, at: start.addingTimeInterval(1))
        #expect(health.isFailing)
        #expect(health.status.reason?.contains("topic") == true)
    }

    @Test func aDevicesOwnTokenProblemsChangeNothing() {
        var health = PushHealth()
        for _ in 0..<10 {
            health.failed(rejected(400, "BadDeviceToken", dropToken: true), at: start)
            health.failed(rejected(410, "Unregistered", dropToken: true), at: start)
            health.failed(rejected(429, "TooManyRequests"), at: start)
            health.failed(APNsPushFailure(reason: .tokenBackedOff, attempts: 0), at: start)
        }
        #expect(!health.isFailing)
        #expect(health.status.status == "ok")
        #expect(health.status.failuresSinceLastDelivery == 0)
    }
}
