import Foundation
import Testing
@testable import APNs
import RandomUUID

/// The failure policy is a pure state machine, so every branch is checked here without a network; the
/// same branches run again against the simulator in APNsClientTests.
@Suite struct DeliveryPolicyTests {
    let policy = APNsRetryPolicy(budget: .seconds(2), initialBackoff: .milliseconds(50), maximumBackoff: .milliseconds(800))

    func rejected(_ reason: APNsReason, timestamp: Int64? = nil) -> APNsAttemptResult {
        .rejected(APNsErrorResponse(status: reason.status, rawReason: reason.rawValue, timestamp: timestamp))
    }

    @Test func acceptedIsDelivered() {
        var attempts = APNsDeliveryAttempts(policy: policy, tokenRegisteredAt: nil)
        #expect(attempts.next(after: .accepted, elapsed: .zero, random: 0.5) == .delivered)
        #expect(attempts.attempts == 1)
    }

    @Test(arguments: [APNsReason.badDeviceToken, .deviceTokenNotForTopic, .expiredToken])
    func deadTokensAreDropped(reason: APNsReason) {
        var attempts = APNsDeliveryAttempts(policy: policy, tokenRegisteredAt: Date())
        guard case .failed(let failure) = attempts.next(after: rejected(reason), elapsed: .zero, random: 0.5) else {
            Issue.record("expected failure"); return
        }
        #expect(failure.dropToken)
        #expect(!failure.isConfigurationError)
        #expect(failure.reason.label == reason.rawValue)
    }

    @Test(arguments: [APNsReason.badDeviceToken, .deviceTokenNotForTopic])
    func beforeAnyPushIsAcceptedATokenVerdictMayBeTheSettingsFault(reason: APNsReason) {
        var attempts = APNsDeliveryAttempts(policy: policy, tokenRegisteredAt: Date(), configurationProven: false)
        guard case .failed(let failure) = attempts.next(after: rejected(reason), elapsed: .zero, random: 0.5) else {
            Issue.record("expected failure"); return
        }
        #expect(!failure.dropToken, "a wrong topic or environment must not cost every member their token")
        #expect(failure.isConfigurationError)
        #expect(failure.attempts == 1, "no retry: the same request gets the same answer")
        // A token that expired is the token's own fault whatever the settings.
        var expired = APNsDeliveryAttempts(policy: policy, tokenRegisteredAt: Date(), configurationProven: false)
        guard case .failed(let gone) = expired.next(after: rejected(.expiredToken), elapsed: .zero, random: 0.5) else {
            Issue.record("expected failure"); return
        }
        #expect(gone.dropToken)
    }

    /// On Apple's hosts each token goes to its own environment's host: no setting makes every token
    /// BadDeviceToken there, so that answer drops the token before the proof. A wrong topic still can.
    @Test func withTheEnvironmentChosenPerTokenABadDeviceTokenIsTheTokens() {
        var bad = APNsDeliveryAttempts(policy: policy, tokenRegisteredAt: Date(), configurationProven: false,
                                       environmentChosenPerToken: true)
        guard case .failed(let dropped) = bad.next(after: rejected(.badDeviceToken), elapsed: .zero, random: 0.5) else {
            Issue.record("expected failure"); return
        }
        #expect(dropped.dropToken && !dropped.isConfigurationError)
        var topic = APNsDeliveryAttempts(policy: policy, tokenRegisteredAt: Date(), configurationProven: false,
                                         environmentChosenPerToken: true)
        guard case .failed(let kept) = topic.next(after: rejected(.deviceTokenNotForTopic), elapsed: .zero, random: 0.5) else {
            Issue.record("expected failure"); return
        }
        #expect(!kept.dropToken && kept.isConfigurationError)
    }

    @Test func anAcceptedPushOrAnUnregisteredTokenProvesTheTopic() {
        #expect(APNsDeliveryAttempts.provesConfiguration(.accepted))
        #expect(APNsDeliveryAttempts.provesConfiguration(rejected(.unregistered, timestamp: 1)))
        #expect(!APNsDeliveryAttempts.provesConfiguration(rejected(.deviceTokenNotForTopic)))
        #expect(!APNsDeliveryAttempts.provesConfiguration(rejected(.badDeviceToken)))
        #expect(!APNsDeliveryAttempts.provesConfiguration(rejected(.serviceUnavailable)))
    }

