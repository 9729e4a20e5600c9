import NIOCore
import NIOPosix
import Prometheus

/// Measures the relay's event loop from inside NIO: after each tick (one pass over the ready I/O and
/// the due tasks, before the loop waits again) NIO reports when it started and ended. A tick of
/// 20 ms or more, an audio frame's length, is a stall: every packet, timer and control message on
/// the loop waited behind it. Nothing is scheduled for the measurement, so an idle server stays
/// asleep (a task due every 10 ms, the first way this was measured, cost 0.8 % of a core).
final class RelayLoopTicks: NIOEventLoopMetricsDelegate {
    static let stallThreshold = TimeAmount.milliseconds(20)

    let ticks: DurationHistogram
    let stalls: Counter

    init(ticks: DurationHistogram, stalls: Counter) {
        self.ticks = ticks
        self.stalls = stalls
    }

    func processedTick(info: NIOEventLoopTickInfo) {
        let busy = info.endTime - info.startTime
        ticks.recordNanoseconds(busy.nanoseconds)
        if busy >= Self.stallThreshold { stalls.increment() }
    }
}
