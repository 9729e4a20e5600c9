import ChannelProtocol
import ChannelStore
import FloorControl
import Foundation
import ParticipantTokens
import Wire

/// The live state of every channel: who is connected, who holds the floor, and where each audio
/// packet goes. A sans-I/O state machine in the manner of `Endpoint`: transport events, control
/// messages, verified tokens, admin edits and time go in; control messages, closes, store writes
/// and pushes come out of `takeOutputs()`, and audio goes out through the `send` closure the caller
/// passes (so the relay hands each sealed datagram straight to the transport, allocating nothing).
///
/// Not Sendable: it lives on the server's event loop, next to the endpoint.
public final class ChannelHub {
    /// The same push token registered again is written to the store at most this often (seconds).
    static let pushTokenRewriteInterval: TimeInterval = 600

    enum Session {
        /// Transport connected; no join yet.
        case connected
        /// A join is being verified.
        case verifying(channel: UUID)
        case joined(ChannelState, slot: UInt16)
        /// The join was refused; the connection closes after a short delay (so the client can read
        /// why) and nothing it sends meanwhile counts.
        case refused
    }

    public let configuration: HubConfiguration
    public private(set) var counters = HubCounters()
    var channels: [UUID: ChannelState] = [:]
    /// Channels deleted while this hub ran: a join's check that read one just before must not bring
    /// it back (`channelSeenByCheck`). One UUID per deletion.
    var deletedChannels: Set<UUID> = []
    var channelsLoadedByChecks = false
    var sessions: [Link: Session] = [:]
    /// Connections with no `join` yet, and the sweep that first saw them so (`closeUnjoined`).
    var unjoined: [Link: WireInstant] = [:]
    /// Each connection's allowance of control messages (`HubConfiguration.controlMessagesPerSecond`).
    var controlBudget: [Link: TokenBucket] = [:]
    var outputs: [HubOutput] = []
    let codec = MessageCodec()
    /// One datagram being forwarded: its header is rewritten here and the payload copied once.
    let scratch: UnsafeMutableRawBufferPointer
    /// Members waiting to go from reconnecting to offline, or being replayed a burst: the only
    /// per-member timers, so `nextDeadline` needn't walk every member.
    var reconnecting: [(channel: ChannelState, slot: UInt16)] = []
    var catchingUp: [(channel: ChannelState, slot: UInt16)] = []
    var nextCatchUpTick: WireInstant?
    /// When each connected member's token expires, and when it is to be told so (an entry is stale
    /// once the member has left, closed or joined again with another token), and the earliest of
    /// those times, so that `nextDeadline` reads one value.
    var expiries: [TokenDeadline] = []
    var nextExpiry: WireInstant?
    /// No later than when the first ended burst kept for members who missed it stops being kept (it
    /// may be earlier, which costs a wake-up that finds nothing due).
    var nextMissedExpiry: WireInstant?
    /// Joiners whose roster is still being sent: the slots it had at the join, in slot order, and how
    /// far the sending got. A big channel's roster leaves a chunk at a time as the connection has room
    /// (`continueRoster`), so a join holds no encoded roster in memory and no single step encodes
    /// megabytes while audio waits on the event loop. Each chunk shows its members as they are when
    /// it is made.
    var rosterStreams: [Link: RosterStream] = [:]
    /// Token checks (joins, renewals) under way, by connection: how many, and how many revocations
    /// the hub had applied when the first began. A check reads the store's revocations off the loop,
    /// and one applied here before its outcome arrives may have been stored after that read: it is
    /// checked again against those (`revokedDuringCheck`).
    var tokenChecks: [Link: (count: Int, mark: Int)] = [:]
    /// Revocations applied while a check was under way; `revocationsBefore` were applied before the
    /// first of them. Those no check under way began before are dropped as checks end, so it holds
    /// the revocations of the last few seconds at most.
    var revocationsDuringChecks: [RevocationRecord] = []
    var revocationsBefore = 0

    struct RosterStream {
        let channel: ChannelState
        let slots: [UInt16]
        var next: Int
        var isFinished: Bool { next == slots.count }
    }

    struct TokenDeadline {
        var channel: ChannelState
        var slot: UInt16
        var tokenID: String
        var at: WireInstant
        /// When to send `tokenExpiring`; nil once sent (or if it went with the join).
        var notice: WireInstant?
        var next: WireInstant { notice ?? at }
    }

    public init(configuration: HubConfiguration = HubConfiguration()) {
        self.configuration = configuration
        scratch = .allocate(byteCount: AudioHeader.size + AudioHeader.maxPayload, alignment: 8)
    }

    deinit { scratch.deallocate() }

    /// Everything the hub wants done since the last call, in order.
    public func takeOutputs() -> [HubOutput] {
        defer { outputs.removeAll(keepingCapacity: true) }
        return outputs
    }

    // MARK: Channels (startup and admin)

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
    public func roster(of id: UUID) -> [Participant] { channels[id]?.roster ?? [] }

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
        catchingUp.removeAll { $0.channel === channel }
        dropExpiry { $0.channel === channel }
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

    /// A revocation the hub acts on (`apply`, or an administrator's removal that stored one): kept
    /// while token checks are under way, whose store reads may have come before it was stored.
    public func noteRevocation(_ revocation: RevocationRecord) {
        if tokenChecks.isEmpty {
            revocationsBefore += 1
        } else {
            revocationsDuringChecks.append(revocation)
        }
    }

    func checkStarted(_ link: Link) {
        let mark = revocationsBefore + revocationsDuringChecks.count
        let check = tokenChecks[link]
        tokenChecks[link] = (count: (check?.count ?? 0) + 1, mark: check?.mark ?? mark)
    }

    /// A check on `link` is over. Returns a revocation applied since it began that voids `claims`.
    func checkEnded(_ link: Link, claims: ParticipantClaims?) -> RevocationRecord? {
        guard let check = tokenChecks[link] else { return nil }
        let since = revocationsDuringChecks.dropFirst(max(0, check.mark - revocationsBefore))
        let revoked = claims.flatMap { claims in
            since.first { $0.voids(channel: claims.channel, user: claims.userID, tokenID: claims.tokenID, issuedAt: claims.issuedAt) }
        }
        tokenChecks[link] = check.count > 1 ? (check.count - 1, check.mark) : nil
        pruneCheckRevocations()
        return revoked
    }

    /// Drops the revocations that no check under way began before: all of them once none is.
    func pruneCheckRevocations() {
        guard !revocationsDuringChecks.isEmpty else { return }
        let oldest = tokenChecks.values.lazy.map(\.mark).min() ?? (revocationsBefore + revocationsDuringChecks.count)
        let done = min(revocationsDuringChecks.count, oldest - revocationsBefore)
        guard done > 0 else { return }
        revocationsDuringChecks.removeFirst(done)
        revocationsBefore += done
    }