    @Test func unregisteredDropsOnlyATokenThatDiedAfterItsRegistration() {
        let registered = Date(timeIntervalSince1970: 1_700_000_000)
        let before = Int64(registered.timeIntervalSince1970 * 1000) - 60_000
        let after = Int64(registered.timeIntervalSince1970 * 1000) + 60_000
        var old = APNsDeliveryAttempts(policy: policy, tokenRegisteredAt: registered)
        var new = APNsDeliveryAttempts(policy: policy, tokenRegisteredAt: registered)
        guard case .failed(let kept) = old.next(after: rejected(.unregistered, timestamp: before), elapsed: .zero, random: 0),
              case .failed(let dropped) = new.next(after: rejected(.unregistered, timestamp: after), elapsed: .zero, random: 0) else {
            Issue.record("expected failures"); return
        }
        #expect(!kept.dropToken, "the device re-registered after APNs saw the token die")
        #expect(dropped.dropToken)
    }

    @Test func expiredProviderTokenRefreshesOnceThenGivesUp() {
        var attempts = APNsDeliveryAttempts(policy: policy, tokenRegisteredAt: nil)
        #expect(attempts.next(after: rejected(.expiredProviderToken), elapsed: .zero, random: 0.5)
                == .retry(after: .zero, refreshProviderToken: true))
        guard case .failed(let failure) = attempts.next(after: rejected(.expiredProviderToken), elapsed: .milliseconds(5), random: 0.5) else {
            Issue.record("a second ExpiredProviderToken must end the push"); return
        }
        #expect(failure.isConfigurationError)
        #expect(failure.attempts == 2)
        // Past the budget already (a first attempt that took that long): no retry, not even this one
        // (found by the apns-response fuzz target once its attempts could take seconds).
        var late = APNsDeliveryAttempts(policy: policy, tokenRegisteredAt: nil)
        #expect(late.next(after: rejected(.expiredProviderToken), elapsed: .seconds(3), random: 0.5)
                == .failed(APNsPushFailure(reason: .budgetExhausted(last: rejected(.expiredProviderToken)), attempts: 1)))
    }

    @Test func tooManyRequestsBacksOffTheToken() {
        var attempts = APNsDeliveryAttempts(policy: policy, tokenRegisteredAt: nil)
        guard case .failed(let failure) = attempts.next(after: rejected(.tooManyRequests), elapsed: .zero, random: 0.5) else {
            Issue.record("expected failure"); return
        }
        #expect(failure.backOffToken == policy.tooManyRequestsBackoff)
        #expect(!failure.dropToken && !failure.isConfigurationError)
    }

    @Test(arguments: [APNsReason.internalServerError, .serviceUnavailable, .shutdown, .tooManyProviderTokenUpdates, .idleTimeout])
    func transientRejectionsRetryWithoutANewJWT(reason: APNsReason) {
        var attempts = APNsDeliveryAttempts(policy: policy, tokenRegisteredAt: nil)
        guard case .retry(let delay, let refresh) = attempts.next(after: rejected(reason), elapsed: .zero, random: 0.5) else {
            Issue.record("expected a retry for \(reason)"); return
        }
        #expect(!refresh)
        #expect(delay == .milliseconds(25), "first backoff is 50 ms with the jitter at one half")
    }

    @Test(arguments: [APNsTransportFailure.goAway, .timeout, .connectionLost("reset"), .connectFailed("refused")])
    func transportFailuresRetry(failure: APNsTransportFailure) {
        var attempts = APNsDeliveryAttempts(policy: policy, tokenRegisteredAt: nil)
        guard case .retry = attempts.next(after: .transport(failure), elapsed: .zero, random: 0.3) else {
            Issue.record("expected a retry"); return
        }
    }

    @Test func backoffDoublesUpToTheMaximum() {
        var attempts = APNsDeliveryAttempts(policy: APNsRetryPolicy(budget: .seconds(100)), tokenRegisteredAt: nil)
        var delays: [Duration] = []
        for _ in 0..<7 {
            if case .retry(let delay, _) = attempts.next(after: rejected(.serviceUnavailable), elapsed: .zero, random: 0.999_999) {
                delays.append(delay)
            }
        }
        let ms = delays.map { Int(($0 / .milliseconds(1)).rounded()) }
        #expect(ms == [50, 100, 200, 400, 800, 800, 800])
    }

    @Test func retriesStopAtTheBudget() {
        var attempts = APNsDeliveryAttempts(policy: policy, tokenRegisteredAt: nil)
        guard case .failed(let failure) = attempts.next(after: rejected(.serviceUnavailable), elapsed: .milliseconds(1990), random: 0.9) else {
            Issue.record("no time is left for another attempt"); return
        }
        #expect(failure.reason == .budgetExhausted(last: rejected(.serviceUnavailable)))
        #expect(failure.reason.label == "BudgetExhausted")
    }

    @Test(arguments: APNsReason.allCases.filter {
        ![.badDeviceToken, .deviceTokenNotForTopic, .expiredToken, .unregistered, .expiredProviderToken, .tooManyRequests,
          .internalServerError, .serviceUnavailable, .shutdown, .tooManyProviderTokenUpdates, .idleTimeout].contains($0)
    })
    func everyOtherReasonIsAConfigurationErrorNeverRetried(reason: APNsReason) {
        var attempts = APNsDeliveryAttempts(policy: policy, tokenRegisteredAt: nil)
        guard case .failed(let failure) = attempts.next(after: rejected(reason), elapsed: .zero, random: 0.5) else {
            Issue.record("\(reason) must not be retried"); return
        }
        #expect(failure.isConfigurationError)
        #expect(!failure.dropToken)
    }

    @Test func unknownReasonsFollowTheStatusClass() {
        var server = APNsDeliveryAttempts(policy: policy, tokenRegisteredAt: nil)
        var client = APNsDeliveryAttempts(policy: policy, tokenRegisteredAt: nil)
        let newServerError = APNsAttemptResult.rejected(APNsErrorResponse(status: 502, rawReason: "SomethingNew"))
        let newClientError = APNsAttemptResult.rejected(APNsErrorResponse(status: 400, rawReason: "SomethingNew"))
        guard case .retry = server.next(after: newServerError, elapsed: .zero, random: 0.5),
              case .failed(let failure) = client.next(after: newClientError, elapsed: .zero, random: 0.5) else {
            Issue.record("5xx retries, 4xx does not"); return
        }
        #expect(failure.reason.label == "Unknown")
    }

    @Test func tokenBackoffExpires() {
        var table = APNsTokenBackoff()
        let now = ContinuousClock.now
        table.backOff("abcd", for: .seconds(30), now: now)
        #expect(table.isBackedOff("abcd", now: now + .seconds(29)))
        #expect(!table.isBackedOff("abcd", now: now + .seconds(30)))
        #expect(!table.isBackedOff("ef01", now: now))
    }

    @Test func errorBodiesParse() {
        let body = Array(#"{"reason":"Unregistered","timestamp":1700000000123}"#.utf8)
        let parsed = APNsErrorResponse.parse(status: 410, body: body)
        #expect(parsed.reason == .unregistered)
        #expect(parsed.timestamp == 1_700_000_000_123)
        let garbage = APNsErrorResponse.parse(status: 503, body: Array("<html>".utf8))
        #expect(garbage.status == 503 && garbage.rawReason.isEmpty && garbage.reason == nil)
    }

    @Test func everyReasonHasItsDocumentedStatus() {
        #expect(APNsReason.allCases.count == 33)
        #expect(APNsReason.unregistered.status == 410)
        #expect(APNsReason.tooManyProviderTokenUpdates.status == 429)
        #expect(APNsReason.shutdown.status == 503)
        #expect(APNsReason.methodNotAllowed.status == 405)
        #expect(APNsReason.payloadTooLarge.status == 413)
    }
}

