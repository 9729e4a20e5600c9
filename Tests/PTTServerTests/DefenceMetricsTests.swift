import ChannelProtocol
import Foundation
import SquelchTesting
import Testing
@testable import PTTServer

/// The defences are seen from outside: a real squelchd refuses a member past its share of grants
/// with a reason that says how long to wait, and /metrics counts it, so an operator sees a member
/// (or a client gone wrong) pressing in a loop.
@Suite struct DefenceMetricsTests {
    @Test func aMemberPastItsGrantsIsToldToWaitAndCounted() async throws {
        let fixture = try await ServerFixture()
        let (task, listening) = try await fixture.start()
        defer { task.cancel() }
        let ann = try await fixture.member("ann", port: listening.voicePort)
        // Three grants in a row are a member's share (then 15 a minute).
        for _ in 0 ..< 3 {
            let mark = ann.messages.count
            try await ann.send(.floorRequest())
            #expect(await ann.waitForFloor(.granted, after: mark) != nil)
            try await ann.send(.floorRelease)
            #expect(await ann.waitForFloor(.idle, after: mark) != nil)
        }
        let mark = ann.messages.count
        try await ann.send(.floorRequest())
        let denied = try #require(await ann.waitForFloor(.denied, after: mark))
        #expect(denied.cause == .rateLimited && denied.reason?.contains("before the next") == true, "\(denied)")
        let text = try await fixture.metrics(listening, containing: "squelch_floor_requests_limited_total 1")
        #expect(text.contains("squelch_floor_requests_limited_total 1"), "\(text.split(separator: "\n").filter { $0.contains("limited") })")
        #expect(text.contains("squelch_transport_evicted_total 0") && text.contains("squelch_wakes_limited_total 0"))
        // The relay loop is watched from the start: its tick histogram has ticks.
        let ticks = RelayLoopTicksTests.value(of: "squelch_event_loop_tick_seconds_count", in: text) ?? 0
        #expect(ticks > 0 && text.contains("squelch_event_loop_stalls_total"), "\(text.split(separator: "\n").filter { $0.contains("event_loop") })")
        await listening.shutdown()
        _ = await task.result
    }
}
