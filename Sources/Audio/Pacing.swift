#if canImport(Glibc)
import Glibc
#endif

/// A clock that paces file-backed audio like a device. Two kinds exist:
/// - `RealTimePacer`: waits for wall-clock deadlines, for latency measurements;
/// - `VirtualPacer`: advances at once, for quality tests that should run as fast as possible.
public protocol AudioPacer: Sendable {
    /// Time origin in nanoseconds on the monotonic clock.
    var origin: UInt64 { get }
    /// Waits until period `index` is due and returns its timestamp (`origin + index × period`).
    func waitForPeriod(_ index: Int) -> UInt64
}

/// Reads CLOCK_MONOTONIC, which every process on the machine shares, so two WAV files recorded by
/// different processes can be put on one timeline.
public func monotonicNanoseconds() -> UInt64 {
    var ts = timespec()
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return UInt64(ts.tv_sec) * 1_000_000_000 + UInt64(ts.tv_nsec)
}

/// Paces periods at absolute deadlines `origin + k × period` with `clock_nanosleep(TIMER_ABSTIME)`,
/// so a late wake-up never accumulates into drift.
public struct RealTimePacer: AudioPacer {
    public let origin: UInt64
    public let periodNanoseconds: UInt64

    public init(origin: UInt64 = monotonicNanoseconds(), periodNanoseconds: UInt64 = 10_000_000) {
        self.origin = origin
        self.periodNanoseconds = periodNanoseconds
    }

    public func waitForPeriod(_ index: Int) -> UInt64 {
        precondition(index >= 0, "period indices start at 0")
        let deadline = origin + UInt64(index) * periodNanoseconds
        var ts = timespec(tv_sec: Int(deadline / 1_000_000_000), tv_nsec: Int(deadline % 1_000_000_000))
        while clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, nil) == EINTR {}
        return deadline
    }
}

/// Returns each period's nominal timestamp without waiting.
public struct VirtualPacer: AudioPacer {
    public let origin: UInt64
    public let periodNanoseconds: UInt64

    public init(origin: UInt64 = 0, periodNanoseconds: UInt64 = 10_000_000) {
        self.origin = origin
        self.periodNanoseconds = periodNanoseconds
    }

    public func waitForPeriod(_ index: Int) -> UInt64 { origin + UInt64(index) * periodNanoseconds }
}
