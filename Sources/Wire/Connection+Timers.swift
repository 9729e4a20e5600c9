// Time: the values the timers derive from the path and the peer, the next deadline, and what runs
// when one is due.
extension Connection {
    var peerMaxAckDelay: UInt64 { ms(peerParameters?.maxAckDelay ?? 25) }
    var currentPTO: UInt64 { rtt.probeTimeout(maxAckDelay: state == .established ? peerMaxAckDelay : 0) }

    /// Time before a handshake flight is sent again: the PTO, doubled on each repeat but capped at
    /// one second. A person is waiting to talk, and a lossy network needs more tries inside the
    /// handshake timeout than an uncapped backoff allows (30 % loss costs a third of the flights).
    var handshakeRetransmitInterval: UInt64 {
        min(rtt.probeTimeout(maxAckDelay: 0) << UInt64(min(handshakePTOCount, 8)), max(seconds(1), rtt.probeTimeout(maxAckDelay: 0)))
    }

    var idleTimeout: UInt64 {
        let peer = ms(peerParameters?.maxIdleTimeout ?? 0)
        let local = config.idleTimeout
        let chosen = peer == 0 ? local : local == 0 ? peer : min(peer, local)
        return chosen == 0 ? 0 : max(chosen, 3 * currentPTO)
    }

    /// When the peer counts as gone if it stays silent (`livenessTimeout`); only once established, so a
    /// handshake is judged by the handshake timeout alone.
    var livenessDeadline: WireInstant? {
        guard state == .established, keepAlive, config.livenessTimeout > 0, let since = unansweredSince else { return nil }
        return since + max(config.livenessTimeout, 3 * currentPTO)
    }

    /// When the connection counts as stalled (`stallTimeout`): never before two PTOs, so that a slow
    /// path is not taken for a dead one.
    var stallDeadline: WireInstant? {
        guard !stalled, state == .established, keepAlive, config.stallTimeout > 0, let since = unansweredSince else { return nil }
        return since + max(config.stallTimeout, 2 * currentPTO)
    }

    /// While something is unanswered, a PING every half second (or PTO, if longer), so that neither
    /// verdict rests on the one or two packets the window would otherwise hold: PINGs are never
    /// retransmitted, and at 5 % loss each way two lost round trips in a row would close an idle,
    /// healthy session about twice an hour. The 3 s stall needs six lost in a row.
    var livenessProbeDeadline: WireInstant? {
        guard livenessDeadline != nil || stallDeadline != nil, let since = unansweredSince else { return nil }
        return (lastLivenessProbe ?? since) + max(ms(500), currentPTO)
    }

    func resetIdleTimer(now: WireInstant) {
        idleDeadline = idleTimeout == 0 ? nil : now + idleTimeout
    }

    /// The next keepalive is due `keepAliveInterval` after this side last sent something that needs
    /// an answer, however much it hears meanwhile: a listener hears audio all through a burst and
    /// answers none of it, yet the server must still hear from it (its liveness, the NAT binding,
    /// a rebound address) and it must still learn whether the server hears it.
    func armKeepAlive(now: WireInstant) {
        keepAliveDeadline = config.keepAliveInterval == 0 ? nil : now + config.keepAliveInterval
    }

    /// How many bytes may go to the current path before its address is validated (RFC 9000 §8).
    var amplificationBudget: Int {
        guard role == .server, !path.validated else { return .max }
        return max(0, 3 * path.bytesReceived - path.bytesSent)
    }

    /// The earliest time `handleTimeout` has work to do.
    public var nextDeadline: WireInstant? {
        var earliest: WireInstant?
        func consider(_ t: WireInstant?) { if let t, earliest.map({ t < $0 }) ?? true { earliest = t } }
        switch state {
        case .closed: return nil
        case .closing, .draining: return closeDeadline
        default: break
        }
        consider(idleDeadline)
        consider(livenessDeadline)
        consider(stallDeadline)
        consider(livenessProbeDeadline)
        consider(handshakeDeadline)
        consider(handshakeRetransmitAt)
        consider(ackDeadline)
        consider(lossTime)
        if retransmittableInFlight > 0, let last = lastRetransmittableSent { consider(last + (currentPTO << UInt64(min(ptoCount, 16)))) }
        if keepAlive, state == .established { consider(keepAliveDeadline) }
        consider(path.challengeResendAt)
        consider(path.challengeAbandonAt)
        consider(previousReadKeyDiscardAt)
        return earliest
    }

    /// Runs every timer that is due at `now`.
    public func handleTimeout(now: WireInstant) {
        lastPollTime = now
        switch state {
        case .closed: return
        case .closing, .draining:
            if let deadline = closeDeadline, deadline <= now { state = .closed }
            return
        default: break
        }
        if let deadline = idleDeadline, deadline <= now {
            state = .closed
            finish(.idleTimeout)
            return
        }
        if let deadline = livenessDeadline, deadline <= now {
            state = .closed
            finish(.peerUnresponsive)
            return
        }
        if let at = stallDeadline, at <= now {
            stalled = true
            emit(.stalled)
        }
        if let at = livenessProbeDeadline, at <= now {
            pendingPing = true
            lastLivenessProbe = now
        }
        if let deadline = handshakeDeadline, deadline <= now, state == .handshaking {
            state = .closed
            finish(.handshakeTimeout)
            return
        }
        if let at = handshakeRetransmitAt, at <= now { retransmitHandshake(now: now) }
        if let at = ackDeadline, at <= now {
            // The next poll sends the ACK; the deadline is spent, so it must not fire again.
            ackDeadline = nil
            ackNow = true
        }
        if let at = lossTime, at <= now { detectLosses(now: now) }
        if retransmittableInFlight > 0, let last = lastRetransmittableSent,
           last + (currentPTO << UInt64(min(ptoCount, 16))) <= now {
            probeTimeout(now: now)
        }
        if keepAlive, state == .established, let at = keepAliveDeadline, at <= now {
            pendingPing = true
            keepAliveDeadline = now + config.keepAliveInterval
        }
        if let at = path.challengeAbandonAt, at <= now {
            abandonPathValidation()
        } else if let at = path.challengeResendAt, at <= now {
            path.challengePending = true
            path.challengeResendAt = now + 2 * currentPTO
        }
        if let at = previousReadKeyDiscardAt, at <= now {
            appOpenPrevious = nil
            previousReadKeyDiscardAt = nil
        }
    }

    func retransmitHandshake(now: WireInstant) {
        handshakePTOCount += 1
        handshakeRetransmitAt = nil
        switch (role, state) {
        case (.client, .handshaking):
            guard pendingCertificateCheck == nil else { return }
            // Resend the ClientHello until the server's whole flight is in, even after the
            // ServerHello: a repeated ClientHello makes the server resend its flight at once, and
            // its 1,200 bytes raise the server's 3× budget, which a large certificate chain may
            // have used up.
            initialSpace.flightSent = 0
        case (.client, .established):
            guard !handshakeConfirmed else { return }
            handshakeSpace.flightSent = 0
        case (.server, .handshaking):
            initialSpace.flightSent = 0
            handshakeSpace.flightSent = 0
        default:
            return
        }
        count(.probeTimeout)
        handshakeRetransmitAt = now + handshakeRetransmitInterval
    }

    func abandonPathValidation() {
        let failed = path.address
        path.endChallenge()
        if role == .server, let previous = previousPath, previous.validated {
            path = previous
            previousPath = nil
        }
        emit(.pathValidationFailed(failed))
    }
}
