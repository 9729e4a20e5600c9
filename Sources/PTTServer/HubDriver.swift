import ChannelHub
import ChannelProtocol
import ChannelStore
import Foundation
import Logging
import NIOCore
import ParticipantClaims
import ParticipantTokens
import Wire
import WireNIO

/// Connects the sans-I/O `ChannelHub` to a `WireServer`: transport events and audio in, control
/// messages, closes and audio out, store writes to the `StoreWriter`, token checks on a task. All of
/// it runs on the server's event loop, so the relay forwards a packet in the same read cycle that
/// received it and its sends leave in the same `sendmmsg`.
final class HubDriver: WireServerDelegate {
    let hub: ChannelHub
    let eventLoop: any EventLoop
    let tokens: TokenAuthority
    let writer: StoreWriter
    let logger: Logger
    let metrics: ServerMetrics?
    let codec = MessageCodec()
    /// Sends the wake and leave pushes; nil: pushes are off.
    var pushes: PushDispatcher?
    /// This node's part in a cluster (where each channel's home is); nil: a single node.
    var cluster: ClusterNode?
    /// The entry passes this cluster node issues with its redirects (the transport's, shared).
    var entryPasses: EntryPasses?
    /// Connections that entered with a pass and have not sent their Finished yet (`entered`).
    var enteredEarly: Set<Link> = []
    weak var server: WireServer?
    var timer = LoopTimer()
    var published = HubCounters()
    var publishedEndpoint = EndpointStats()
    var publishedTroubles = ConnectionTroubleTotals()
    /// Control messages waiting for room in their connection's stream (a peer that acknowledges
    /// slowly; rosters wait in the hub instead, `pumpRosters`).
    var backlog = ControlBacklog()
    var retryTask: Scheduled<Void>?
    /// How often the backlog and the rosters under way are offered the room acknowledgements made.
    static let retryInterval = TimeAmount.milliseconds(5)

    init(hub: ChannelHub, eventLoop: any EventLoop, tokens: TokenAuthority, writer: StoreWriter, metrics: ServerMetrics?,
         logger: Logger) {
        self.metrics = metrics
        self.hub = hub
        self.eventLoop = eventLoop
        self.tokens = tokens
        self.writer = writer
        self.logger = logger
    }

    static let closeDelay = TimeAmount.milliseconds(300)

    static func now() -> HubTime { HubTime(instant: WireNIO.now(), date: Date()) }

    // MARK: WireServerDelegate

    func wireServer(_ server: WireServer, handle: Endpoint.Handle, event: ConnectionEvent) {
        self.server = server
        switch event {
        case .connected:
            if enteredEarly.remove(handle) == nil { hub.connected(handle) } else { hub.handshakeDone(handle, at: Self.now()) }
        case .entered(let join): entered(handle, carrying: join)
        case .control(let bytes): hub.control(handle, bytes: bytes, at: Self.now())
        case .closed(let error):
            logger.debug("connection closed", metadata: ["link": "\(handle)", "why": "\(error)"])
            backlog.remove(handle)
            rosterWaits[handle] = nil
            enteredEarly.remove(handle)
            var deliberately = false
            if case .peer(let code, _, true) = error { deliberately = code == CloseCode.normal.rawValue }
            hub.closed(handle, deliberately: deliberately, at: Self.now())
        default: return
        }
        flush()
    }

    func wireServer(_ server: WireServer, handle: Endpoint.Handle, datagram payload: UnsafeRawBufferPointer) {
        let start = WireNIO.now()
        // Each listener's copy is the talker's sealed frame in an envelope (nothing sealed per
        // listener); they leave at once, and the fan-out time runs to that sendmmsg.
        let (forwarded, handedOver) = server.withRelaySender(talker: handle, started: start) { send in
            hub.receiveAudio(from: handle, datagram: payload, at: start, send: send)
        }
        // A fan-out worker records its own, once the copies are out.
        if let metrics, forwarded > 0, !handedOver {
            metrics.relayFanout.recordNanoseconds(Int64(WireNIO.now().since(start)))
        }
        hub.wakeOwedListeners(at: start)  // after the copies left: a burst's first audio owes wakes
        if hub.hasOutputs { flush() }  // the burst's first audio: its wake pushes
    }

