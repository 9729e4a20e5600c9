import ChannelProtocol
import ChannelStore
import FloorControl
import Foundation
import Wire

extension ChannelHub {
    /// Adds a channel, or updates it: members connected to it get the new descriptor, and the floor
    /// takes the new mode and maximum burst at once (a channel turned half duplex keeps one talker).
    public func upsertChannel(_ record: ChannelRecord, members stored: [MemberRecord] = [], at time: HubTime) {
        // Records are validated when written through squelchd, but a row edited in the database
        // (or another store) may hold any number; the floor's limit must not trap on it.
        var record = record
        record.maxBurstSeconds = min(max(record.maxBurstSeconds, ChannelRecord.maxBurstRange.lowerBound),
                                     ChannelRecord.maxBurstRange.upperBound)
        if let channel = channels[record.id] {
            guard channel.record != record else { return }
            let before = channel.info
            channel.record = record
            // Only what members see is announced (not, say, a new `updatedAt`), and before any
            // revocation the change causes, so that clients read the new mode first.
            if channel.info != before { outputs.append(.send(.descriptor(channel.info), to: channel.connectedLinks)) }
            channel.floor.reconfigure(ChannelState.floorConfiguration(record, configuration), now: time.instant.nanoseconds)
            applyFloorEvents(channel, at: time)
            return
        }
        let channel = ChannelState(record: record, configuration: configuration)
        for stored in stored {
            // Past 65,535 stored members the rest stay in the store only (a join of one is refused
            // as the channel being full).
            guard channel.slotsByUser[stored.userID] == nil, let slot = allocateSlot(in: channel) else { continue }
            channel.slotsByUser[stored.userID] = slot
            // What its last token allowed, as stored. A row from before the store kept it: the member
            // only listens until its next token says more.
            let grant = stored.grant
            var member = Member(
                slot: slot, userID: stored.userID, name: stored.displayName, role: grant?.role, priority: grant?.priority ?? 0,
                canTalk: grant?.canTalk ?? false, canListen: grant?.canListen ?? true, joinedAt: stored.joinedAt, link: nil,
                connection: .offline, pushToken: stored.pushToken, pushEnvironment: stored.pushEnvironment,
                pushRegisteredAt: stored.pushRegisteredAt)
            member.token = grant.map { ($0.tokenID, $0.tokenIssuedAt, $0.tokenExpiresAt) }
            member.lastSeen = stored.lastSeen
            member.unheard = Set(stored.unheard)
            channel.members[slot] = member
        }
        channels[record.id] = channel
    }

    public func channel(_ id: UUID) -> ChannelInfo? { channels[id]?.info }
    public var channelIDs: [UUID] { Array(channels.keys) }

    /// A join's check found `record` in the store, which the hub has not loaded yet: a channel
    /// another process (`squelchd channel create`) made since the last revision poll. It is loaded
    /// now rather than the join refused as "does not exist" for up to a second. A channel this hub
    /// knows already is left alone (the check's copy may be older than the poll's), and so is one it
    /// deleted (the check may have read it just before the deletion; ids are never reused).
    public func channelSeenByCheck(_ record: ChannelRecord, at time: HubTime) {
        guard channels[record.id] == nil, !deletedChannels.contains(record.id) else { return }
        upsertChannel(record, at: time)
        channelsLoadedByChecks = true
    }

    /// Whether a join's check loaded a channel since the last call. The check's read may predate a
    /// deletion the revision poll has applied already (without ever seeing the channel), so the
    /// poll reloads once more after such a load, whether or not the revision moved.
    public func takeChannelsLoadedByChecks() -> Bool {
        defer { channelsLoadedByChecks = false }
        return channelsLoadedByChecks
    }
    public var channelCount: Int { channels.count }
    public var connectionCount: Int { sessions.count }

    /// The roster as members see it.
    public func roster(of id: UUID) -> [RosterMember] { channels[id]?.roster ?? [] }

    /// The roster as an operator sees it, with each connected listener's reported loss.
    public func liveRoster(of id: UUID) -> [LiveMember] {
        guard let channel = channels[id] else { return [] }
        let queue = channel.floor.queuedMembers
        return channel.members.values.sorted { $0.slot < $1.slot }.map { member in
            LiveMember(participant: member.participant,
                       receptionLoss: member.link != nil && member.canListen ? member.receptionLoss : nil,
                       queuePosition: queue.firstIndex(of: member.slot).map { $0 + 1 })
        }
    }

    /// Removes a channel: its members are told and disconnected; a burst in progress is logged.
    public func deleteChannel(_ id: UUID, at time: HubTime) {
        deletedChannels.insert(id)
        guard let channel = channels.removeValue(forKey: id) else { return }
        for slot in channel.floor.currentTalkers { logBurstEnd(channel, slot: slot, reason: "channelDeleted", at: time) }
        for member in channel.members.values {
            if let link = member.link {
                sessions[link] = nil
                outputs.append(.send(.refused(code: .channelDeleted, reason: "the channel was deleted by an administrator"), to: [link]))
                outputs.append(.close(link, code: .removed, reason: "channel deleted"))
            }
            if member.pushToken != nil {
                outputs.append(.memberGone(channel: id, member: member.record(channel: id, lastSeen: time.date)))
            }
        }
        reconnecting.removeAll { $0.channel === channel }
        catchingUp.removeAll(in: channel)
        expiries.drop { $0.channel === channel }
    }

