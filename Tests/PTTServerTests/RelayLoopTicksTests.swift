import Foundation
import NIOCore
import NIOPosix
import Testing
@testable import PTTServer

/// The relay loop's stall counter sees a tick that ran long, and the tick histogram sees every tick.
@Suite struct RelayLoopTicksTests {
    @Test func aLongTickIsCountedAsAStall() async throws {
        let metrics = ServerMetrics()
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1,
                                                metricsDelegate: RelayLoopTicks(ticks: metrics.loopTicks, stalls: metrics.loopStalls))
        let loop = group.next()
        for _ in 0 ..< 5 { try await loop.submit {}.get() }
        #expect(Self.value(of: "squelch_event_loop_stalls_total", in: metrics.emit()) == 0, "short ticks are no stalls")
        // What a stall is: the loop busy with one thing for 60 ms, three audio frames' time.
        try await loop.submit { _ = usleep(60_000) }.get()
        try await loop.submit {}.get()  // the long tick has been reported by the time this one runs
        try await group.shutdownGracefully()
        let text = metrics.emit()
        #expect((Self.value(of: "squelch_event_loop_stalls_total", in: text) ?? 0) >= 1, "\(text)")
        #expect((Self.value(of: "squelch_event_loop_tick_seconds_count", in: text) ?? 0) >= 2, "\(text)")
        #expect((Self.value(of: "squelch_event_loop_tick_seconds_sum", in: text) ?? 0) >= 0.06, "\(text)")
    }

    static func value(of name: String, in text: String) -> Double? {
        text.split(separator: "\n").first { $0.hasPrefix(name + " ") }.flatMap { Double($0.split(separator: " ").last ?? "") }
    }
}
