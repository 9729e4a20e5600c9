import Prometheus
import NIOCore

/// Watches one event loop for stalls: a task due every 10 ms notes how late it ran. A late tick means
/// the loop was busy with something else for that long (one huge fan-out, a blocking call, a flood),
/// and every packet, timer and control message on it waited as long. Cheap: 100 ticks a second.
enum EventLoopLagWatch {
    static let interval = TimeAmount.milliseconds(10)
    /// Lateness counted as a stall: a 20 ms audio frame's own length.
    static let stallThreshold = TimeAmount.milliseconds(20)

    /// Starts watching `loop`; cancel the returned task to stop.
    static func start(on loop: any EventLoop, lag: DurationHistogram, stalls: Counter) -> RepeatedTask {
        // Each tick runs on `loop`, so the box is only ever touched there.
        let due = NIOLoopBoundBox.makeBoxSendingValue(NIODeadline.now() + interval, as: NIODeadline.self, eventLoop: loop)
        return loop.scheduleRepeatedTask(initialDelay: interval, delay: interval) { _ in
            let now = NIODeadline.now()
            let late = max(.zero, now - due.value)
            // The next tick is due one interval after this one ran (the repeat's delay starts now).
            due.value = now + interval
            lag.recordNanoseconds(late.nanoseconds)
            if late >= stallThreshold { stalls.increment() }
        }
    }
}