    func wireServer(_ server: WireServer, didRebindAfter error: (any Error)?) {
        logger.warning("UDP socket closed under the server and was bound again", metadata: ["error": "\(String(describing: error))"])
    }

    // MARK: Outputs

    /// Carries out what the hub asked for, then re-arms the hub's timer. Event loop only.
    func flush() {
        let drained = backlog.isEmpty ? false : drainBacklog()
        carryOut(hub.takeOutputs())
        // After the outputs, so that the room left counts what they sent (`joined` first of all).
        let pumped = pumpRosters()
        carryOut(hub.takeOutputs())
        if !backlog.isEmpty || hub.isSendingRosters { scheduleRetry(soon: drained || pumped) }
        armTimer()
    }

    private func carryOut(_ outputs: [HubOutput]) {
        for output in outputs {
            switch output {
            case .send(let message, let links):
                guard let server, !links.isEmpty else { continue }
                // A member has joined: its connection no longer counts against the transport's
                // budget for connections that have not (`EndpointConfiguration.maxUnadmitted…`).
                if case .joined = message { for link in links { server.endpoint.admit(link) } }
                let bytes = codec.encode(message)
                for link in links { sendControl(bytes, to: link, on: server) }
                // A key also goes twice as a datagram: a burst's first frames would otherwise wait
                // for the control stream to resend a lost packet (a probe timeout: hundreds of
                // milliseconds on a jittery link), where an independent copy usually gets through.
                if case .mediaKey(let key) = message {
                    let datagram = key.datagram
                    datagram.withUnsafeBytes { bytes in
                        for link in links { for _ in 0..<2 { _ = server.sendDatagram(bytes, to: link) } }
                    }
                }
            case .close(let link, let code, let reason):
                // What still waited for the session is moot now; the newest
                // message, the `refused` the hub sent just before the close, is what the client needs.
                backlog.keepNewest(link)
                // A connection that never joined (a refused or missing join) gets its `refused` sent,
                // not waited for: waiting up to 10 s for an ACK it may hold back on purpose would keep
                // its place from a member that means to join.
                // Nor one that entered with a pass and has not finished its handshake: closed now,
                // the close would go in the Handshake space, ahead of the answer it can't read yet.
                let admitted = server?.endpoint.isAdmitted(link) ?? false
                let waits = admitted || enteredEarly.contains(link)
                closeOnceSaid(link, code: code, reason: reason, giveUpAt: .now() + (waits ? Self.closeWaitLimit : .zero))
            case .verify(let link, let token, let channel, let reason):
                verifyJoin(link, token: token, channel: channel, reason: reason)
            case .verifyRenewal(let link, let token, let channel):
                verify(link, token: token, channel: channel) { hub, outcome in
                    switch outcome {
                    case .success(let checked): hub.renew(link, claims: checked.claims, at: HubDriver.now())
                    case .failure(let refusal): hub.renewalRefused(link, code: refusal.code, reason: refusal.reason)
                    }
                }
            case .store(let operation):
                writer.enqueue(operation)
            case .burstStarted(let channel, let talker, let wake, let connected):
                guard let pushes else { continue }
                let silent = connected.filter { !isLive($0.link) }.map(\.member)
                pushes.wake(channel: channel, speaker: talker.name, members: wake + silent)
            case .memberGone(let channel, let member):
                pushes?.leave(channel: channel, member: member)
            }
        }
    }

    /// Since when each joiner's roster has waited for room without a chunk going out.
    var rosterWaits: [Link: NIODeadline] = [:]