    /// Whether `user` is a member of the channel here: connected, reconnecting, or known from the store.
    public func isMember(channel id: UUID, user: String) -> Bool {
        channels[id]?.slotsByUser[user] != nil
    }

    /// An administrator removed a member, or revoked the token it joined with (`code` `.tokenRevoked`):
    /// it is told why and disconnected, and leaves the roster. Its row's removal is queued behind any
    /// write of it still waiting, so a join's row written late does not bring it back.
    public func removeMember(channel id: UUID, user: String, at time: HubTime, code: RefusalCode = .removedByAdmin,
                             reason: String = "an administrator removed you from the channel") {
        guard let channel = channels[id], let slot = channel.slotsByUser[user], let member = channel.members[slot] else { return }
        if let link = member.link {
            sessions[link] = .refused
            outputs.append(.send(.refused(code: code, reason: reason), to: [link]))
            outputs.append(.close(link, code: .removed, reason: code == .tokenRevoked ? "token revoked" : "removed"))
        }
        forget(channel, slot: slot, at: time, endReason: code == .tokenRevoked ? "tokenRevoked" : "removedByAdmin")
        if member.pushToken != nil { outputs.append(.memberGone(channel: id, member: member.record(channel: id, lastSeen: time.date))) }
    }

    /// Forgets at most `limit` members that have stayed away since before `cutoff`
    /// (`memberRetentionDays`): offline now, and last connected before it. They leave the roster as
    /// if removed (everyone connected is told, the row goes, a device with a push token is told to
    /// leave the channel), but nothing is revoked. A channel with a join being checked is skipped
    /// this time, since that join may be one of them coming back. Each one costs a `participantLeft`
    /// to everyone connected, hence the limit; the caller comes back for the rest. Returns how many
    /// went.
    @discardableResult
    public func forgetIdleMembers(seenBefore cutoff: Date, limit: Int, at time: HubTime) -> Int {
        var verifying = Set<UUID>()
        for case .verifying(let channel) in sessions.values { verifying.insert(channel) }
        var forgotten = 0
        for channel in channels.values where !verifying.contains(channel.record.id) {
            for (slot, member) in channel.members {
                guard forgotten < limit else { return forgotten }
                guard member.link == nil, member.connection == .offline, let seen = member.lastSeen, seen < cutoff else { continue }
                forget(channel, slot: slot, at: time)
                if member.pushToken != nil {
                    outputs.append(.memberGone(channel: channel.record.id, member: member.record(channel: channel.record.id, lastSeen: seen)))
                }
                forgotten += 1
            }
        }
        return forgotten
    }

    /// Every connected member, for the hourly write of their last-seen times: the row is otherwise
    /// written at the join and the close, so after a crash a member connected for weeks would load
    /// as last seen weeks ago.
    public var connectedMembers: [MemberKey] {
        var keys: [MemberKey] = []
        for channel in channels.values {
            for member in channel.members.values where member.link != nil {
                keys.append(MemberKey(channel: channel.record.id, user: member.userID))
            }
        }
        return keys
    }

    /// A revocation, possibly made by another process (`squelchd token revoke`): a member whose
    /// token it voids is removed, with its reason. A member revocation spares a member that has since
    /// joined with a token issued after it, and removes a stored member that has not joined since the
    /// server started (its token is unknown; it was removed).
    public func apply(_ revocation: RevocationRecord, at time: HubTime) {
        noteRevocation(revocation)
        guard let channel = channels[revocation.channelID] else { return }
        let id = channel.record.id
        for member in Array(channel.members.values) {
            let void = member.token.map { revocation.voids(channel: id, user: member.userID, tokenID: $0.id, issuedAt: $0.issuedAt) }
                ?? (revocation.tokenID == nil && revocation.userID == member.userID)
            guard void else { continue }
            if revocation.tokenID == nil {
                removeMember(channel: id, user: member.userID, at: time)
            } else {
                removeMember(channel: id, user: member.userID, at: time, code: .tokenRevoked,
                             reason: "your participant token was revoked (\(revocation.reason)); ask the channel's administrator for a new one")
            }
        }
    }

    /// APNs called a member's push token dead. It is forgotten unless the device registered a new one
    /// meanwhile (the push was for the old token).
    public func pushTokenRejected(channel id: UUID, user: String, token: String) {
        guard let channel = channels[id], let slot = channel.slotsByUser[user],
              channel.members[slot]?.pushToken == token.lowercased() else { return }
        channel.members[slot]?.pushToken = nil
        channel.members[slot]?.pushEnvironment = nil
        channel.members[slot]?.pushRegisteredAt = nil
        outputs.append(.store(.clearPushToken(channel: id, user: user)))
    }

    /// The server is going down: every member hears that service is unavailable, bursts in progress
    /// are logged. The driver then closes connections with `CloseCode.goingAway`.
    public func shutdown(reason: String, at time: HubTime) {
        for channel in channels.values {
            for slot in channel.floor.currentTalkers { logBurstEnd(channel, slot: slot, reason: "shutdown", at: time) }
            let links = channel.connectedLinks
            if !links.isEmpty { outputs.append(.send(.serviceStatus(.unavailable, reason: reason), to: links)) }
            for member in channel.members.values where member.link != nil {
                outputs.append(.store(.touchMember(channel: channel.record.id, user: member.userID, lastSeen: time.date)))
            }
        }
    }
}
