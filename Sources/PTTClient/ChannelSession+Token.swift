import ChannelProtocol
import Foundation
import ParticipantClaims

/// The participant token (Squelch's own: Apple's framework leaves credentials to the app's server):
/// renewals offered to the server, and a session ended by the token's expiry. The states are
/// `TokenRenewal`'s; this side turns them into messages and events.
extension ChannelSession {
    /// The app has a new participant token for the channel. A joined session offers it to the server
    /// (`renewToken`) at once, any other once it is joined again; a session that ended because its
    /// token expired joins again with it now.
    mutating func renewToken(_ token: String, _ uuid: UUID) throws(ChannelError) {
        guard channel == uuid, var credentials else { throw ChannelError(.channelNotFound, "no active channel \(uuid)") }
        // A join doesn't check the user as a renewal does, and a pending token may be joined with: a
        // token for someone else must not get that far. (Read without verifying; the server verifies.)
        if let now = Self.subject(of: credentials.token), let new = Self.subject(of: token), now != new {
            throw ChannelError(.unknown, "the token is for user '\(new)', but this channel was joined as '\(now)'; renew with a token issued to '\(now)'",
                               refusal: .tokenWrongUser)
        }
        if link == .down && self.token.isExpired {
            // Nothing to lose: the old token is dead. Join with this one; a refusal comes back as
            // `tokenRenewalFailed` and the channel waits again.
            credentials.token = token
            self.credentials = credentials
            self.token.joinsWithNew()
            connect()
            return
        }
        // Otherwise the session (or the next join) goes on with the accepted token, and this one is
        // offered with `renewToken` once joined; if the old one is refused first, this one is tried.
        self.token.newToken(token)
        sendPendingRenewal()
    }

    /// A participant token's user, read without verifying it; nil if it isn't a participant token.
    static func subject(of token: String) -> String? { UnverifiedToken.subject(of: token) }

    mutating func sendPendingRenewal() {
        guard link == .joined, let next = token.next() else { return }
        outputs.append(.send(.renewToken(token: next)))
    }

    /// The server took the renewal in flight: it is the session's token now, and the one to restore.
    mutating func renewalAccepted() {
        guard var credentials, let accepted = token.accepted() else { return }
        credentials.token = accepted
        self.credentials = credentials
        saveRecord()
        sendPendingRenewal()
    }

    /// The server answered the renewal in flight with an error. A token it could not check (its
    /// database failed) stays pending: it is offered again after a reconnect, or tried if the old one
    /// runs out first. A refused one is dropped.
    mutating func renewalRefused(_ code: RefusalCode, _ reason: String) {
        let newerWaits = token.refused(checked: code != .internalError)
        outputs.append(.event(.tokenRenewalFailed(code, reason)))
        if newerWaits { sendPendingRenewal() }
    }

    /// The server ended the session because its token expired. The channel stays (the server keeps
    /// the membership and the push token, so the device can still be woken): the app renews the token
    /// and the channel comes back.
    mutating func sessionTokenExpired(_ reason: String, announce: Bool = true) {
        lostConnection()
        failHeldPress("the participant token expired; hand the channel a new one with renewToken to talk again")
        outputs.append(.disconnect)
        link = .down
        token.expired()
        updateStatus(.unavailable)
        if announce { outputs.append(.event(.tokenExpired(reason))) }
    }
}