    /// Asks the hub for the next roster chunks of the joiners whose control stream has room for a
    /// whole control message: nothing of a roster is made before it can be sent, so a joiner's
    /// roster costs no memory while it waits behind a slow link. A roster that gets no room for
    /// `backlog.maxStall` belongs to a peer that stopped acknowledging, which is closed as the
    /// backlog's would be. True when a chunk was made.
    func pumpRosters() -> Bool {
        let links = hub.linksAwaitingRoster
        if links.isEmpty {
            if !rosterWaits.isEmpty { rosterWaits.removeAll() }
            return false
        }
        guard let server else { return false }
        let message = Connection.framedControlSize(ControlLimits.maxMessageBytes)
        let now = NIODeadline.now()
        var made = false
        for link in links where !backlog.holds(link) {
            // A connection that is gone has its close event on the way, which ends its stream.
            guard let connection = server.endpoint.connection(link) else { continue }
            var room = connection.controlSendSpace
            var chunks = 0
            while room >= message, hub.continueRoster(link) {
                room -= message
                chunks += 1
            }
            if chunks > 0 || !hub.isSendingRoster(to: link) {
                // A chunk went, or the roster is done (or its session over).
                rosterWaits[link] = nil
                made = made || chunks > 0
            } else if let since = rosterWaits[link] {
                if now - since >= .nanoseconds(Int64(backlog.maxStall)) {
                    rosterWaits[link] = nil
                    giveUp(link, on: server, why: "its roster waited \(backlog.maxStall / 1_000_000_000) s for room in its control stream")
                }
            } else {
                rosterWaits[link] = now
            }
        }
        if rosterWaits.count > links.count { rosterWaits = rosterWaits.filter { links.contains($0.key) } }
        return made
    }

    /// Longest a close waits for its explanation to be acknowledged.
    static let closeWaitLimit = TimeAmount.seconds(10)

    /// A CONNECTION_CLOSE abandons the control stream, so the message that explains the close
    /// (`refused`, …) would be lost if it were still queued, or sent and not yet acknowledged. The
    /// close waits `closeDelay` (the client usually closes first, having read why), then for as long
    /// as that message is still waiting or unacknowledged, up to `giveUpAt`.
    func closeOnceSaid(_ link: Link, code: CloseCode, reason: String, giveUpAt: NIODeadline, after delay: TimeAmount = closeDelay) {
        eventLoop.assumeIsolated().scheduleTask(in: delay) { [self] in
            guard let server, let connection = server.endpoint.connection(link) else { return }
            let unsaid = backlog.holds(link) || connection.controlSendSpace < connection.controlSendLimit
            if unsaid && NIODeadline.now() < giveUpAt {
                closeOnceSaid(link, code: code, reason: reason, giveUpAt: giveUpAt, after: .milliseconds(50))
                return
            }
            server.close(link, code: code.rawValue, reason: reason)
        }
    }

    /// Sends now if the link's control stream has room and nothing waits ahead of this message;
    /// otherwise queues it behind what waits.
    func sendControl(_ bytes: [UInt8], to link: Link, on server: WireServer) {
        if !backlog.holds(link) {
            // A connection that is gone has nothing to queue for.
            guard let connection = server.endpoint.connection(link) else { return }
            if Connection.framedControlSize(bytes.count) <= connection.controlSendSpace {
                send(bytes, to: link, on: server)
                return
            }
        }
        guard backlog.append(bytes, for: link, now: WireNIO.now()) else {
            giveUp(link, on: server, why: "more than \(backlog.maxBytes) bytes of control messages waited for it")
            return
        }
        scheduleRetry()
    }

    private func send(_ bytes: [UInt8], to link: Link, on server: WireServer) {
        do { try server.sendControl(bytes, to: link) } catch {
            logger.debug("control message not sent", metadata: ["link": "\(link)", "error": "\(error)"])
        }
    }

