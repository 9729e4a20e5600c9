import Foundation
import NIOCore
import NIOPosix
import Prometheus
import Testing
@testable import PTTServer

/// The relay loop's stall counter sees a loop that was blocked, and the lag histogram sees every tick.
@Suite struct EventLoopLagWatchTests {
    @Test func aBlockedLoopIsCountedAsAStall() async throws {
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let metrics = ServerMetrics()
        let loop = group.next()
        let watch = EventLoopLagWatch.start(on: loop, lag: metrics.loopLag, stalls: metrics.loopStalls)
        try await Task.sleep(for: .milliseconds(100))
        // What a stall is: the loop busy with one thing for 60 ms, three audio frames' time.
        try await loop.submit { _ = usleep(60_000) }.get()
        try await Task.sleep(for: .milliseconds(50))
        watch.cancel()
        try await group.shutdownGracefully()
        let text = metrics.emit()
        let stalls = try #require(Self.value(of: "squelch_event_loop_stalls_total", in: text))
        #expect(stalls >= 1, "\(text)")
        let ticks = try #require(Self.value(of: "squelch_event_loop_lag_seconds_count", in: text))
        #expect(ticks >= 5, "ticks every 10 ms for 150 ms: \(text)")
        let late = try #require(Self.value(of: "squelch_event_loop_lag_seconds_sum", in: text))
        #expect(late >= 0.03, "the blocked tick ran at least 30 ms late: \(text)")
    }

    static func value(of name: String, in text: String) -> Double? {
        text.split(separator: "\n").first { $0.hasPrefix(name + " ") }.flatMap { Double($0.split(separator: " ").last ?? "") }
    }
}
