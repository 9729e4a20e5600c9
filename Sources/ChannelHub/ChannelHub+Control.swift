import ChannelProtocol
import ChannelStore
import FloorControl
import Foundation
import Wire

extension ChannelHub {
    public func connected(_ link: Link) {
        sessions[link] = .connected
    }

    /// A connection that came with an entry pass (docs/protocol.md §7.8): connected as far as control
    /// messages go, and its join comes next, but no audio reaches it until `handshakeDone`.
    public func entered(_ link: Link) {
        connected(link)
        handshaking.insert(link)
    }

    /// The handshake of an entered connection finished: audio can reach it. Nothing live did while
    /// it was held, so bursts begun meanwhile are replayed from their first packet, as to a late joiner.
    public func handshakeDone(_ link: Link, at time: HubTime) {
        guard handshaking.remove(link) != nil, case .joined(let channel, let slot)? = sessions[link],
              var member = channel.members[slot], member.link == link, member.mediaHeld else { return }
        member.mediaHeld = false
        channel.members[slot] = member
        if !member.catchUp.isEmpty {
            catchingUp.add(channel, slot: slot, now: time.instant)  // its held replay starts now
        } else if member.canListen {
            startCatchUp(channel, slot: slot, at: time)
        }
        listenersChanged(channel)
    }

    /// The connection closed (or timed out). A joined member turns `reconnecting` and keeps its
    /// place, and the floor if it held it, for the grace period. `deliberately`: its client closed it
    /// on purpose (CONNECTION_CLOSE with `CloseCode.normal`: the app quit, or went to the
    /// background), so there is nothing to wait for: it is `offline` at once, and its floor or place
    /// in the queue goes now. (Every `walkie talk` showed its member `reconnecting` for 2 s after.)
    public func closed(_ link: Link, deliberately: Bool = false, at time: HubTime) {
        controlBudget[link] = nil
        unjoined[link] = nil
        handshaking.remove(link)
        rosterStreams[link] = nil
        tokenChecks.closed(link)
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
            reconnecting.append(MemberRef(channel: channel, slot: slot))
        }
        owe(channel, slot: slot, replaying: member.catchUp, at: time.instant)
        stopCatchUp(&member, in: channel)
        channel.members[slot] = member
        expiries.drop { $0.channel === channel && $0.slot == slot }
        if deliberately {
            // Not "disconnected", whose length is taken back by the grace it waited: this one waited none.
            if channel.floor.mayTalk(slot) { channel.endReasons[slot] = "closed" }
            channel.floor.release(slot, now: time.instant.nanoseconds)
        } else {
            channel.floor.disconnected(slot, now: time.instant.nanoseconds)
        }
        applyFloorEvents(channel, at: time)
        listenersChanged(channel)
        if !wasOffline { announce(channel, slot: slot, to: channel.links(except: slot), at: time.instant) }
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
                tokenChecks.started(link)
                outputs.append(.verify(link, token: token, channel: channel, reason: reason))
            case .verifying, .joined:
                outputs.append(.send(.error(code: .protocolError, reason: "already joined or joining on this connection; open a new connection to join another channel"), to: [link]))
            case .refused:
                break  // closing; the refusal said why
            }
            return
        }
        if case .refused = session { return }
        guard case .joined(let channel, let slot) = session, let member = channel.members[slot] else {
            outputs.append(.send(.error(code: .notJoined, reason: "join a channel first"), to: [link]))
            return
        }
        // Anything from a member the liveness sweep had given up on shows it is back (a leave says
        // so itself, with `participantLeft`). (`member` is as it was before: what the cases below read
        // of it, the member's own settings and rights, is not what that changes.)
        if member.connection != .connected, message != .leave { markHeard(channel, slot: slot, at: time) }
        switch message {
        case .join: break
        case .leave:
            sessions[link] = nil
            forget(channel, slot: slot, at: time)
            // No leave push: the device left by itself, and its ephemeral token died with the channel (Apple issues one per joined channel).
            // The membership, token included, goes from the store with `forget`.
            outputs.append(.close(link, code: .normal, reason: "left the channel"))
        case .floorRequest(let request, let queue):
            channel.members[slot]?.floorRequest = request
            guard channel.isServed(at: time.instant) else {
                // A cluster node whose lease on the channel has run out: another node may be its
                // home already, and two homes would let two talkers in.
                counters.floorDenials += 1
                outputs.append(.send(.floor(FloorEvent(kind: .denied, slot: slot, cause: .serviceUnavailable,
                                                       reason: "this node no longer holds the channel; reconnecting finds its home",
                                                       request: request)), to: [link]))
                return
            }
            if let limit = floorLimit(channel, slot: slot, at: time.instant) {
                counters.floorRequestsLimited += 1
                counters.floorDenials += 1
                outputs.append(.send(.floor(FloorEvent(kind: .denied, slot: slot, cause: .rateLimited, reason: limit, request: request)),
                                     to: [link]))
                return
            }
            channel.floor.request(slot, priority: member.priority, canTalk: member.canTalk, mayQueue: queue, now: time.instant.nanoseconds)
            applyFloorEvents(channel, at: time)
        case .floorRelease:
            channel.floor.release(slot, now: time.instant.nanoseconds)
            applyFloorEvents(channel, at: time)
        case .setMuted(let muted):
            guard member.muted != muted else { return }
            channel.members[slot]?.muted = muted
            announce(channel, slot: slot, at: time.instant)
        case .registerPushToken(let token, let environment):
            let lower = token.lowercased()
            var member = channel.member(slot)
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
            if chosen != member.unheard {
                channel.members[slot]?.unheard = chosen
                dropUnheardCatchUps(channel, slot: slot)
                listenersChanged(channel)
                // Stored, so that after a restart the member is not woken by, or replayed, a talker it
                // unsubscribed from before it joins again and says so. (A client sends its list after
                // every join, so an unchanged one is not written again.)
                outputs.append(.store(.setSubscriptions(channel: channel.record.id, user: member.userID,
                                                        unheard: chosen.sorted())))
            }
            outputs.append(.send(.subscriptions(unheard: unheard), to: [link]))
        case .renewToken(let token):
            tokenChecks.started(link)
            outputs.append(.verifyRenewal(link, token: token, channel: channel.record.id))
        case .receptionReport(let percent):
            // Kept even from a member that may not listen now: `hears` leaves it out until a renewal
            // lets it listen again, and then its figure is the client's, as the client believes.
            guard member.receptionLoss != percent else { return }
            channel.members[slot]?.receptionLoss = percent
            counters.receptionReports += 1
            updateListenerLoss(channel)
        }
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

    /// A member the sweep marked silent sent a control message: everyone, itself included (it may
    /// have missed its own `reconnecting`, or not), sees it `connected` again at once.
    func markHeard(_ channel: ChannelState, slot: UInt16, at time: HubTime) {
        guard channel.members[slot]?.link != nil else { return }
        channel.members[slot]?.connection = .connected
        channel.members[slot]?.silentSince = nil
        announce(channel, slot: slot, at: time.instant)
        replayOwed(channel, slot: slot, at: time)
    }
}