    /// Sends what the links' streams have room for now; closes the links that stopped acknowledging.
    /// True when a message went out.
    @discardableResult
    func drainBacklog() -> Bool {
        guard let server else { return false }
        var moved = false
        let stalled = backlog.drain(now: WireNIO.now(), space: { server.endpoint.connection($0)?.controlSendSpace }) { link, bytes in
            send(bytes, to: link, on: server)
            moved = true
        }
        for link in stalled {
            giveUp(link, on: server, why: "its control messages waited \(backlog.maxStall / 1_000_000_000) s without an acknowledgement")
        }
        return moved
    }

    /// The peer can no longer be told what happens in its channel: closed, so that it reconnects and
    /// joins afresh (`goingAway`: reconnect with backoff and rejoin) rather than go on with a roster
    /// and floor state that are wrong.
    private func giveUp(_ link: Link, on server: WireServer, why: String) {
        logger.warning("closing a connection that is not taking its control messages",
                       metadata: ["link": "\(link)", "why": .string(why)])
        server.close(link, code: CloseCode.goingAway.rawValue, reason: "control messages not acknowledged; reconnect and join again")
    }

    /// Comes back to offer the backlog and the rosters being sent the room that acknowledgements
    /// made meanwhile: in `retryInterval` while they move, ten times later while nothing could (a
    /// slow or silent peer), so a stuck link doesn't wake the loop 200 times a second.
    private func scheduleRetry(soon: Bool = true) {
        guard retryTask == nil, !stopped else { return }
        retryTask = eventLoop.assumeIsolated().scheduleTask(in: soon ? Self.retryInterval : Self.retryInterval * 10) { [self] in
            retryTask = nil
            flush()
        }
    }

    /// A connection silent this long (ns) is asleep or gone as far as audio goes, even while its session
    /// is kept for a fast resume (`pushWakeSilenceSeconds`).
    var livenessWindow: UInt64 = 12_000_000_000

    func isLive(_ link: Link) -> Bool {
        guard let connection = server?.endpoint.connection(link) else { return false }
        return WireNIO.now().since(connection.lastReceiveTime) < livenessWindow
    }

    /// The once-a-second roster check (`ChannelHub.sweepLiveness`), with the same window as the wakes:
    /// a member the wakes treat as asleep or gone is not shown as connected.
    func sweepLiveness() {
        guard server != nil, !stopped else { return }
        let now = NIODeadline.now()
        // A sweep much later than a second after the last means this process stalled (a blocked
        // loop, a stopped process, a VM pause): the sockets may hold everyone's packets unread, or
        // have dropped them when full. Nobody is called silent for the next 15 s, three keepalive
        // intervals (and the whole interval of clients older than 2026-11-24), in which every live
        // client has sent something new.
        if let lastSweep, now - lastSweep > .seconds(3) { quietUntil = now + .seconds(15) }
        lastSweep = now
        let time = HubDriver.now()
        hub.sweepLiveness(mayMarkSilent: quietUntil.map { now >= $0 } ?? true, at: time, isHeard: isLive)
        hub.logBurstProgress(at: time)
        flush()
    }

    /// Runs `sweepLiveness` every second on the loop, on a timer of its own: the service's chores
    /// (database polls, pruning) may take seconds, which must not look like a stall.
    func startSweeping() {
        guard !stopped, sweepTask == nil else { return }
        sweepTask = eventLoop.assumeIsolated().scheduleTask(in: .seconds(1)) { [self] in
            sweepTask = nil
            sweepLiveness()
            startSweeping()
        }
    }

    var sweepTask: Scheduled<Void>?
    /// When `sweepLiveness` last ran, and until when it marks nobody silent (after a stall).
    var lastSweep: NIODeadline?
    var quietUntil: NIODeadline?

    /// Set once the voice service has stopped: no more timers, so a stopped hub holds no event-loop work.
    var stopped = false

    func armTimer() {
        guard !stopped else {
            timer.cancel()
            retryTask?.cancel()
            retryTask = nil
            sweepTask?.cancel()
            sweepTask = nil
            return
        }
        timer.arm(hub.nextDeadline, on: eventLoop) { [self] in
            timer.fired()
            // Always let the hub pass its deadlines, even once the transport is gone: a deadline left in
            // the past would re-arm at once and spin the event loop (other servers' connections share it).
            let server = self.server
            if let server {
                server.withDatagramSender(enveloped: true) { send in hub.handleTimeout(at: Self.now(), send: send) }
            } else {
                hub.handleTimeout(at: Self.now()) { _, _ in false }
            }
            flush()
        }
    }

