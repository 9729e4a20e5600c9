// libFuzzer target for what squelchd reads back from APNs: an error response (status and body, parsed
// by `APNsErrorResponse.parse`) and the delivery policy it drives (`APNsDeliveryAttempts`). Whatever
// the far end of the HTTP/2 connection sends (Apple, a proxy in between, a broken simulator), parsing
// must not trap and must keep the status; the policy must never call a refusal delivered, drop a
// device token only for the four answers that mean it is dead, retry only within its budget and
// backoff ceiling, refresh the provider token at most once, and give a metric label drawn from a
// bounded set, never the far end's own text. Built by `make fuzz-build` with Sources/APNs/
// APNsReason.swift, DeliveryPolicy.swift and PushToTalkNotification.swift.
//
// Input layout: a flag byte (configuration proven, environment chosen per token, registration date
// known, the reason's own status), two bytes of status, a byte of attempt count, a body byte, then a
// timing byte and a jitter byte per attempt; the rest is the response body. A body byte under 128
// makes the body a well-formed answer with one of Apple's documented reasons (and, with the rest as
// digits, a timestamp), so every branch of the policy is reached: the fuzzer can't find the reason
// strings itself, as Swift's string comparisons are not instrumented.
import Foundation

private let policy = APNsRetryPolicy()
private let tokenKillers: Set<APNsReason> = [.badDeviceToken, .deviceTokenNotForTopic, .expiredToken, .unregistered]
/// Apple's transient answers, and an expired provider token (retried once with a new one).
private let retriable: Set<APNsReason> = [.tooManyProviderTokenUpdates, .internalServerError, .serviceUnavailable, .shutdown,
                                          .idleTimeout, .expiredProviderToken]

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzAPNsResponse(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let input = Array(UnsafeBufferPointer(start: data, count: size))
    guard input.count >= 5 else { return 0 }
    let flags = input[0]
    var status = Int(input[1]) << 8 | Int(input[2])
    let attemptCount = Int(input[3] % 12) + 1
    let timingEnd = min(input.count, 5 + 2 * attemptCount)
    let timing = Array(input[5..<timingEnd])
    var body = Array(input[timingEnd...])
    if input[4] < 128 {
        let reason = APNsReason.allCases[Int(input[4]) % APNsReason.allCases.count]
        if flags & 8 != 0 { status = reason.status }
        let digits = body.prefix(16).map { Character(String($0 % 10)) }
        let timestamp = digits.isEmpty ? "" : ",\"timestamp\":\(String(digits))"
        body = Array("{\"reason\":\"\(reason.rawValue)\"\(timestamp)}".utf8)
    }

    let response = APNsErrorResponse.parse(status: status, body: body)
    precondition(response.status == status, "the status changed in parsing")
    if body.isEmpty || body.count > 4096 {
        precondition(response.rawReason.isEmpty && response.timestamp == nil, "a reason from a body that can't hold one")
    }
    precondition(response.reason.map { $0.rawValue == response.rawReason } ?? true, "a reason that isn't the one sent")

    var attempts = APNsDeliveryAttempts(policy: policy,
                                        tokenRegisteredAt: flags & 4 != 0 ? Date(timeIntervalSince1970: 1_700_000_000) : nil,
                                        configurationProven: flags & 1 != 0, environmentChosenPerToken: flags & 2 != 0)
    var elapsed = Duration.zero
    var refreshes = 0
    for attempt in 0..<attemptCount {
        let step = attempt * 2 < timing.count ? timing[attempt * 2] : 0
        let jitter = attempt * 2 + 1 < timing.count ? Double(timing[attempt * 2 + 1]) / 256 : 0.5
        elapsed += .milliseconds(Int(step) * 16)  // up to 4 s a step: past the 2 s budget
        let next = attempts.next(after: .rejected(response), elapsed: elapsed, random: jitter)
        precondition(attempts.attempts == attempt + 1, "attempts miscounted")
        switch next {
        case .delivered:
            preconditionFailure("a refusal was called delivered")
        case .retry(let delay, let refresh):
            precondition(delay >= .zero && delay <= policy.maximumBackoff, "a backoff outside its ceiling: \(delay)")
            precondition(elapsed + delay < policy.budget, "a retry past the budget")
            precondition(response.reason.map { retriable.contains($0) } ?? (status >= 500), "a retry of an answer that can't change")
            if refresh {
                precondition(response.reason == .expiredProviderToken, "a new provider token for \(response.rawReason)")
                refreshes += 1
                precondition(refreshes == 1, "the provider token refreshed twice for one push")
            }
        case .failed(let failure):
            if failure.dropToken {
                precondition(response.reason.map { tokenKillers.contains($0) } ?? false, "a token dropped for \(response.rawReason)")
            }
            if response.reason == .deviceTokenNotForTopic, flags & 1 == 0 {
                precondition(!failure.dropToken && failure.isConfigurationError, "every token dropped for a wrong topic")
            }
            let label = failure.reason.label
            let bounded = APNsReason(rawValue: label) != nil || label == "Unknown" || label == "BudgetExhausted"
                || label == "HTTP\(status)"
            precondition(bounded, "a metric label from the far end's text: \(label)")
            return 0
        }
    }
    return 0
}
