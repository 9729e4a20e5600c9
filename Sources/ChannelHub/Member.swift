import ChannelProtocol
import ChannelStore
import Foundation
import Wire

/// One member of a live channel: who it is (from its token), how it is connected, and what it is doing.
struct Member {
    var slot: UInt16
    var userID: String
    var name: String
    var role: String?
    /// From its token (`ParticipantClaims.image`); not stored, so a member restored at a start has
    /// none until it joins again.
    var image: String? = nil
    var priority: UInt8
    var canTalk: Bool
    var canListen: Bool
    var joinedAt: Date
    var link: Link?
    var connection: ConnectionState
    /// While `.reconnecting`: when the member counts as offline.
    var reconnectingUntil: WireInstant?
    /// While its connection is open but silent (the liveness sweep marked it): since when, for
    /// `HubConfiguration.silentOffline`.
    var silentSince: WireInstant?
    var talking = false
    var muted = false
    /// The number of the newest `floorRequest` from this member (nil: it sent none, or an unnumbered
    /// one). Every answer about its place at the floor names it, including a grant from the queue
    /// long after the request, so that its client tells them from the answers to requests it withdrew.
    var floorRequest: UInt32?
    /// When the member was last connected, as far as this server knows: stored, or the last join
    /// or close here (nil: connected since the server started, not yet closed).
    var lastSeen: Date?
    var pushToken: String?
    var pushEnvironment: PushEnvironment?
    var pushRegisteredAt: Date?
    /// When this server last wrote the token to the store (nil: not since it started).
    var pushTokenWrittenAt: Date?
    /// Bursts this member is being replayed; it gets no live audio until they are done.
    var catchUp: [CatchUpCursor] = []
    /// Joined through an entry pass whose handshake has not finished (`ChannelHub.entered`): the
    /// transport can send it no audio yet, so it is off the live fan-out and its replay waits at the
    /// start until `handshakeDone`.
    var mediaHeld = false
    /// When the current burst started (wall clock), for the transmission log.
    var burstStartedAt: Date?
    /// When the current burst's length was last written to the log (`ChannelHub.logBurstProgress`).
    var burstProgressAt: Date?
    /// User ids this member chose not to hear (`setSubscriptions`).
    var unheard: Set<String> = []
    /// The token it last joined with, so that revoking that token, or removing the member from another
    /// process, reaches its session, or its stored membership while it is offline. Nil only for members
    /// stored before the store kept tokens (schema v3) that have not joined since.
    var token: (id: String, issuedAt: Date, expiresAt: Date)?
    /// What is left of the member's audio budget when its last burst ended. The next burst starts
    /// from it (refilled for the time between), so releasing and requesting the floor again doesn't
    /// buy a full bucket.
    var audioPace: TokenBucket?
    /// When its roster entry last went to everyone, and whether a change since waits for
    /// `HubConfiguration.rosterUpdateInterval` to pass (`ChannelHub+RosterPacing`).
    var announcedAt: WireInstant?
    var announcePending = false
    /// Its allowance of floor grants (`HubConfiguration.floorGrantsPerMinute`).
    var floorGrants: TokenBucket?
    /// Its allowance of wake pushes (`HubConfiguration.wakesPerMinute`).
    var wakes: TokenBucket?
    /// The share of audio (percent) this member last reported missing (`receptionReport`), this session.
    var receptionLoss = 0
    /// The worst listener loss this member was last told while talking (`receptionLoss`), this session.
    var listenerLossTold = 0

    /// Whether this member takes audio from `talker` at all: it may listen and has not unsubscribed.
    func hears(_ talker: Member) -> Bool { canListen && !unheard.contains(talker.userID) }

    var participant: RosterMember {
        RosterMember(slot: slot, userID: userID, name: name, role: role, image: image, priority: priority, canTalk: canTalk,
                    canListen: canListen, connection: connection, talking: talking, muted: muted)
    }

    func record(channel: UUID, lastSeen: Date) -> MemberRecord {
        MemberRecord(channelID: channel, userID: userID, displayName: name, joinedAt: joinedAt, lastSeen: lastSeen,
                     pushToken: pushToken, pushEnvironment: pushEnvironment, pushRegisteredAt: pushRegisteredAt,
                     grant: token.map { MemberGrant(canTalk: canTalk, canListen: canListen, role: role, priority: priority,
                                                    tokenID: $0.id, tokenIssuedAt: $0.issuedAt, tokenExpiresAt: $0.expiresAt) },
                     unheard: unheard.sorted())
    }
}
