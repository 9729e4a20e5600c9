import ChannelProtocol
import ChannelStore
import Foundation

/// Effects the hub asks its driver to carry out, in order.
public enum HubOutput: Sendable, Equatable {
    /// Encode `message` once and send it on each link's control stream.
    case send(ServerMessage, to: [Link])
    /// Close the link with an application close code.
    case close(Link, code: CloseCode, reason: String)
    /// Check a join token (asynchronously), then call `admit` or `refuse`.
    case verify(Link, token: String, channel: UUID, reason: JoinReason)
    /// Check a `renewToken` token for `channel` the same way, then call `renew` or `renewalRefused`.
    case verifyRenewal(Link, token: String, channel: UUID)
    /// Write to the store (asynchronously, in order; the relay never waits for it).
    case store(StoreOperation)
    /// A talk burst started. Members in `wake` have a push token and no connection; those in `connected`
    /// have both, and the driver wakes the ones whose connection has gone silent (the hub sees no
    /// transport keepalives, the driver does).
    case burstStarted(channel: UUID, talker: RosterMember, wake: [MemberRecord], connected: [WakeCandidate])
    /// An administrator removed the member or deleted the channel: its device should be told to leave by push.
    case memberGone(channel: UUID, member: MemberRecord)
}

/// A member with a push token and a live-looking connection, at a burst's start.
public struct WakeCandidate: Sendable, Equatable {
    public var member: MemberRecord
    public var link: Link

    public init(member: MemberRecord, link: Link) {
        self.member = member
        self.link = link
    }
}