@Suite struct ProviderTokenScheduleTests {
    @Test func reusesForFiftyMinutesThenRefreshes() {
        var schedule = ProviderTokenSchedule()
        let t0 = Date(timeIntervalSince1970: 1_000_000)
        #expect(schedule.needsNewToken(now: t0))
        schedule.issued(at: t0)
        #expect(!schedule.needsNewToken(now: t0.addingTimeInterval(49 * 60)))
        #expect(schedule.needsNewToken(now: t0.addingTimeInterval(50 * 60)))
        #expect(schedule.needsNewToken(now: t0.addingTimeInterval(-5)), "a clock that went back mints afresh")
    }

    @Test func onlyTheRejectedGenerationIsReplaced() {
        var schedule = ProviderTokenSchedule()
        schedule.issued(at: Date())
        let rejected = schedule.generation
        #expect(schedule.shouldReplace(generation: rejected))
        schedule.issued(at: Date())
        #expect(!schedule.shouldReplace(generation: rejected), "another push already replaced it")
    }
}

@Suite struct PushRequestTests {
    @Test func headersAreExactlyThePushToTalkSet() throws {
        let id = UUID()
        let channel = UUID()
        let request = try APNsRequest.pushToTalk(
            PushToTalkNotification(deviceToken: "ABCDEF0123", activeSpeaker: "Alice", channel: channel, id: id),
            topic: "com.example.walkie.voip-ptt")
        #expect(request.path == "/3/device/abcdef0123")
        let headers = Dictionary(uniqueKeysWithValues: request.headers)
        #expect(headers["apns-push-type"] == "pushtotalk")
        #expect(headers["apns-topic"] == "com.example.walkie.voip-ptt")
        #expect(headers["apns-priority"] == "10")
        #expect(headers["apns-expiration"] == "0")
        #expect(headers["apns-id"] == id.uuidString.lowercased())
        let body = try JSONSerialization.jsonObject(with: Data(request.body)) as? [String: Any]
        #expect(body?["activeSpeaker"] as? String == "Alice")
        #expect(body?["channel"] as? String == channel.uuidString.lowercased())
        #expect(body?["leave"] == nil)
    }

