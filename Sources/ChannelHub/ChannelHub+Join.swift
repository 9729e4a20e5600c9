import ChannelProtocol
import ChannelStore
import FloorControl
import Foundation
import ParticipantClaims
import Wire

extension ChannelHub {
    /// The token on `link` checked out: the member joins (or rejoins) its channel.
    public func admit(_ link: Link, claims: ParticipantClaims, reason: JoinReason, at time: HubTime) {
        let revoked = tokenChecks.ended(link, claims: claims)
        guard case .verifying(let requested)? = sessions[link] else { return }  // closed while verifying
        if let revoked {
            refuse(link, code: .tokenRevoked, reason: Self.revokedReason(revoked))
            return
        }
        guard requested == claims.channel else {
            refuse(link, code: .tokenWrongChannel, reason: "the token is for another channel")
            return
        }
        guard let channel = channels[claims.channel] else {
            refuse(link, code: .channelNotFound, reason: "channel \(claims.channel) does not exist (deleted?); ask for a token to an existing channel")
            return
        }
        let slot: UInt16
        if let existing = channel.slotsByUser[claims.userID] {
            if let superseded = Self.supersededReason(claims, newest: channel.members[existing]?.token?.issuedAt) {
                refuse(link, code: .tokenRevoked, reason: superseded)
                return
            }
            slot = existing
        } else {
            guard let free = allocateSlot(in: channel) else {
                refuse(link, code: .serverBusy, reason: "the channel has 65,535 members, the most a channel can hold; an administrator must remove some (or set memberRetentionDays)")
                return
            }
            slot = free
            channel.slotsByUser[claims.userID] = slot
        }
        var member = channel.members[slot] ?? Member(
            slot: slot, userID: claims.userID, name: claims.name, role: claims.role, priority: claims.priority,
            canTalk: claims.capabilities.contains(.talk), canListen: claims.capabilities.contains(.listen),
            joinedAt: time.date, link: nil, connection: .connected)
        if let old = member.link, old != link {
            // The same user on a new connection (a phone that switched networks without resuming):
            // the new one wins.
            sessions[old] = nil
            outputs.append(.send(.refused(code: .replaced, reason: "you joined this channel from another connection"), to: [old]))
            outputs.append(.close(old, code: .replaced, reason: "replaced by a newer connection"))
            // Partway through a replay (a phone that switched networks right after its wake): the
            // new connection gets it again from the start.
            owe(channel, slot: slot, replaying: member.catchUp, at: time.instant)
            stopCatchUp(&member, in: channel)
            // As if the old connection had closed first: a place in the queue is dropped (the new
            // session starts idle and knows nothing of it, so a grant later would be a phantom burst
            // that wakes sleeping phones), while a talker's grace ends below with `reconnected`, and
            // its client confirms or releases the floor it still holds.
            channel.floor.disconnected(slot, now: time.instant.nanoseconds)
        }
        Self.take(claims, into: &member)
        member.link = link
        member.connection = .connected
        member.mediaHeld = handshaking.contains(link)
        member.lastSeen = time.date
        member.reconnectingUntil = nil
        member.silentSince = nil
        // A new session: the client starts both loss figures at 0. (Until then the member has no
        // link, which keeps its old figure out of every talker's worst.)
        member.receptionLoss = 0
        member.listenerLossTold = 0
        channel.members[slot] = member
        reconnecting.removeAll { $0.is(channel, slot) }
        sessions[link] = .joined(channel, slot: slot)
        counters.joins += 1
        channel.floor.reconnected(slot, now: time.instant.nanoseconds)

        outputs.append(.store(.upsertMember(member.record(channel: channel.record.id, lastSeen: time.date))))
        // A big roster goes in chunks, so that no control message nears the size limit; `joined`
        // carries the first, and the rest follow as the connection has room (`continueRoster`).
        // `joined`'s own share is measured: an image URL full of characters JSON escapes can take most of it.
        // `features` says what this server takes beyond the first protocol, so that a client uses it
        // only where it is understood.
        let info = channel.info, talkers = channel.talkers, features: [ProtocolFeature] = [.receptionReport]
        let head = codec.encode(.joined(channel: info, you: slot, roster: [], talkers: talkers, features: features)).count
        // The joiner's own entry and the talkers' first, so that they ride in `joined`: the client
        // takes its transmission mode from its own entry, and names a talker from its entry.
        let early = [slot] + talkers.map(\.slot).filter { $0 != slot }
        let rest = channel.members.keys.filter { !early.contains($0) }.sorted()
        var stream = RosterStream(channel: channel, slots: early + rest, next: 0)
        let first = nextRosterChunk(&stream, RosterChunker(firstChunkBytes: ControlLimits.maxMessageBytes - head - 1_024))
        outputs.append(.send(.joined(channel: info, you: slot, roster: first, talkers: talkers, features: features), to: [link]))
        if !stream.isFinished { rosterStreams[link] = stream }
        sendLiveMediaKeys(channel, to: slot, link: link)
        scheduleExpiry(channel, slot: slot, link: link, claims: claims, at: time)
        // Rights are the token's: a talker back with a listen-only token stops being relayed, and a new
        // priority counts for the floor it holds or waits for. After `joined`, whose snapshot shows the
        // floor as it was: the events that follow describe the change.
        channel.floor.rightsChanged(slot, priority: member.priority, canTalk: member.canTalk, now: time.instant.nanoseconds)
        applyFloorEvents(channel, at: time)
        announce(channel, slot: slot, to: channel.links(except: slot), at: time.instant)
        if member.canListen { startCatchUp(channel, slot: slot, at: time) }
        listenersChanged(channel)
    }

