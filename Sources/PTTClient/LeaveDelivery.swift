import ChannelProtocol
import Foundation
import Wire

/// A leave the server has not heard: the app left the channel while the client was not joined
/// (suspended, reconnecting, or the server down). Until the server hears it, it keeps the member in
/// the roster, and its push token. The manager keeps it on disk and delivers it on a connection of
/// its own (`join`, then `leave`), now and at later starts, until the server takes it or refuses
/// the token for good.
public struct OwedLeave: Sendable, Equatable, Codable {
    public var channel: UUID
    public var credentials: ChannelCredentials
    /// When the app left.
    public var leftAt: Date

    public init(channel: UUID, credentials: ChannelCredentials, leftAt: Date) {
        self.channel = channel
        self.credentials = credentials
        self.leftAt = leftAt
    }
}

/// How an owed leave ended.
public enum OwedLeaveOutcome: Sendable, Equatable {
    /// The server heard the leave: the membership and its push token are gone.
    case delivered
    /// The server no longer had the membership to leave (an administrator removed it, the channel was
    /// deleted), or the user joined again on another connection, which stays.
    case nothingToLeave(String)
    /// The server refused the token (expired, revoked, forged): it keeps the member, and may wake
    /// the device by push, until an administrator removes it.
    case undeliverable(String)
    /// The channel was joined again from this device before the leave got through: the membership is
    /// wanted after all.
    case superseded
}

/// Delivering one owed leave, as a plain state machine (the project's sans-I/O rule): the driver
/// opens a connection per attempt and reports what happened; this says what to send and whether to
/// try again, and when.
struct LeaveDelivery: Sendable {
    /// What one connection's attempt came to.
    enum AttemptResult: Sendable, Equatable {
        /// `leave` was sent after `joined`, and the server closed the connection for it.
        case delivered
        case refused(RefusalCode, String)
        /// No connection, no answer in time, or a connection that closed first.
        case failed(String)
    }

    enum Next: Sendable, Equatable {
        case retry(afterMilliseconds: Int)
        case finished(OwedLeaveOutcome)
    }

    /// The longest wait between attempts. An owed leave is retried until the token expires (the
    /// server then refuses it, and that ends the delivery), so the wait is bounded, not the tries.
    static let maximumBackoffMilliseconds = 60_000

    let leave: OwedLeave
    /// Attempts in a row that ended without an answer that settles the leave.
    private(set) var failures = 0

    init(_ leave: OwedLeave) { self.leave = leave }

    /// The state of a new attempt, on a new connection.
    func attempt() -> Attempt { Attempt(leave: leave) }

    /// One connection's attempt: join as the member, so that the `leave` that follows is the
    /// member's; the server's answer to a leave is to close the connection (code normal), which is
    /// what settles it. An acknowledgement alone would not: the connection could drop between it and
    /// the hub's handling, and the leave is safe to repeat (a member gone is joined and left again).
    struct Attempt: Sendable {
        let leave: OwedLeave
        private(set) var leaveSent = false

        /// Send once the connection is up.
        var join: ClientMessage {
            .join(token: leave.credentials.token, channel: leave.channel, reason: .developerRequest)
        }

        enum Action: Sendable, Equatable {
            case send(ClientMessage)
            /// The attempt is over; close the connection.
            case end(AttemptResult)
        }

        /// A message from the server; nil for anything that doesn't matter here (the roster, the
        /// floor, catch-up of a burst in progress).
        mutating func received(_ message: ServerMessage) -> Action? {
            switch message {
            case .joined where !leaveSent:
                leaveSent = true
                return .send(.leave)
            case .refused(let code, let reason):
                return .end(.refused(code, reason))
            // An error before `joined` is the join's answer (a rate limit, a server that doesn't know
            // the message): nothing settled, try again later.
            case .error(_, let reason) where !leaveSent:
                return .end(.failed("the server answered the join with an error: \(reason)"))
            default:
                return nil
            }
        }

        /// The connection closed (for good; a client that reconnects by itself counts as closed too).
        func closed(_ error: ConnectionError) -> AttemptResult {
            if leaveSent, case .peer(CloseCode.normal.rawValue, _, true) = error { return .delivered }
            return .failed(leaveSent ? "the connection closed before the server took the leave (\(error))" : "\(error)")
        }
    }

    /// An attempt ended: stop, or try again after the returned wait (the driver waits between half
    /// and all of it, at random, so that devices that lost the server together don't return together).
    mutating func ended(_ result: AttemptResult) -> Next {
        switch result {
        case .delivered:
            return .finished(.delivered)
        case .refused(let code, let reason):
            switch code {
            case .removedByAdmin, .channelDeleted, .channelNotFound:
                return .finished(.nothingToLeave(reason))
            case .replaced:
                // Another connection of this user joined while this one was joining: it stays, and a
                // leave now would take its membership from under it.
                return .finished(.nothingToLeave(reason))
            case .tokenExpired, .tokenForged, .tokenMalformed, .tokenWrongChannel, .tokenWrongUser, .tokenRevoked:
                return .finished(.undeliverable(reason))
            case .tokenNotYetValid, .serverBusy, .internalError, .notJoined, .protocolError, .rateLimited:
                return retry()
            }
        case .failed:
            return retry()
        }
    }

    private mutating func retry() -> Next {
        failures += 1
        return .retry(afterMilliseconds: Backoff.milliseconds(first: 1_000, failuresBefore: failures - 1, ceiling: Self.maximumBackoffMilliseconds))
    }
}
