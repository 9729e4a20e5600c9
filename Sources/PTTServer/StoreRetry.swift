import ChannelStore

/// When the store writer tries a failed write again, and when it stops trying. A plain value with no
/// clock: the writer tells it how many times this write has failed and how long ago the server began
/// to stop, and it answers what to do.
///
/// A write that failed for a reason that passes (another process held the lock too long, a full disk,
/// an I/O error: `StoreError.isTransient`) is tried again, as long as the server runs: dropping it
/// would lose a member's state or a transmission-log record for good, while keeping it costs one
/// waiting write, and the queue behind it folds and is bounded (`StoreQueue`). The delays double up to
/// `maxDelay`, so a full disk costs a statement every two seconds until space is freed.
///
/// Once the server is stopping, trying forever would hold the shutdown hostage, so the writer keeps
/// trying for `shutdownBudget` and then abandons what is left, counted and logged.
public struct StoreRetryPolicy: Sendable, Equatable {
    public var firstDelay: Duration
    public var maxDelay: Duration
    /// How long after `finish` the writer keeps trying failed writes.
    public var shutdownBudget: Duration

    public init(firstDelay: Duration = .milliseconds(50), maxDelay: Duration = .seconds(2), shutdownBudget: Duration = .seconds(10)) {
        self.firstDelay = firstDelay
        self.maxDelay = maxDelay
        self.shutdownBudget = shutdownBudget
    }

    public enum Decision: Sendable, Equatable {
        /// Try the same write again after this long.
        case retry(after: Duration)
        /// The write cannot succeed as it is (its channel is gone, a value is refused): drop it, go on.
        case drop
        /// The server is stopping and the database has been failing for the whole budget: give up this
        /// write and every one still waiting.
        case abandon
    }

    /// - Parameters:
    ///   - failures: how many times in a row this write has failed, counting this one (at least 1).
    ///   - stoppingFor: how long ago `finish` was called, or nil while the server runs.
    public func decide(_ error: StoreError, failures: Int, stoppingFor: Duration?) -> Decision {
        guard error.isTransient else { return .drop }
        if let stoppingFor, stoppingFor >= shutdownBudget { return .abandon }
        // 2^(failures-1) steps, capped before the shift can overflow.
        let doublings = min(max(failures - 1, 0), 30)
        let delay = min(firstDelay * (1 << doublings), maxDelay)
        guard let stoppingFor else { return .retry(after: delay) }
        return .retry(after: min(delay, shutdownBudget - stoppingFor))
    }
}