    /// The entries of `stream`'s next chunk, as its members are now (one that left meanwhile is
    /// skipped; one that joined meanwhile was announced with `participant`).
    func nextRosterChunk(_ stream: inout RosterStream, _ chunker: RosterChunker = RosterChunker()) -> [RosterMember] {
        var chunker = chunker
        var chunk: [RosterMember] = []
        while !stream.isFinished {
            guard let member = stream.channel.members[stream.slots[stream.next]] else {
                stream.next += 1
                continue
            }
            let entry = member.participant
            guard chunker.take(entry) else { break }
            chunk.append(entry)
            stream.next += 1
        }
        return chunk
    }

    /// Links with roster still to send, for the driver to offer room to.
    public var linksAwaitingRoster: [Link] { rosterStreams.isEmpty ? [] : Array(rosterStreams.keys) }

    /// Sends `link` its next `roster` chunk, at most `ControlLimits.maxMessageBytes` of control
    /// message: the driver calls it when the connection's control stream has that much room. True
    /// when a chunk was made (perhaps the last: `isSendingRoster` says whether more follow); false
    /// when there was nothing to send (the roster is complete, or the session over).
    @discardableResult
    public func continueRoster(_ link: Link) -> Bool {
        guard var stream = rosterStreams.removeValue(forKey: link) else { return false }
        guard case .joined(let channel, _)? = sessions[link], channel === stream.channel else { return false }
        let chunk = nextRosterChunk(&stream)
        if !stream.isFinished { rosterStreams[link] = stream }
        guard !chunk.isEmpty else { return false }
        outputs.append(.send(.roster(chunk), to: [link]))
        return true
    }

    /// Whether `link` has roster still to come.
    public func isSendingRoster(to link: Link) -> Bool { rosterStreams[link] != nil }

    /// Whether any link has roster still to come.
    public var isSendingRosters: Bool { !rosterStreams.isEmpty }

    /// The token on `link` was refused (or the join failed): tell the client why and close.
    public func refuse(_ link: Link, code: RefusalCode, reason: String) {
        // A join's check that failed ends here (one refused by `admit` has ended already: a no-op).
        if case .verifying? = sessions[link] { _ = tokenChecks.ended(link, claims: nil) }
        guard sessions[link] != nil else { return }
        sessions[link] = .refused
        counters.refusals += 1
        outputs.append(.send(.refused(code: code, reason: reason), to: [link]))
        outputs.append(.close(link, code: .refused, reason: reason))
    }

    /// What a token says about its member (at a join, or a renewal): name, role, priority, rights.
    static func take(_ claims: ParticipantClaims, into member: inout Member) {
        member.name = claims.name
        member.role = claims.role
        member.image = claims.image
        member.priority = claims.priority
        member.canTalk = claims.capabilities.contains(.talk)
        member.canListen = claims.capabilities.contains(.listen)
        member.token = (claims.tokenID, claims.issuedAt, claims.expiresAt)
    }

    /// Why `claims` may not be used, when its token was issued before the newest one the member has
    /// joined or renewed with (nil: it was not). A member's newest token is the floor: without it, a
    /// member whose rights were cut (a new listen-only token) could rejoin with the older token it
    /// kept and talk again. Compared in whole seconds, as a token's `iat` is: two tokens from the same
    /// second both pass, and a stored time's rounding can't refuse the very token it came from.
    static func supersededReason(_ claims: ParticipantClaims, newest: Date?) -> String? {
        func second(_ date: Date) -> Double { date.timeIntervalSince1970.rounded(.down) }
        guard let newest, second(claims.issuedAt) < second(newest) else { return nil }
        let format = Date.ISO8601FormatStyle()
        return "this token (issued \(claims.issuedAt.formatted(format))) is older than the one you last joined with (issued \(newest.formatted(format))), which replaced it; use your newest token or ask for a new one"
    }

