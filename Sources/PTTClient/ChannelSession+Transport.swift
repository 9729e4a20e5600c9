import ChannelProtocol

/// The voice connection: connecting, losing it, stalls, and trying again with backoff.
extension ChannelSession {
    /// `entered`: the home took the redirect's entry pass, and answers the join it carried: nothing to send.
    mutating func transportConnected(entered: Bool = false) {
        serverAway = false
        guard link == .connecting, let channel, let credentials else { return }
        link = .joining
        if entered { return }
        outputs.append(.send(.join(token: credentials.token, channel: channel,
                                   reason: joinReport == .due(.channelRestoration) ? .channelRestoration : .developerRequest)))
    }

    /// The handshake failed or the connection ended for good.
    mutating func transportFailed(_ message: String, serverWentAway: Bool = false) {
        // A server that said it was going away: later failures (no answer while it restarts) say so
        // too, or its own notice would be replaced at once by "no answer … check that it runs".
        if serverWentAway { serverAway = true }
        let message = serverAway && !serverWentAway ? "squelchd went away (shutting down) and is not back yet: \(message)" : message
        guard let channel, link != .suspended, link != .down else { return }
        if route.home != nil, link == .connecting {
            // A cluster's home that does not answer (it may have died since the redirect named it):
            // the entry point decides again, within the redirect limit.
            route.homeLost()
            link = .down
            outputs.append(.event(.homeNode(nil)))
            connect()
            return
        }
        if joinReport == .due(.developerRequest) {
            // The first join never got through: it failed, and the channel is not active.
            failHeldPress("the channel could not be joined: \(message)")
            emit(.failedToJoin(channel, ChannelError(.unknown, message)))
            updateStatus(.unavailable)
            outputs.append(.flushPlayback)  // taking audio since the connection opened
            reset()
            outputs.append(.forgetRestoration)
            return
        }
        // A channel the user is in (joined before, or restored after a restart, perhaps before the
        // network is up) is not given up: it waits and tries again, backing off to 30 s, through the
        // entry point (a cluster's home may be gone).
        route.homeLost()
        lostConnection()
        link = .down
        updateStatus(.unavailable)
        outputs.append(.event(.notice(message)))
        scheduleReconnect()
    }

    mutating func scheduleReconnect() {
        let delay = Backoff.milliseconds(first: 500, failuresBefore: reconnectAttempts, ceiling: 30_000)
        reconnectAttempts += 1
        outputs.append(.scheduleReconnect(milliseconds: delay))
    }

    /// The backoff after a failed connection is over.
    mutating func reconnectDue() {
        guard channel != nil, link == .down else { return }
        connect()
    }

    /// The server stopped answering (nothing came back for the transport's stall timeout, 3 s), or
    /// answers again. The connection is kept: the liveness verdict comes later, and a server that was
    /// only slow carries on with no new join. Meanwhile the channel shows `connecting`, a floor
    /// request still waiting for its answer fails (MCPTT's T101 × C101: a user holding the button
    /// learns in seconds that nobody hears), and a new one is refused until the server is back. A
    /// burst already granted goes on: its audio reaches the server if the path was only slow.
    mutating func transportStalled(_ value: Bool) {
        guard let channel, link == .joined || link == .joining else {
            stalled = false
            return
        }
        guard value != stalled else { return }
        if value, leaveSilentHome() { return }
        stalled = value
        if value, link == .joining, case .requesting = transmit {
            // A wake to talk whose join got no answer: the request was never sent, so there is
            // nothing to withdraw, only the user to tell.
            transmit = .idle
            emit(.failedToBegin(channel, ChannelError(.transmissionNotAllowed, "squelchd did not answer the join; the connection may be down")))
        }
        guard link == .joined else { return }
        if value {
            if case .requesting = transmit {
                // Withdrawn, in case the answer was only late: a grant that arrives after this is
                // released by the server rather than held by a user who has already given up.
                withdrawRequest(ChannelError(.transmissionNotAllowed, "squelchd did not answer the floor request; the connection may be down"))
            }
            updateStatus(.connecting)
            outputs.append(.event(.notice("squelchd stopped answering; waiting for it, and until it is back nobody hears this channel")))
        } else {
            updateStatus(serverStatus)
        }
    }

    /// The transport lost the connection and is handshaking again by itself.
    mutating func transportReconnecting() {
        guard channel != nil, link == .joined || link == .joining else { return }
        // In a cluster the transport's own retry would go back to a home that may be gone.
        if leaveSilentHome() { return }
        lostConnection()
        link = .connecting
        updateStatus(.connecting)
    }

    mutating func connect() {
        // With an expired token every join would be refused; a push or a transmit request waits for
        // the app's new token (`renewToken`).
        guard let credentials, !token.isExpired else { return }
        link = .connecting
        updateStatus(.connecting)
        outputs.append(.connect(route.credentials(for: credentials), cluster: route.inCluster, pass: route.takePass()))
    }

    /// What the session knew of the connection it had: a new one starts with none of it.
    mutating func forgetConnectionState() {
        stalled = false
        serverStatus = .ready
        floorRequests.connectionEnded()
    }

    /// The connection is gone for now: what depended on it ends.
    mutating func lostConnection() {
        let sent = link == .joined
        forgetConnectionState()
        if case .active = transmit { endTransmission(source: .unknown, release: false) }
        // A press made while not connected was never sent: it stays held for the next join, or until
        // its wait ends it (`transmitWaitDue`). One sent on this connection dies with it.
        if transmit != .idle, sent {
            // A request in flight dies with the connection; the app hears why.
            if let channel { emit(.failedToBegin(channel, ChannelError(.transmissionNotAllowed, "the connection dropped before the floor was granted"))) }
            transmit = .idle
        }
        for slot in Array(talkers.live.keys) { remoteTalkEnded(slot: slot) }
    }
}