    static func revokedReason(_ revocation: RevocationRecord) -> String {
        revocation.tokenID == nil
            ? "an administrator removed you from the channel while this token was being checked; ask the channel's administrator for a new token"
            : "the token was revoked (\(revocation.reason)) while it was being checked; ask the channel's administrator for a new one"
    }

    /// APNs called a member's push token dead. It is forgotten unless the device registered a new one
    /// meanwhile (the push was for the old token).
    public func pushTokenRejected(channel id: UUID, user: String, token: String) {
        guard let channel = channels[id], let slot = channel.slotsByUser[user],
              channel.members[slot]?.pushToken == token.lowercased() else { return }
        channel.members[slot]!.pushToken = nil
        channel.members[slot]!.pushEnvironment = nil
        channel.members[slot]!.pushRegisteredAt = nil
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

    // MARK: Transport events

    public func connected(_ link: Link) {
        sessions[link] = .connected
    }

    /// The connection closed (or timed out). A joined member turns `reconnecting` and keeps its
    /// place, and the floor if it held it, for the grace period. `deliberately`: its client closed it
    /// on purpose (CONNECTION_CLOSE with `CloseCode.normal`: the app quit, or went to the
    /// background), so there is nothing to wait for: it is `offline` at once, and its floor or place
    /// in the queue goes now. (Every `walkie talk` showed its member `reconnecting` for 2 s after.)
    public func closed(_ link: Link, deliberately: Bool = false, at time: HubTime) {
        controlBudget[link] = nil
        unjoined[link] = nil
        rosterStreams[link] = nil
        if tokenChecks.removeValue(forKey: link) != nil { pruneCheckRevocations() }
        guard let session = sessions.removeValue(forKey: link) else { return }
        guard case .joined(let channel, let slot) = session, var member = channel.members[slot] else { return }
        // Silent long enough to show offline already (`silentOffline`): the idle timeout that closes
        // its connection now is no sign of it coming back.
        let wasOffline = member.connection == .offline
        member.link = nil
        member.silentSince = nil
        member.lastSeen = time.date
        if deliberately {
            member.connection = .offline
            member.reconnectingUntil = nil
        } else if !wasOffline {
            member.connection = .reconnecting
            member.reconnectingUntil = time.instant + configuration.disconnectGrace
            reconnecting.append((channel, slot))
        }
        owe(channel, slot: slot, replaying: member.catchUp, at: time.instant)
        stopCatchUp(&member, in: channel)
        channel.members[slot] = member
        dropExpiry { $0.channel === channel && $0.slot == slot }
        if deliberately {
            // Not "disconnected", whose length is taken back by the grace it waited: this one waited none.
            if channel.floor.mayTalk(slot) { channel.endReasons[slot] = "closed" }
            channel.floor.release(slot, now: time.instant.nanoseconds)
        } else {
            channel.floor.disconnected(slot, now: time.instant.nanoseconds)
        }
        applyFloorEvents(channel, at: time)
        listenersChanged(channel)
        if !wasOffline { outputs.append(.send(.participant(member.participant), to: channel.links(except: slot))) }
        outputs.append(.store(.touchMember(channel: channel.record.id, user: member.userID, lastSeen: time.date)))
    }

    /// A control message arrived on `link`.
    public func control(_ link: Link, bytes: [UInt8], at time: HubTime) {
        guard let session = sessions[link] else { return }
        // Closing after its refusal: whatever else the connection sends is ignored (protocol
        // §16.2.1), unread and unanswered, garbage and floods included.
        if case .refused = session { return }
        let withinBudget = controlBudget[link, default: TokenBucket(tokens: Double(configuration.controlMessageBurst), refilledAt: time.instant)]
            .take(at: time.instant, perSecond: configuration.controlMessagesPerSecond, burst: configuration.controlMessageBurst)
        let message: ClientMessage
        do {
            message = try codec.decodeClientMessage(bytes)
        } catch {
            if !withinBudget {
                rateLimited(link, nil, at: time)
                return
            }
            counters.controlErrors += 1
            outputs.append(.send(.error(code: .protocolError, reason: error.description), to: [link]))
            return
        }
        if !withinBudget {
            switch (message, session) {
            // Always taken from a joined member: dropping a release would hold the floor until the
            // maximum burst length while everyone waits (a bouncing button can spend the budget), and
            // dropping a leave would keep a member the device has left. Neither makes work for anyone
            // else when repeated: a release from a member without the floor or a place in the queue
            // changes nothing, and a leave ends the session. From a connection that hasn't joined,
            // each would only earn an error, so those stay limited.
            case (.floorRelease, .joined), (.leave, .joined): break
            default:
                rateLimited(link, message, at: time)
                return
            }
        }
        if case .join(let token, let channel, let reason) = message {
            switch session {
            case .connected:
                sessions[link] = .verifying(channel: channel)
                unjoined[link] = nil
                checkStarted(link)
                outputs.append(.verify(link, token: token, channel: channel, reason: reason))
            case .verifying, .joined:
                outputs.append(.send(.error(code: .protocolError, reason: "already joined or joining on this connection; open a new connection to join another channel"), to: [link]))
            case .refused:
                break  // closing; the refusal said why
            }
            return
        }
        if case .refused = session { return }
        guard case .joined(let channel, let slot) = session, channel.members[slot] != nil else {
            outputs.append(.send(.error(code: .notJoined, reason: "join a channel first"), to: [link]))
            return
        }
        // Anything from a member the liveness sweep had given up on shows it is back (a leave says
        // so itself, with `participantLeft`).
        if channel.members[slot]!.connection != .connected, message != .leave { markHeard(channel, slot: slot, at: time) }
        switch message {
        case .join: break
        case .leave:
            sessions[link] = nil
            forget(channel, slot: slot, at: time)
            // No leave push: the device left by itself, and its token died with the channel (reference §1.5).
            // The membership, token included, goes from the store with `forget`.
            outputs.append(.close(link, code: .normal, reason: "left the channel"))
        case .floorRequest(let request, let queue):
            channel.members[slot]!.floorRequest = request
            let member = channel.members[slot]!
            channel.floor.request(slot, priority: member.priority, canTalk: member.canTalk, mayQueue: queue, now: time.instant.nanoseconds)
            applyFloorEvents(channel, at: time)
        case .floorRelease:
            channel.floor.release(slot, now: time.instant.nanoseconds)
            applyFloorEvents(channel, at: time)
        case .setMuted(let muted):
            guard channel.members[slot]!.muted != muted else { return }
            channel.members[slot]!.muted = muted
            outputs.append(.send(.participant(channel.members[slot]!.participant), to: channel.connectedLinks))
        case .registerPushToken(let token, let environment):
            let lower = token.lowercased()
            var member = channel.members[slot]!
            // A client sends its token again after every reconnect. The registration time moves on in
            // memory (APNs' `Unregistered` keeps a token the device registered after it died), but
            // the same token in the same environment is written at most every ten minutes: a loop of
            // registrations must not be a loop of database writes.
            let changed = member.pushToken != lower || member.pushEnvironment != environment
            let recentlyWritten = member.pushTokenWrittenAt.map { time.date.timeIntervalSince($0) < Self.pushTokenRewriteInterval } ?? false
            member.pushToken = lower
            member.pushEnvironment = environment
            member.pushRegisteredAt = time.date
            if changed || !recentlyWritten {
                member.pushTokenWrittenAt = time.date
                outputs.append(.store(.setPushToken(channel: channel.record.id, user: member.userID, token: lower,
                                                    environment: environment, registeredAt: time.date)))
            }
            channel.members[slot] = member
            outputs.append(.send(.pushTokenRegistered, to: [link]))
        case .setSubscriptions(let unheard):
            let chosen = Set(unheard)
            if chosen != channel.members[slot]!.unheard {
                channel.members[slot]!.unheard = chosen
                dropUnheardCatchUps(channel, slot: slot)
                listenersChanged(channel)
                // Stored, so that after a restart the member is not woken by, or replayed, a talker it
                // unsubscribed from before it joins again and says so. (A client sends its list after
                // every join, so an unchanged one is not written again.)
                outputs.append(.store(.setSubscriptions(channel: channel.record.id, user: channel.members[slot]!.userID,
                                                        unheard: chosen.sorted())))
            }
            outputs.append(.send(.subscriptions(unheard: unheard), to: [link]))
        case .renewToken(let token):
            checkStarted(link)
            outputs.append(.verifyRenewal(link, token: token, channel: channel.record.id))
        case .receptionReport(let percent):
            // Kept even from a member that may not listen now: `hears` leaves it out until a renewal
            // lets it listen again, and then its figure is the client's, as the client believes.
            guard channel.members[slot]!.receptionLoss != percent else { return }
            channel.members[slot]!.receptionLoss = percent
            counters.receptionReports += 1
            updateListenerLoss(channel)
        }
    }

    // MARK: Join

    /// The token on `link` checked out: the member joins (or rejoins) its channel.
    public func admit(_ link: Link, claims: ParticipantClaims, reason: JoinReason, at time: HubTime) {
        let revoked = checkEnded(link, claims: claims)
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
        member.lastSeen = time.date
        member.reconnectingUntil = nil
        member.silentSince = nil
        // A new session: the client starts both loss figures at 0. (Until then the member has no
        // link, which keeps its old figure out of every talker's worst.)
        member.receptionLoss = 0
        member.listenerLossTold = 0
        channel.members[slot] = member
        reconnecting.removeAll { $0.channel === channel && $0.slot == slot }
        sessions[link] = .joined(channel, slot: slot)
        counters.joins += 1
        channel.floor.reconnected(slot, now: time.instant.nanoseconds)

        outputs.append(.store(.upsertMember(member.record(channel: channel.record.id, lastSeen: time.date))))
        // A big roster goes in chunks, so that no control message nears the size limit; `joined`
        // carries the first, and the rest follow as the connection has room (`continueRoster`).
        // `joined`'s own share is measured: an image URL full of characters JSON escapes can take most of it.
        let info = channel.info, talkers = channel.talkers
        let head = codec.encode(.joined(channel: info, you: slot, roster: [], talkers: talkers)).count
        // The joiner's own entry and the talkers' first, so that they ride in `joined`: the client
        // takes its transmission mode from its own entry, and names a talker from its entry.
        let early = [slot] + talkers.map(\.slot).filter { $0 != slot }
        let rest = channel.members.keys.filter { !early.contains($0) }.sorted()
        var stream = RosterStream(channel: channel, slots: early + rest, next: 0)
        let first = nextRosterChunk(&stream, RosterChunker(firstChunkBytes: ControlLimits.maxMessageBytes - head - 1_024))
        outputs.append(.send(.joined(channel: info, you: slot, roster: first, talkers: talkers), to: [link]))
        if !stream.isFinished { rosterStreams[link] = stream }
        scheduleExpiry(channel, slot: slot, link: link, claims: claims, at: time)
        // Rights are the token's: a talker back with a listen-only token stops being relayed, and a new
        // priority counts for the floor it holds or waits for. After `joined`, whose snapshot shows the
        // floor as it was: the events that follow describe the change.
        channel.floor.rightsChanged(slot, priority: member.priority, canTalk: member.canTalk, now: time.instant.nanoseconds)
        applyFloorEvents(channel, at: time)
        outputs.append(.send(.participant(channel.members[slot]!.participant), to: channel.links(except: slot)))
        if member.canListen { startCatchUp(channel, slot: slot, at: time) }
        listenersChanged(channel)
    }

    /// The entries of `stream`'s next chunk, as its members are now (one that left meanwhile is
    /// skipped; one that joined meanwhile was announced with `participant`).
    func nextRosterChunk(_ stream: inout RosterStream, _ chunker: RosterChunker = RosterChunker()) -> [Participant] {
        var chunker = chunker
        var chunk: [Participant] = []
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
        if case .verifying? = sessions[link] { _ = checkEnded(link, claims: nil) }
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
        member.priority = claims.priority
        member.canTalk = claims.capabilities.contains(.talk)
        member.canListen = claims.capabilities.contains(.listen)
        member.token = (claims.tokenID, claims.issuedAt, claims.expiresAt)
    }

    /// The token a joined member sent with `renewToken` checked out: the session goes on under it,
    /// with its expiry, and with its claims as at a join (a new priority or a lost `talk` counts at
    /// once, for the floor too).
    public func renew(_ link: Link, claims: ParticipantClaims, at time: HubTime) {
        let revoked = checkEnded(link, claims: claims)
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
        var after = channel.members[slot]!.participant
        after.talking = before.talking
        if after != before { outputs.append(.send(.participant(channel.members[slot]!.participant), to: channel.connectedLinks)) }
        listenersChanged(channel)
    }

    /// The token sent with `renewToken` was refused: the member is told why, and the session carries
    /// on under its old token until that expires.
    public func renewalRefused(_ link: Link, code: RefusalCode, reason: String) {
        renewalRefused(link, code: code, reason: reason, checked: false)
    }

    func renewalRefused(_ link: Link, code: RefusalCode, reason: String, checked: Bool) {
        if !checked { _ = checkEnded(link, claims: nil) }
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
        reconnecting.removeAll { $0.channel === channel && $0.slot == slot }
        dropExpiry { $0.channel === channel && $0.slot == slot }
        applyFloorEvents(channel, at: time)
        listenersChanged(channel)
        outputs.append(.send(.participantLeft(slot: slot, userID: member.userID), to: channel.connectedLinks))
        outputs.append(.store(.removeMember(channel: channel.record.id, user: member.userID)))
    }

    /// A message over the connection's rate (nil: one that could not be read) is dropped. A joined
    /// member's floor request is answered, so that the client's request ends; anything else gets an
    /// `error`, at most one a second. Releases and leaves from joined members never come here.
    func rateLimited(_ link: Link, _ message: ClientMessage?, at time: HubTime) {
        counters.controlRateLimited += 1
        let text = "more than \(configuration.controlMessagesPerSecond) control messages a second from this connection; the message was dropped, slow down"
        // A joined member's floor request gets its answer, one for one as within the rate (its client
        // waits for it); from a connection that hasn't joined it gets the capped `error` below, as
        // anything else does.
        if case .floorRequest(let request, _)? = message, case .joined(let channel, let slot)? = sessions[link] {
            // A member that holds the floor or waits for it is told where it stands (granted, or its
            // place), never denied: a denial would end the client's request while the floor still
            // counts it. The answer comes from here, to it alone, and the floor is not asked: a
            // repeated request would tell everyone waiting their places again, and keep a silent
            // talker's burst alive, at whatever rate the client sends.
            // Answered, so it is the request the member's answers name from now on.
            channel.members[slot]?.floorRequest = request
            if let burst = channel.floor.burst(of: slot) {
                sendGrant(channel, slot: slot, burst: UInt16(truncatingIfNeeded: burst), until: channel.floor.burstDeadline(of: slot), at: time)
                return
            }
            if let position = channel.floor.queuedMembers.firstIndex(of: slot) {
                outputs.append(.send(.floor(FloorEvent(kind: .queued, slot: slot, position: position + 1, request: request)),
                                     to: [link]))
                return
            }
            counters.floorDenials += 1
            outputs.append(.send(.floor(FloorEvent(kind: .denied, cause: .rateLimited, reason: text, request: request)), to: [link]))
            return
        }
        guard controlBudget[link]?.noticeDue(at: time.instant) == true else { return }
        outputs.append(.send(.error(code: .rateLimited, reason: text), to: [link]))
    }

    // MARK: Floor

    func applyFloorEvents(_ channel: ChannelState, at time: HubTime) {
        var granted = false
        defer { if granted { updateListenerLoss(channel) } }
        for event in channel.floor.takeEvents() {
            switch event {
            case .granted(let slot, let burst, let until):
                let burst16 = UInt16(truncatingIfNeeded: burst)
                counters.floorGrants += 1
                counters.bursts += 1
                channel.members[slot]?.talking = true
                channel.members[slot]?.burstStartedAt = time.date
                // Logged as it starts, so that a crash during it leaves it in the log (`interrupted`
                // at the next start); its end replaces this record.
                if let member = channel.members[slot] {
                    outputs.append(.store(.logTransmission(TransmissionRecord(
                        channelID: channel.record.id, userID: member.userID, startedAt: time.date,
                        durationMilliseconds: 0, endReason: TransmissionRecord.inProgress))))
                }
                let pace = channel.members[slot]?.audioPace
                    ?? TokenBucket(tokens: Double(configuration.audioPacketBurst), refilledAt: time.instant)
                channel.startRecording(talker: slot, burst: burst16, pace: pace)
                noteMissing(channel, talker: slot, at: time)
                addToCatchUps(channel, talker: slot)
                sendGrant(channel, slot: slot, burst: burst16, until: until, at: time)
                granted = true
            case .confirmed(let slot, let burst, let until):
                sendGrant(channel, slot: slot, burst: UInt16(truncatingIfNeeded: burst), until: until, at: time)
                granted = true
            case .taken(let slot, let burst, _):
                guard let member = channel.members[slot] else { break }
                outputs.append(.send(.floor(FloorEvent(kind: .taken, slot: slot, burst: UInt16(truncatingIfNeeded: burst))),
                                     to: channel.links(except: slot)))
                outputs.append(.send(.participant(member.participant), to: channel.connectedLinks))
                var wake: [MemberRecord] = []
                var connected: [WakeCandidate] = []
                for other in channel.members.values where configuration.wakesByPush && other.pushToken != nil
                    && other.hears(member) && other.slot != slot {
                    if other.link == nil, !mayBeWoken(other, at: time) { continue }
                    let record = other.record(channel: channel.record.id, lastSeen: time.date)
                    if let link = other.link { connected.append(WakeCandidate(member: record, link: link)) } else { wake.append(record) }
                }
                if !wake.isEmpty || !connected.isEmpty {
                    outputs.append(.burstStarted(channel: channel.record.id, talker: member.participant, wake: wake,
                                                 connected: connected))
                }
            case .denied(let slot, let reason):
                counters.floorDenials += 1
                let cause: FloorCause
                let text: String
                switch reason {
                case .busy: cause = .busy; text = "someone else is talking"
                case .listenOnly: cause = .notAllowed; text = "your token allows listening only"
                case .queueFull: cause = .queueFull; text = "too many members are waiting to talk"
                case .outranked: cause = .queueFull; text = "your place in the full queue went to a member with a higher priority"
                }
                if let member = channel.members[slot], let link = member.link {
                    outputs.append(.send(.floor(FloorEvent(kind: .denied, slot: slot, cause: cause, reason: text,
                                                           request: member.floorRequest)), to: [link]))
                }
            case .queued(let slot, let position):
                if let member = channel.members[slot], let link = member.link {
                    outputs.append(.send(.floor(FloorEvent(kind: .queued, slot: slot, position: position,
                                                           request: member.floorRequest)), to: [link]))
                }
            case .revoked(let slot, let reason):
                counters.floorRevocations += 1
                let cause: FloorCause
                let text: String
                switch reason {
                case .preempted(let by, _):
                    cause = .preempted
                    text = "\(channel.members[by]?.name ?? "someone") has priority"
                    channel.endReasons[slot] = "preempted"
                case .maxBurstReached:
                    cause = .maxBurstReached
                    text = "the maximum talk time of \(channel.record.maxBurstSeconds) s was reached"
                    channel.endReasons[slot] = "maxBurst"
                case .disconnected:
                    cause = .disconnected
                    text = "the connection was lost"
                    channel.endReasons[slot] = "disconnected"
                case .notAllowed:
                    cause = .notAllowed
                    text = "your new participant token allows listening only"
                    channel.endReasons[slot] = "notAllowed"
                case .channelChanged:
                    cause = .channelChanged
                    text = "the channel was switched to \(channel.record.mode == .halfDuplex ? "half duplex" : "fewer simultaneous talkers"); someone else kept the floor"
                    channel.endReasons[slot] = "channelChanged"
                case .silent:
                    // The wire's `disconnected`: to the talker (if it still hears us) the outcome is the
                    // same, and a client that predates `silent` understands it.
                    cause = .disconnected
                    text = "no audio arrived from you for \((configuration.talkerSilenceLimit / 1_000_000_000).formatted()) s"
                    channel.endReasons[slot] = "silent"
                }
                if let link = channel.members[slot]?.link {
                    outputs.append(.send(.floor(FloorEvent(kind: .revoked, slot: slot, cause: cause, reason: text)), to: [link]))
                }
            case .ended(let slot, let burst, _):
                let reason = channel.endReasons.removeValue(forKey: slot) ?? "released"
                logBurstEnd(channel, slot: slot, reason: reason, at: time)
                if let ended = channel.endRecording(talker: slot, at: time.instant, keepAtMost: configuration.maxMissedBursts,
                                                    window: configuration.missedBurstWindow) {
                    noteMissedDeadline(ended)
                }
                outputs.append(.send(.floor(FloorEvent(kind: .ended, slot: slot, burst: UInt16(truncatingIfNeeded: burst))),
                                     to: channel.connectedLinks))
                if var member = channel.members[slot] {
                    member.talking = false
                    member.burstStartedAt = nil
                    member.burstProgressAt = nil
                    channel.members[slot] = member
                    outputs.append(.send(.participant(member.participant), to: channel.connectedLinks))
                }
            case .idle:
                outputs.append(.send(.floor(FloorEvent(kind: .idle)), to: channel.connectedLinks))
            }
        }
    }

    /// Who hears whom changed (a member came, went, changed rights or subscriptions): the relay's list
    /// is rebuilt, and talkers learn their listeners' worst loss if that moved.
    func listenersChanged(_ channel: ChannelState) {
        channel.rebuildListeners()
        updateListenerLoss(channel)
    }

    /// Tells each talker the worst loss reported by the connected members who hear it, where that
    /// differs from what it was last told. The talker's encoder adds FEC from it (docs/protocol.md
    /// §16.4.4), so one listener on a bad link is enough: FEC is for the worst link, and costs the
    /// others only a little of the clean quality. O(members × talkers), on reports and membership
    /// changes only, never per packet.
    func updateListenerLoss(_ channel: ChannelState) {
        for talker in channel.floor.currentTalkers {
            guard let member = channel.members[talker], let link = member.link else { continue }
            var worst = 0
            for other in channel.members.values where other.slot != talker && other.link != nil && other.hears(member) {
                worst = max(worst, other.receptionLoss)
            }
            guard worst != member.listenerLossTold else { continue }
            channel.members[talker]!.listenerLossTold = worst
            outputs.append(.send(.receptionLoss(lossPercent: worst), to: [link]))
        }
    }

    /// `granted` to the talker. `maxBurstSeconds` is the time left until the burst is revoked for
    /// length (TS 24.380's Floor Granted carries T2's remaining time): the whole limit for a new
    /// burst, less for a grant repeated to a member that already talks (a repeated request, a rejoin).
    func sendGrant(_ channel: ChannelState, slot: UInt16, burst: UInt16, until: UInt64?, at time: HubTime) {
        guard let member = channel.members[slot], let link = member.link else { return }
        let now = time.instant.nanoseconds
        let left = until.map { $0 > now ? Int(($0 - now + 999_999_999) / 1_000_000_000) : 0 } ?? channel.record.maxBurstSeconds
        outputs.append(.send(.floor(FloorEvent(kind: .granted, slot: slot, burst: burst, maxBurstSeconds: left,
                                               request: member.floorRequest)), to: [link]))
    }

    /// Writes the length so far of every burst going on: a second after it started, then every
    /// `burstProgressInterval` (the driver calls it about once a second). The record stays
    /// `inProgress`; its end replaces it. Without it, a burst the server was killed during stayed in
    /// the log with a length of 0 (`interrupted` at the next start), as if it had never been heard;
    /// the first write comes early because most bursts are over in a few seconds.
    public func logBurstProgress(at time: HubTime) {
        let interval = Double(configuration.burstProgressInterval) / 1e9
        guard interval > 0 else { return }
        for channel in channels.values {
            for slot in channel.floor.currentTalkers {
                guard let member = channel.members[slot], let started = member.burstStartedAt else { continue }
                let due = (member.burstProgressAt ?? started).addingTimeInterval(interval)
                guard time.date >= due else { continue }
                channel.members[slot]?.burstProgressAt = time.date
                outputs.append(.store(.logTransmission(TransmissionRecord(
                    channelID: channel.record.id, userID: member.userID, startedAt: started,
                    durationMilliseconds: max(1, Int(time.date.timeIntervalSince(started) * 1000)),
                    endReason: TransmissionRecord.inProgress))))
            }
        }
    }

    func logBurstEnd(_ channel: ChannelState, slot: UInt16, reason: String, at time: HubTime) {
        guard let member = channel.members[slot], let started = member.burstStartedAt else { return }
        channel.members[slot]?.burstStartedAt = nil
        channel.members[slot]?.burstProgressAt = nil
        // A burst ended for silence or a lost connection was over before the floor noticed: the
        // log's length ends at the last audio (or the disconnect), not after the wait that found it.
        let noticedAfter: UInt64 = switch reason {
        case "silent": configuration.talkerSilenceLimit
        case "disconnected": configuration.disconnectGrace
        default: 0
        }
        let milliseconds = max(0, Int(time.date.timeIntervalSince(started) * 1000) - Int(noticedAfter / 1_000_000))
        outputs.append(.store(.logTransmission(TransmissionRecord(
            channelID: channel.record.id, userID: member.userID, startedAt: started,
            durationMilliseconds: milliseconds, endReason: reason))))
    }

    // MARK: Relay (the hot path)

    /// One audio datagram from `link`. If its sender holds the floor, it is recorded for late joiners
    /// and forwarded to every listening member but the sender, through `send` (which seals and queues
    /// it for one listener, and returns false if it couldn't). Anything else is dropped and counted.
    /// Returns how many listeners it went to.
    @discardableResult
    public func receiveAudio(from link: Link, datagram: UnsafeRawBufferPointer, at now: WireInstant,
                             send: (UnsafeRawBufferPointer, Link) -> Bool) -> Int {
        counters.packetsIn &+= 1
        counters.bytesIn &+= datagram.count
        guard let header = AudioHeader(parsing: datagram) else { drop(.malformed); return 0 }
        guard case .joined(let channel, let slot)? = sessions[link] else { drop(.notJoined); return 0 }
        guard let burst = channel.floor.burst(of: slot) else { drop(.notFloorHolder); return 0 }
        guard UInt16(truncatingIfNeeded: burst) == header.burst else { drop(.staleBurst); return 0 }
        channel.floor.heard(slot, now: now.nanoseconds)

        let payloadCount = datagram.count - AudioHeader.size
        let payload = UnsafeRawBufferPointer(rebasing: datagram[AudioHeader.size...])
        // Every burst has a recording from its grant to its end; without one nothing polices the
        // sender, so nothing is relayed either.
        guard let recording = channel.recording(of: slot) else { drop(.notFloorHolder); return 0 }
        guard recording.pace.take(at: now, perSecond: configuration.audioPacketsPerSecond,
                                  burst: configuration.audioPacketBurst) else { drop(.overRate); return 0 }
        recording.append(header, payload: payload, maxPackets: configuration.maxRecordedPackets,
                         maxBytes: configuration.maxRecordedBytes)
        AudioHeader(flags: header.flags.intersection(.endOfBurst), slot: slot, burst: header.burst, sequence: header.sequence)
            .write(to: scratch)
        UnsafeMutableRawBufferPointer(rebasing: scratch[AudioHeader.size ..< AudioHeader.size + payloadCount]).copyMemory(from: payload)
        let packet = UnsafeRawBufferPointer(rebasing: scratch[..<(AudioHeader.size + payloadCount)])
        var forwarded = 0
        for listener in channel.listeners where listener.slot != slot && (listener.unheard.isEmpty || !listener.unheard.contains(slot)) {
            if send(packet, listener.link) {
                forwarded &+= 1
            } else {
                drop(.sendFailed)
            }
        }
        counters.packetsOut &+= forwarded
        counters.bytesOut &+= forwarded &* packet.count
        return forwarded
    }

    func drop(_ reason: DropReason) { counters.drops[reason.rawValue] &+= 1 }

    // MARK: Late-join catch-up

    func startCatchUp(_ channel: ChannelState, slot: UInt16, at time: HubTime) {
        var cursors: [CatchUpCursor] = []
        guard let joiner = channel.members[slot] else { return }
        var released = false
        for recording in channel.recordings where recording.talker != slot {
            // A burst still going is replayed to anyone who joins; one that ended, only to a member
            // who missed it, once. Both from the first packet, in the order they started.
            let owed = recording.forgetMissed(slot)
            released = released || (owed && recording.missed.isEmpty)
            guard !recording.ended || owed else { continue }
            if let talker = channel.members[recording.talker], !joiner.hears(talker) { continue }
            if recording.ended { counters.missedBurstReplays += 1 }
            recording.readers += 1
            cursors.append(CatchUpCursor(recording: recording, next: 0))
        }
        if released { channel.recycleRecordings() }
        guard !cursors.isEmpty else { return }
        channel.members[slot]?.catchUp = cursors
        // A member that rejoined on a new connection mid-replay is still listed: once is enough, or
        // it would be served twice per tick and given every new burst twice.
        if !catchingUp.contains(where: { $0.channel === channel && $0.slot == slot }) {
            catchingUp.append((channel, slot))
        }
        // The first packets go out at once (the next timeout, which is now).
        nextCatchUpTick = time.instant
    }

    /// A burst that starts while members are still being replayed earlier ones: they are off the
    /// live fan-out until their replay ends, so without a cursor of their own they would miss its
    /// start. They get it from its first packet, after what they are being replayed.
    func addToCatchUps(_ channel: ChannelState, talker slot: UInt16) {
        guard !catchingUp.isEmpty, let talker = channel.members[slot], let recording = channel.recording(of: slot) else { return }
        for (other, member) in catchingUp where other === channel && member != slot {
            guard let listener = channel.members[member], !listener.catchUp.isEmpty, listener.hears(talker) else { continue }
            recording.readers += 1
            channel.members[member]!.catchUp.append(CatchUpCursor(recording: recording, next: 0))
        }
    }

    /// A burst starts: the members who will hear it but aren't there to (no connection, or one gone
    /// silent) are owed it if they join soon enough after it ends (`missedBurstWindow`).
    func noteMissing(_ channel: ChannelState, talker slot: UInt16, at time: HubTime) {
        guard configuration.missedBurstWindow > 0, let talker = channel.members[slot],
              let recording = channel.recording(of: slot) else { return }
        for member in channel.members.values where member.slot != slot && member.hears(talker) && member.connection != .connected {
            // Only members who may be back within the window: woken by this burst's push, dropped
            // moments ago, or silent. One offline for long without a token won't, and noting it
            // would keep nearly every burst for 30 s.
            if member.link != nil || member.connection == .reconnecting || mayBeWoken(member, at: time) {
                recording.missed.insert(member.slot)
            }
        }
        // Its deadline is noted when it ends (`keepUntil` counts from the end).
    }

    /// Whether a burst's start wakes this offline member by push: the server sends pushes, the member
    /// has a push token, and the participant token it last joined with expired no more than
    /// `wakeAfterTokenExpiry` ago.
    func mayBeWoken(_ member: Member, at time: HubTime) -> Bool {
        guard configuration.wakesByPush, member.pushToken != nil else { return false }
        guard let token = member.token else { return true }
        return time.date.timeIntervalSince(token.expiresAt) <= configuration.wakeAfterTokenExpiry
    }

    /// Keeps `nextMissedExpiry` no later than when `recording` stops being kept, so that the timer
    /// needn't look through every recording to know.
    func noteMissedDeadline(_ recording: BurstRecording) {
        // A burst still going is kept at least until its end plus the window: its end notes the time.
        guard !recording.missed.isEmpty, let due = recording.keepUntil else { return }
        nextMissedExpiry = nextMissedExpiry.map { min($0, due) } ?? due
    }

    /// A member drops out (its connection closed or went silent): it is owed the bursts still going,
    /// and those it was being replayed, from their start when it joins again.
    func owe(_ channel: ChannelState, slot: UInt16, replaying cursors: [CatchUpCursor], at now: WireInstant) {
        guard configuration.missedBurstWindow > 0, let member = channel.members[slot] else { return }
        for recording in channel.recordings where recording.talker != slot && !recording.missed.contains(slot) {
            let replaying = cursors.contains { $0.recording === recording }
            guard replaying || !recording.ended else { continue }
            if !replaying, let talker = channel.members[recording.talker], !member.hears(talker) { continue }
            recording.missed.insert(slot)
            // A replay cut off late in the window (a long burst, replayed at 20 times real time)
            // gets the member the whole window again to come back; at most twice the window from
            // the end, or a member dropping again and again would keep it for good.
            if recording.ended, let ended = recording.endedAt {
                let limit = ended + 2 * configuration.missedBurstWindow
                recording.keepUntil = min(limit, max(recording.keepUntil ?? now, now + configuration.missedBurstWindow))
            }
            noteMissedDeadline(recording)
        }
    }

    /// A member being replayed bursts unsubscribed from some talkers (its first message after a join
    /// or a resume, often): their bursts are not replayed to it any more.
    func dropUnheardCatchUps(_ channel: ChannelState, slot: UInt16) {
        guard let listener = channel.members[slot], !listener.catchUp.isEmpty else { return }
        var kept: [CatchUpCursor] = []
        for cursor in listener.catchUp {
            if let talker = channel.members[cursor.recording.talker], !listener.hears(talker) {
                cursor.recording.readers -= 1
            } else {
                kept.append(cursor)
            }
        }
        guard kept.count != listener.catchUp.count else { return }
        channel.members[slot]!.catchUp = kept
        channel.recycleRecordings()
    }

    /// Ends a member's replay. A burst already over that only it was reading goes back to the spares
    /// now: on a quiet channel no later burst would recycle it, and it may hold megabytes.
    func stopCatchUp(_ member: inout Member, in channel: ChannelState) {
        guard !member.catchUp.isEmpty else { return }
        for cursor in member.catchUp { cursor.recording.readers -= 1 }
        member.catchUp.removeAll()
        channel.recycleRecordings()
    }

    /// Sends each late joiner its next catch-up packets; a joiner that reached the live edge of every
    /// recording goes back on the live fan-out list.
    func serveCatchUp(at time: HubTime, send: (UnsafeRawBufferPointer, Link) -> Bool) {
        var index = 0
        while index < catchingUp.count {
            let (channel, slot) = catchingUp[index]
            guard var member = channel.members[slot], let link = member.link, !member.catchUp.isEmpty else {
                catchingUp.remove(at: index)
                continue
            }
            var budget = member.catchUp.allSatisfy({ $0.next == 0 }) ? configuration.catchUpInitialPackets
                                                                      : configuration.catchUpPacketsPerTick
            // Strictly in order: a later cursor is served only once every earlier one is at its end.
            // A cursor at the live edge of a burst still going is kept (and sent that burst's new
            // packets on later ticks) until every cursor is there: only then does the fan-out take
            // over, so neither a burst granted during the replay (empty until its first packet) nor
            // one already caught up with loses packets while the others are replayed.
            var cursorIndex = 0
            while cursorIndex < member.catchUp.count {
                let recording = member.catchUp[cursorIndex].recording
                while budget > 0, member.catchUp[cursorIndex].next < recording.count {
                    let length = recording.write(member.catchUp[cursorIndex].next, into: scratch)
                    if send(UnsafeRawBufferPointer(rebasing: scratch[..<length]), link) {
                        counters.catchUpPacketsOut &+= 1
                        counters.catchUpBytesOut &+= length
                    } else {
                        drop(.sendFailed)
                    }
                    member.catchUp[cursorIndex].next += 1
                    budget -= 1
                }
                if member.catchUp[cursorIndex].next < recording.count { break }
                if recording.ended {
                    recording.readers -= 1
                    member.catchUp.remove(at: cursorIndex)
                } else {
                    cursorIndex += 1
                }
            }
            if member.catchUp.allSatisfy({ $0.next >= $0.recording.count && !$0.recording.ended }) {
                for cursor in member.catchUp { cursor.recording.readers -= 1 }
                member.catchUp.removeAll()
            }
            channel.members[slot] = member
            if member.catchUp.isEmpty {
                catchingUp.remove(at: index)
                listenersChanged(channel)
                channel.recycleRecordings()
            } else {
                index += 1
            }
        }
        nextCatchUpTick = catchingUp.isEmpty ? nil : time.instant + configuration.catchUpInterval
    }

    // MARK: Token expiry

    /// Forgets the expiries of sessions that ended (closed, left, removed, channel deleted), so the list
    /// holds only live sessions and no deleted channel's state. `nextExpiry` may then be early, which
    /// only costs a wake-up that finds nothing due.
    func dropExpiry(where ended: (TokenDeadline) -> Bool) {
        expiries.removeAll(where: ended)
        if expiries.isEmpty { nextExpiry = nil }
    }

    /// The token was checked at the door (or at a renewal); the session must not outlive it either (a
    /// shift's token kept connected for days, or resumed across networks, would otherwise never end).
    /// The member hears `tokenRenewalNotice` before the end, at once if less than that is left.
    func scheduleExpiry(_ channel: ChannelState, slot: UInt16, link: Link, claims: ParticipantClaims, at time: HubTime) {
        let left = UInt64((min(max(0, claims.expiresAt.timeIntervalSince(time.date)), 10 * 365 * 86_400) * 1e9).rounded())
        let expiry = time.instant + left
        var notice: WireInstant?
        if left > configuration.tokenRenewalNotice {
            notice = time.instant + (left - configuration.tokenRenewalNotice)
        } else if left > 0 {
            outputs.append(.send(.tokenExpiring(expiresAt: claims.expiresAt), to: [link]))
        }
        dropExpiry { $0.channel === channel && $0.slot == slot }
        let deadline = TokenDeadline(channel: channel, slot: slot, tokenID: claims.tokenID, at: expiry, notice: notice)
        expiries.append(deadline)
        nextExpiry = nextExpiry.map { min($0, deadline.next) } ?? deadline.next
    }

    /// Ends the sessions whose token has expired, and warns those whose token is about to.
    func expireTokens(at time: HubTime) {
        var earliest: WireInstant?
        var index = 0
        while index < expiries.count {
            let entry = expiries[index]
            guard let member = entry.channel.members[entry.slot], let link = member.link, let token = member.token,
                  token.id == entry.tokenID, channels[entry.channel.record.id] === entry.channel else {
                expiries.remove(at: index)
                continue
            }
            if entry.at <= time.instant {
                expiries.remove(at: index)
                expire(entry.channel, slot: entry.slot, at: time)
                continue
            }
            if let notice = entry.notice, notice <= time.instant {
                expiries[index].notice = nil
                outputs.append(.send(.tokenExpiring(expiresAt: token.expiresAt), to: [link]))
            }
            earliest = earliest.map { min($0, expiries[index].next) } ?? expiries[index].next
            index += 1
        }
        nextExpiry = earliest
    }

    /// The member's token expired while it was connected: it is told so and disconnected, and stays a
    /// member (offline, its push token kept): a new token lets it back in, as after any absence.
    func expire(_ channel: ChannelState, slot: UInt16, at time: HubTime) {
        guard var member = channel.members[slot], let link = member.link else { return }
        counters.tokenExpiries += 1
        sessions[link] = .refused
        outputs.append(.send(.refused(code: .tokenExpired, reason: "your participant token expired; ask the channel's administrator for a new one, then join again"), to: [link]))
        outputs.append(.close(link, code: .refused, reason: "token expired"))
        member.link = nil
        member.connection = .offline
        member.lastSeen = time.date
        member.reconnectingUntil = nil
        owe(channel, slot: slot, replaying: member.catchUp, at: time.instant)
        stopCatchUp(&member, in: channel)
        channel.members[slot] = member
        if channel.floor.mayTalk(slot) { channel.endReasons[slot] = "tokenExpired" }
        channel.floor.release(slot, now: time.instant.nanoseconds)
        applyFloorEvents(channel, at: time)
        listenersChanged(channel)
        outputs.append(.send(.participant(channel.members[slot]!.participant), to: channel.connectedLinks))
        outputs.append(.store(.touchMember(channel: channel.record.id, user: member.userID, lastSeen: time.date)))
    }

    // MARK: Liveness

    /// The driver's liveness sweep (about once a second). A member whose connection is still open but
    /// has gone silent, because its phone died or lost its network or its app went to the background
    /// with keepalives off, would otherwise show `connected` until the transport's idle timeout,
    /// minutes later, and a dispatcher would call a unit that can't hear. Such a member shows
    /// `reconnecting` until it is heard again (then `connected`), its connection closes (then
    /// `closed(_:at:)` takes over), or it has been silent for `silentOffline` (then `offline`, the
    /// session still open for a resume). Only the roster changes: its place, the floor
    /// (`FloorArbiter.silenceLimit` covers a silent talker) and the relay are as they were.
    ///
    /// The changes of one sweep go out as one `roster` message per channel (in chunks), not one
    /// `participant` each: when the server itself was cut off, every member goes silent in the same
    /// sweep, and a message per member to every member would be millions in a big channel.
    /// - Parameters:
    ///   - mayMarkSilent: false right after the server itself stalled (the driver's loop ran late):
    ///     what it hasn't read yet may be from every member, so only "heard" counts this time.
    ///   - time: now, for how long a burst the member is owed is kept.
    ///   - isHeard: whether the transport has heard from `link` within the liveness window; a query,
    ///     so that the hub stays free of clocks and sockets.
    public func sweepLiveness(mayMarkSilent: Bool = true, at time: HubTime, isHeard: (Link) -> Bool) {
        closeUnjoined(at: time)
        for channel in channels.values {
            var changed: [UInt16] = []
            var replaying = false
            // The listener array is rebuilt once for the channel, not once per member back: after
            // an outage of the server's own network, every member comes back in the same sweep.
            defer { if replaying { listenersChanged(channel) } }
            for (slot, member) in channel.members {
                guard let link = member.link else { continue }
                let heard = isHeard(link)
                if heard, member.connection != .connected {
                    channel.members[slot]!.connection = .connected
                    channel.members[slot]!.silentSince = nil
                    if replayOwed(channel, slot: slot, at: time, rebuild: false) { replaying = true }
                } else if !heard, mayMarkSilent, member.connection == .connected {
                    channel.members[slot]!.connection = .reconnecting
                    channel.members[slot]!.silentSince = time.instant
                    counters.silentMembers += 1
                    owe(channel, slot: slot, replaying: [], at: time.instant)
                } else if !heard, mayMarkSilent, member.connection == .reconnecting, configuration.silentOffline > 0,
                          let since = member.silentSince, time.instant.since(since) >= configuration.silentOffline {
                    channel.members[slot]!.connection = .offline
                } else {
                    continue
                }
                changed.append(slot)
            }
            guard let first = changed.first else { continue }
            let links = channel.connectedLinks
            if changed.count == 1 {
                outputs.append(.send(.participant(channel.members[first]!.participant), to: links))
                continue
            }
            // Chunked as a joiner's roster is.
            var stream = RosterStream(channel: channel, slots: changed, next: 0)
            while !stream.isFinished { outputs.append(.send(.roster(nextRosterChunk(&stream)), to: links)) }
        }
    }

    /// Refuses connections that have not sent `join` within `joinDeadline` of a sweep first seeing
    /// them (so between the deadline and a sweep interval or two more). The transport's handshake
    /// doesn't authenticate clients: without this, anyone could hold connections open for good with
    /// keepalives, each with its control stream's reassembly buffer, and the hub's tables, pinned.
    /// Every client joins right after its handshake.
    func closeUnjoined(at time: HubTime) {
        guard configuration.joinDeadline > 0 else { return }
        var late: [Link] = []
        for (link, session) in sessions {
            guard case .connected = session else { continue }
            guard let since = unjoined[link] else {
                unjoined[link] = time.instant
                continue
            }
            if time.instant.since(since) >= configuration.joinDeadline { late.append(link) }
        }
        let seconds = configuration.joinDeadline / 1_000_000_000
        for link in late {
            unjoined[link] = nil
            refuse(link, code: .notJoined, reason: "no join within \(seconds) s of connecting; send join right after the handshake")
        }
    }

    /// A member the sweep marked silent sent a control message: everyone, itself included (it may
    /// have missed its own `reconnecting`, or not), sees it `connected` again at once.
    private func markHeard(_ channel: ChannelState, slot: UInt16, at time: HubTime) {
        guard channel.members[slot]?.link != nil else { return }
        channel.members[slot]!.connection = .connected
        channel.members[slot]!.silentSince = nil
        outputs.append(.send(.participant(channel.members[slot]!.participant), to: channel.connectedLinks))
        replayOwed(channel, slot: slot, at: time)
    }

    /// A member heard again on the same session (a phone back from the background, resuming its
    /// connection rather than joining again) gets the bursts it was noted missing while silent, from
    /// their first packet, as a join would have. What reached it live meanwhile comes again, flagged
    /// catch-up, and the client drops what it already has.
    @discardableResult
    private func replayOwed(_ channel: ChannelState, slot: UInt16, at time: HubTime, rebuild: Bool = true) -> Bool {
        guard let member = channel.members[slot], member.canListen, member.catchUp.isEmpty,
              channel.recordings.contains(where: { $0.missed.contains(slot) }) else { return false }
        startCatchUp(channel, slot: slot, at: time)
        if rebuild { listenersChanged(channel) }
        return true
    }

    // MARK: Time

    public var nextDeadline: WireInstant? {
        var deadline = nextCatchUpTick
        if let nextExpiry { deadline = deadline.map { min($0, nextExpiry) } ?? nextExpiry }
        for channel in channels.values {
            if let floorDeadline = channel.floor.nextDeadline {
                let instant = WireInstant(nanoseconds: floorDeadline)
                deadline = deadline.map { min($0, instant) } ?? instant
            }
        }
        for (channel, slot) in reconnecting {
            if let until = channel.members[slot]?.reconnectingUntil { deadline = deadline.map { min($0, until) } ?? until }
        }
        if let nextMissedExpiry { deadline = deadline.map { min($0, nextMissedExpiry) } ?? nextMissedExpiry }
        return deadline
    }

    /// Runs whatever is due: maximum-burst and disconnect revocations, reconnecting members going
    /// offline, sessions whose token expired, and catch-up packets (through `send`, like `receiveAudio`).
    public func handleTimeout(at time: HubTime, send: (UnsafeRawBufferPointer, Link) -> Bool) {
        for channel in channels.values {
            if let due = channel.floor.nextDeadline, due <= time.instant.nanoseconds {
                channel.floor.handleTimeout(now: time.instant.nanoseconds)
                applyFloorEvents(channel, at: time)
            }
        }
        if let due = nextMissedExpiry, due <= time.instant {
            nextMissedExpiry = nil
            for channel in channels.values where !channel.recordings.isEmpty {
                channel.expireMissedBursts(now: time.instant)
                for recording in channel.recordings { noteMissedDeadline(recording) }
            }
        }
        var index = 0
        while index < reconnecting.count {
            let (channel, slot) = reconnecting[index]
            guard let member = channel.members[slot], member.connection == .reconnecting,
                  let until = member.reconnectingUntil else {
                reconnecting.remove(at: index)
                continue
            }
            if until <= time.instant {
                channel.members[slot]!.connection = .offline
                channel.members[slot]!.reconnectingUntil = nil
                reconnecting.remove(at: index)
                outputs.append(.send(.participant(channel.members[slot]!.participant), to: channel.connectedLinks))
            } else {
                index += 1
            }
        }
        if let expiry = nextExpiry, expiry <= time.instant { expireTokens(at: time) }
        if let tick = nextCatchUpTick, tick <= time.instant { serveCatchUp(at: time, send: send) }
    }
}