    /// The body is written by hand: any display name must come out as the JSON string it is, and a plain
    /// one byte for byte as JSONEncoder wrote it before.
    @Test func speakerNamesOfAnyKindSurviveTheBody() throws {
        let channel = UUID()
        let names = ["Alice", #"Bob "the builder" \ O'Neil"#, "line\nbreak\ttab\r", "bell\u{07}nul\u{00}esc\u{1B}del\u{7F}",
                     "Zoë 🚒 Łódź / 東京", "a/b", ""]
        for name in names {
            let request = try APNsRequest.pushToTalk(PushToTalkNotification(deviceToken: "abcd", activeSpeaker: name, channel: channel),
                                                     topic: "a.voip-ptt")
            let body = try #require(try JSONSerialization.jsonObject(with: Data(request.body)) as? [String: Any])
            #expect(body["activeSpeaker"] as? String == name)
            #expect(body["channel"] as? String == channel.uuidString.lowercased())
            #expect(body.count == 2)
        }
        struct Body: Encodable { var activeSpeaker: String; var channel: String }
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        let expected = try encoder.encode(Body(activeSpeaker: "Zoë / Alice", channel: channel.uuidString.lowercased()))
        let request = try APNsRequest.pushToTalk(PushToTalkNotification(deviceToken: "abcd", activeSpeaker: "Zoë / Alice", channel: channel),
                                                 topic: "a.voip-ptt")
        #expect(request.body == Array(expected))
    }

    @Test func apnsIDsAreRandomVersion4UUIDs() {
        let ids = (0..<1_000).map { _ in UUID.randomVersion4() }
        #expect(Set(ids).count == ids.count)
        for id in ids + [UUID(), UUID(uuid: (0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 0xFF))] {
            #expect(id.lowercaseString == id.uuidString.lowercased())
        }
        for id in ids {
            #expect(id.uuid.6 >> 4 == 4, "version 4")
            #expect(id.uuid.8 >> 6 == 0b10, "RFC 9562 variant")
        }
    }

    @Test func aBatchsIDsAreDistinctRandomVersion4UUIDs() {
        let ids = UUID.randomVersion4(count: 1_000) + UUID.randomVersion4(count: 1_000)
        #expect(ids.count == 2_000)
        #expect(Set(ids).count == ids.count, "no two alike, within a batch or across two")
        for id in ids {
            #expect(id.uuid.6 >> 4 == 4, "version 4")
            #expect(id.uuid.8 >> 6 == 0b10, "RFC 9562 variant")
        }
        #expect(UUID.randomVersion4(count: 0).isEmpty)
        let notifications = PushToTalkNotification.batch([("ab", "Alice", UUID()), ("cd", nil, UUID())])
        #expect(notifications.map(\.deviceToken) == ["ab", "cd"])
        #expect(notifications[1].isLeave && notifications[0].id != notifications[1].id)
    }

    @Test func aLeavePushHasNoSpeaker() throws {
        let request = try APNsRequest.pushToTalk(
            PushToTalkNotification(deviceToken: "abcd", activeSpeaker: nil, channel: UUID()), topic: "a.voip-ptt")
        let body = try JSONSerialization.jsonObject(with: Data(request.body)) as? [String: Any]
        #expect(body?["activeSpeaker"] == nil)
        #expect(body?["leave"] as? Bool == true)
    }

    @Test func bodiesOver4096BytesAreRefusedBeforeSending() {
        let name = String(repeating: "x", count: 4100)
        #expect(throws: APNsRequestError.self) {
            try APNsRequest.pushToTalk(PushToTalkNotification(deviceToken: "abcd", activeSpeaker: name, channel: UUID()), topic: "a.voip-ptt")
        }
        do {
            _ = try APNsRequest.pushToTalk(PushToTalkNotification(deviceToken: "abcd", activeSpeaker: name, channel: UUID()), topic: "a.voip-ptt")
        } catch {
            guard case .payloadTooLarge(let bytes) = error else { Issue.record("wrong error \(error)"); return }
            #expect(bytes > 4096)
            #expect(error.description.contains("4096"))
        }
    }

    @Test(arguments: ["", "abc", "zz", String(repeating: "a", count: 202), "ab cd"])
    func malformedTokensAreRefused(token: String) {
        #expect(!APNsRequest.isValidDeviceToken(token))
    }
}
