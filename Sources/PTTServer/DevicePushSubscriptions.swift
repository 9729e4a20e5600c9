import ChannelProtocol
import Foundation
import NIOConcurrencyHelpers

/// The device push streams open now, by push token, each bound to the member whose participant
/// token opened it: a push goes to a stream only if it is for that member, so nobody can take
/// another member's wake-ups by naming their push token.
final class DevicePushSubscriptions: Sendable {
    struct Owner: Hashable, Sendable {
        var channel: UUID
        var user: String
    }

    /// What a stream carries: a push, or a keepalive (an empty line on the wire).
    enum Line: Sendable {
        case push(DevicePushDelivery)
        case keepalive
    }

    enum Subscription {
        case opened(id: Int, lines: AsyncStream<Line>)
        /// Another member's stream holds the token.
        case heldByAnother
        /// The service is stopping.
        case closed
    }

    enum Outcome: Equatable {
        case delivered
        /// No stream is open for the token (the device is off, or between two streams).
        case notConnected
        /// The token's stream belongs to another member than the push is for.
        case heldByAnother
    }

    private struct Subscriber {
        var id: Int
        var owner: Owner
        var expiresAt: Date
        var continuation: AsyncStream<Line>.Continuation
    }

    private struct State {
        var byToken: [String: Subscriber] = [:]
        var nextID = 0
        var closed = false
    }

    private let state = NIOLockedValueBox(State())

    /// Pushes a stream may have waiting while its connection is slow; older ones give way, since
    /// only the newest wake matters.
    static let backlog = 16

    /// Opens a stream for `token`. One the same member had for it ends: the device opened a new one,
    /// and the old connection is stale.
    func subscribe(token: String, owner: Owner, expiresAt: Date) -> Subscription {
        let (lines, continuation) = AsyncStream.makeStream(of: Line.self, bufferingPolicy: .bufferingNewest(Self.backlog))
        let result = state.withLockedValue { state -> (Subscription, AsyncStream<Line>.Continuation?) in
            guard !state.closed else { return (.closed, nil) }
            let previous = state.byToken[token]
            if let previous, previous.owner != owner { return (.heldByAnother, nil) }
            let id = state.nextID
            state.nextID += 1
            state.byToken[token] = Subscriber(id: id, owner: owner, expiresAt: expiresAt, continuation: continuation)
            return (.opened(id: id, lines: lines), previous?.continuation)
        }
        result.1?.finish()
        if case .opened(let id, _) = result.0 {
            continuation.onTermination = { [weak self] _ in self?.remove(id: id, token: token) }
        } else {
            continuation.finish()
        }
        return result.0
    }

    private func remove(id: Int, token: String) {
        state.withLockedValue { state in
            if state.byToken[token]?.id == id { state.byToken[token] = nil }
        }
    }

    /// Hands `delivery` to the stream open for `token`, if it is `owner`'s.
    func deliver(_ delivery: DevicePushDelivery, token: String, to owner: Owner) -> Outcome {
        let subscriber = state.withLockedValue { $0.byToken[token] }
        guard let subscriber else { return .notConnected }
        guard subscriber.owner == owner else { return .heldByAnother }
        if case .terminated = subscriber.continuation.yield(.push(delivery)) { return .notConnected }
        return .delivered
    }

    /// A keepalive on every stream, and the end of those whose participant token expired by `now`
    /// (the device opens a new one with its renewed token).
    func tick(now: Date) {
        let (alive, expired) = state.withLockedValue { state in
            let expired = state.byToken.filter { $0.value.expiresAt <= now }
            for token in expired.keys { state.byToken[token] = nil }
            return (state.byToken.values.map(\.continuation), expired.values.map(\.continuation))
        }
        for continuation in expired { continuation.finish() }
        for continuation in alive { continuation.yield(.keepalive) }
    }

    /// Ends every stream and refuses new ones: the server is stopping.
    func closeAll() {
        let all = state.withLockedValue { state in
            state.closed = true
            defer { state.byToken.removeAll() }
            return state.byToken.values.map(\.continuation)
        }
        for continuation in all { continuation.finish() }
    }

    var count: Int { state.withLockedValue { $0.byToken.count } }
}