    /// Checks a join or renewal token off the event loop (ECDSA verification takes ~100 µs, the
    /// revocation lookup a SQLite read), then hands the outcome to the hub back on the loop.
    func verify(_ link: Link, token: String, channel: UUID,
                then apply: @escaping @Sendable (ChannelHub, Result<Checked, Refusal>) -> Void) {
        let tokens = self.tokens
        let store = writer.store
        let logger = self.logger
        let this = NIOLoopBound(self, eventLoop: eventLoop)
        let loop = eventLoop
        Task {
            let outcome = await HubDriver.check(token, channel: channel, with: tokens, store: store, logger: logger)
            loop.execute {
                let driver = this.value
                apply(driver.hub, outcome)
                driver.flush()
            }
        }
    }

    struct Refusal: Error {
        var code: RefusalCode
        var reason: String
    }

    /// A token that checked out, and its channel as the store has it now.
    struct Checked: Sendable {
        var claims: ParticipantClaims
        var channel: ChannelRecord
    }

    /// A token is good if this server signed it, for this channel, now, no revocation voids it, and
    /// the channel is still stored.
    /// A store that can't answer refuses the join (fail closed: a removed member must not get in
    /// while the database is down), with a reason that says to try again.
    static func check(_ token: String, channel: UUID, with tokens: TokenAuthority, store: any ChannelStore,
                      logger: Logger) async -> Result<Checked, Refusal> {
        let claims: ParticipantClaims
        do throws(TokenError) {
            claims = try await tokens.verify(token, channel: channel, now: Date())
        } catch {
            return .failure(Refusal(code: RefusalCode(rawValue: error.code) ?? .tokenMalformed, reason: error.description))
        }
        do {
            if let revocation = try await store.revocation(channel: channel, user: claims.userID, tokenID: claims.tokenID,
                                                           issuedAt: claims.issuedAt) {
                let error = TokenError.revoked(at: revocation.revokedAt, reason: revocation.reason)
                return .failure(Refusal(code: .tokenRevoked, reason: error.description))
            }
            // The hub learns of a channel deleted by another process (the CLI) at its next revision
            // poll, up to a second later; a join in between would be admitted to a channel whose
            // rows are gone, and every write for it would fail.
            guard let record = try await store.channel(channel) else {
                return .failure(Refusal(code: .channelNotFound, reason: "channel \(channel) does not exist (deleted?); ask for a token to an existing channel"))
            }
            return .success(Checked(claims: claims, channel: record))
        } catch {
            logger.error("token refused: the store could not be read (revocations, channel)", metadata: ["error": "\(error)"])
            return .failure(Refusal(code: .internalError, reason: "the server could not check the token (its database is failing); try again shortly"))
        }
    }

    // MARK: Periodic work (on the event loop)

    /// Transport connections open now, as the endpoint counts them: the hub forgets a session as soon
    /// as it has left, been replaced or removed, while its connection may take seconds more to close
    /// (`closeOnceSaid`), and it never sees a connection that is still in its handshake.
    var openConnections: Int { server?.endpoint.connectionCount ?? hub.connectionCount }

    /// Publishes the relay's counters to the metrics registry.
    func publish(to metrics: ServerMetrics) {
        let now = hub.counters
        metrics.publish(from: published, to: now, connections: openConnections, channels: hub.channelCount)
        published = now
        if let endpoint = server?.endpoint {
            metrics.publish(from: publishedEndpoint, to: endpoint.stats, troubles: publishedTroubles, endpoint.troubleTotals)
            publishedEndpoint = endpoint.stats
            publishedTroubles = endpoint.troubleTotals
        }
    }
}
