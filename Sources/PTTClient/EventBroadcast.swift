import NIOConcurrencyHelpers

/// Every manager event to each of its streams: `ChannelManager.events`, and one per
/// `makeEventStream()`. An `AsyncStream` has one consumer (two loops over one stream split its
/// elements between them), and an app has several: a stage renderer, a status bar, a logger.
final class EventBroadcast: Sendable {
    private struct Sinks {
        var open: [Int: AsyncStream<ChannelManagerEvent>.Continuation] = [:]
        var next = 0
        var finished = false
    }

    private let sinks = NIOLockedValueBox(Sinks())
    /// Events a slow consumer may fall behind by before the oldest are dropped, per stream.
    static let buffered = 1000

    /// A stream of every event from now on.
    func makeStream() -> AsyncStream<ChannelManagerEvent> {
        let (stream, continuation) = AsyncStream.makeStream(of: ChannelManagerEvent.self, bufferingPolicy: .bufferingNewest(Self.buffered))
        let id: Int? = sinks.withLockedValue { sinks in
            guard !sinks.finished else { return nil }
            sinks.next += 1
            sinks.open[sinks.next] = continuation
            return sinks.next
        }
        guard let id else {
            continuation.finish()
            return stream
        }
        continuation.onTermination = { [weak self] _ in
            _ = self?.sinks.withLockedValue { $0.open.removeValue(forKey: id) }
        }
        return stream
    }

    func yield(_ event: ChannelManagerEvent) {
        for continuation in sinks.withLockedValue({ Array($0.open.values) }) { continuation.yield(event) }
    }

    func finish() {
        let open = sinks.withLockedValue { sinks in
            sinks.finished = true
            defer { sinks.open.removeAll() }
            return Array(sinks.open.values)
        }
        for continuation in open { continuation.finish() }
    }
}