    /// The token a joined member sent with `renewToken` checked out: the session goes on under it,
    /// with its expiry, and with its claims as at a join (a new priority or a lost `talk` counts at
    /// once, for the floor too).
    public func renew(_ link: Link, claims: ParticipantClaims, at time: HubTime) {
        let revoked = tokenChecks.ended(link, claims: claims)
        // Closed, replaced or expired while the token was being checked: too late.
        guard case .joined(let channel, let slot)? = sessions[link], var member = channel.members[slot], member.link == link else { return }
        if let revoked {
            renewalRefused(link, code: .tokenRevoked, reason: Self.revokedReason(revoked), checked: true)
            return
        }
        guard claims.channel == channel.record.id else {
            renewalRefused(link, code: .tokenWrongChannel, reason: "the token is for channel \(claims.channel), not this one; renew with a token for \(channel.record.id)",
                           checked: true)
            return
        }
        guard claims.userID == member.userID else {
            renewalRefused(link, code: .tokenWrongUser, reason: "the token is for user '\(claims.userID)', not '\(member.userID)'; renew with a token issued to this member",
                           checked: true)
            return
        }
        if let superseded = Self.supersededReason(claims, newest: member.token?.issuedAt) {
            renewalRefused(link, code: .tokenRevoked, reason: superseded, checked: true)
            return
        }
        let before = member.participant
        Self.take(claims, into: &member)
        if !member.canListen { stopCatchUp(&member, in: channel) }
        channel.members[slot] = member
        counters.tokenRenewals += 1
        outputs.append(.store(.upsertMember(member.record(channel: channel.record.id, lastSeen: time.date))))
        outputs.append(.send(.tokenRenewed(expiresAt: claims.expiresAt), to: [link]))
        scheduleExpiry(channel, slot: slot, link: link, claims: claims, at: time)
        channel.floor.rightsChanged(slot, priority: member.priority, canTalk: member.canTalk, now: time.instant.nanoseconds)
        applyFloorEvents(channel, at: time)
        // Everyone, the member too, sees new claims (its own entry decides its transmission mode).
        // `talking` is left out of the comparison: a floor change above has announced itself.
        var after = channel.member(slot).participant
        after.talking = before.talking
        if after != before { announce(channel, slot: slot, at: time.instant) }
        listenersChanged(channel)
    }

    /// The token sent with `renewToken` was refused: the member is told why, and the session carries
    /// on under its old token until that expires.
    public func renewalRefused(_ link: Link, code: RefusalCode, reason: String) {
        renewalRefused(link, code: code, reason: reason, checked: false)
    }

    func renewalRefused(_ link: Link, code: RefusalCode, reason: String, checked: Bool) {
        if !checked { _ = tokenChecks.ended(link, claims: nil) }
        guard case .joined? = sessions[link] else { return }
        counters.tokenRenewalsRefused += 1
        outputs.append(.send(.error(code: code, reason: reason), to: [link]))
    }

    /// The next free slot after the last one given, wrapping past 65535 to 1: slot 0 is not a
    /// member's (protocol §16.2.2).
    /// A free slot, or nil when all 65,535 are taken (slots are 16 bits on the wire, 0 unused). The
    /// search is bounded: without a bound a full channel looped forever on the event loop that every
    /// channel and the relay share.
    func allocateSlot(in channel: ChannelState) -> UInt16? {
        guard channel.members.count < Int(UInt16.max) else { return nil }
        for _ in 0 ..< Int(UInt16.max) + 1 {
            let slot = channel.nextSlot
            channel.nextSlot &+= 1
            if slot != 0, channel.members[slot] == nil { return slot }
        }
        return nil
    }

    /// Removes a member from the channel for good: floor, roster, store.
    /// - Parameter endReason: what the transmission log says of a burst this cuts short.
    func forget(_ channel: ChannelState, slot: UInt16, at time: HubTime, endReason: String = "left") {
        guard var member = channel.members[slot] else { return }
        for recording in channel.recordings { _ = recording.forgetMissed(slot) }
        // A recording only this member was owed goes now (stopCatchUp recycles only if it read one).
        channel.recycleRecordings()
        stopCatchUp(&member, in: channel)
        // The member's row is gone by the time the floor's `.ended` is applied below, and the log
        // entry needs it: a burst cut short by leaving is logged here.
        if channel.floor.mayTalk(slot) { logBurstEnd(channel, slot: slot, reason: endReason, at: time) }
        channel.floor.release(slot, now: time.instant.nanoseconds)
        channel.members[slot] = nil
        channel.slotsByUser[member.userID] = nil
        reconnecting.removeAll { $0.is(channel, slot) }
        expiries.drop { $0.channel === channel && $0.slot == slot }
        applyFloorEvents(channel, at: time)
        listenersChanged(channel)
        outputs.append(.send(.participantLeft(slot: slot, userID: member.userID), to: channel.connectedLinks))
        outputs.append(.store(.removeMember(channel: channel.record.id, user: member.userID)))
    }

    /// A revocation the hub acts on (`apply`, or an administrator's removal that stored one): kept
    /// while token checks are under way, whose store reads may have come before it was stored.
    public func noteRevocation(_ revocation: RevocationRecord) {
        tokenChecks.note(revocation)
    }

    static func revokedReason(_ revocation: RevocationRecord) -> String {
        revocation.tokenID == nil
            ? "an administrator removed you from the channel while this token was being checked; ask the channel's administrator for a new token"
            : "the token was revoked (\(revocation.reason)) while it was being checked; ask the channel's administrator for a new one"
    }
}
