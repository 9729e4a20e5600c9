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
        /// Each member's tokens with a stream open, oldest first.
        var byOwner: [Owner: [String]] = [:]
        var nextID = 0
        var closed = false

        mutating func insert(_ subscriber: Subscriber, token: String) {
            if byToken.updateValue(subscriber, forKey: token) == nil { byOwner[subscriber.owner, default: []].append(token) }
        }

        /// Removes `token`'s stream and returns it.
        mutating func drop(_ token: String) -> Subscriber? {
            guard let subscriber = byToken.removeValue(forKey: token) else { return nil }
            byOwner[subscriber.owner]?.removeAll { $0 == token }
            if byOwner[subscriber.owner]?.isEmpty == true { byOwner[subscriber.owner] = nil }
            return subscriber
        }
    }

    private let state = NIOLockedValueBox(State())
    /// Told the number of open streams after every change (the gauge of them).
    private let countChanged: @Sendable (Int) -> Void

    init(countChanged: @escaping @Sendable (Int) -> Void = { _ in }) {
        self.countChanged = countChanged
    }

    /// Pushes a stream may have waiting while its connection is slow; older ones give way, since
    /// only the newest wake matters.
    static let backlog = 16

    /// Streams one member may have open at once (a device per push token; a member on a few devices):
    /// a new one beyond this ends the member's oldest, so one participant token can't hold thousands.
    static let perMember = 4

    /// Opens a stream for `token`. One the same member had for it ends: the device opened a new one,
    /// and the old connection is stale.
    func subscribe(token: String, owner: Owner, expiresAt: Date) -> Subscription {
        let (lines, continuation) = AsyncStream.makeStream(of: Line.self, bufferingPolicy: .bufferingNewest(Self.backlog))
        let result = state.withLockedValue { state -> (Subscription, [AsyncStream<Line>.Continuation]) in
            guard !state.closed else { return (.closed, []) }
            if let previous = state.byToken[token], previous.owner != owner { return (.heldByAnother, []) }
            var ended = state.drop(token).map { [$0.continuation] } ?? []
            while let tokens = state.byOwner[owner], tokens.count >= Self.perMember, let oldest = tokens.first {
                if let dropped = state.drop(oldest) { ended.append(dropped.continuation) }
            }
            let id = state.nextID
            state.nextID += 1
            state.insert(Subscriber(id: id, owner: owner, expiresAt: expiresAt, continuation: continuation), token: token)
            countChanged(state.byToken.count)
            return (.opened(id: id, lines: lines), ended)
        }
        for stale in result.1 { stale.finish() }
        if case .opened(let id, _) = result.0 {
            continuation.onTermination = { [weak self] _ in self?.remove(id: id, token: token) }
        } else {
            continuation.finish()
        }
        return result.0
    }

    private func remove(id: Int, token: String) {
        state.withLockedValue { state in
            guard state.byToken[token]?.id == id else { return }
            _ = state.drop(token)
            countChanged(state.byToken.count)
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
            let expired = state.byToken.filter { $0.value.expiresAt <= now }.keys.compactMap { state.drop($0)?.continuation }
            if !expired.isEmpty { countChanged(state.byToken.count) }
            return (state.byToken.values.map(\.continuation), expired)
        }
        for continuation in expired { continuation.finish() }
        for continuation in alive { continuation.yield(.keepalive) }
    }

    /// Ends every stream and refuses new ones: the server is stopping.
    func closeAll() {
        let all = state.withLockedValue { state in
            state.closed = true
            defer {
                state.byToken.removeAll()
                state.byOwner.removeAll()
                countChanged(0)
            }
            return state.byToken.values.map(\.continuation)
        }
        for continuation in all { continuation.finish() }
    }

    var count: Int { state.withLockedValue { $0.byToken.count } }
}
