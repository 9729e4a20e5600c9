import ChannelHub
import Prometheus
import Wire

/// squelchd's Prometheus metrics (`/metrics`). The relay counts on its event loop in plain integers
/// (`HubCounters`) and `publish` adds what changed once a second: an atomic increment per forwarded
/// packet would cost more than the packet's own bookkeeping.
public final class ServerMetrics: Sendable {
    public let registry: PrometheusCollectorRegistry
    let connections: Gauge
    let channels: Gauge
    let bursts: Counter
    let floorGrants: Counter
    let floorDenials: Counter
    let floorRevocations: Counter
    let joins: Counter
    let refusals: Counter
    let controlErrors: Counter
    let controlRateLimited: Counter
    let tokenExpiries: Counter
    let tokenRenewals: Counter
    let tokenRenewalsRefused: Counter
    let receptionReports: Counter
    let silentMembers: Counter
    let missedBurstReplays: Counter
    let rosterUpdatesHeld: Counter
    let floorRequestsLimited: Counter
    let wakesLimited: Counter
    let packetsIn: Counter
    let packetsOut: Counter
    let catchUpPacketsOut: Counter
    let bytesIn: Counter
    let bytesOut: Counter
    let catchUpBytesOut: Counter
    let drops: [Counter]
    let handshakes: [HandshakeOutcome: Counter]
    let retriesSent: Counter
    let statelessResetsSent: Counter
    let versionNegotiationsSent: Counter
    let unroutable: Counter
    let evicted: Counter
    let tokensRefused: Counter
    let transportTroubles: [Counter]
    let storeFailures: Counter
    let storeRetries: Counter
    let fencedWrites: Counter
    let storeFolded: Counter
    let storeCommits: Counter
    let transmissionsPruned: Counter
    let membersForgotten: Counter
    let storeRefused: Counter
    let storeWaiting: Gauge
    let storeFailing: Gauge
    /// Per forwarded talker packet: from its arrival at the relay to the last listener's copy sealed
    /// and queued (the socket flush that follows, one `sendmmsg` per read cycle, is not in it).
    let relayFanout: DurationHistogram
    /// How long each tick of the relay's event loop ran (`RelayLoopTicks`).
    let loopTicks: DurationHistogram
    let loopStalls: Counter

    public init(registry: PrometheusCollectorRegistry = PrometheusCollectorRegistry()) {
        self.registry = registry
        func counter(_ name: String, _ help: String, labels: [(String, String)] = []) -> Counter {
            registry.makeCounter(descriptor: MetricNameDescriptor(namespace: "squelch", metricName: name, unitName: "total", helpText: help),
                                 labels: labels)
        }
        func gauge(_ name: String, _ help: String) -> Gauge {
            registry.makeGauge(descriptor: MetricNameDescriptor(namespace: "squelch", metricName: name, unitName: "", helpText: help))
        }
        connections = gauge("connections", "Transport connections open now.")
        channels = gauge("channels", "Channels known to the server.")
        bursts = counter("bursts", "Talk bursts started.")
        floorGrants = counter("floor_grants", "Floor requests granted.")
        floorDenials = counter("floor_denials", "Floor requests denied (busy, listen-only, queue full, over the control-message rate).")
        floorRevocations = counter("floor_revocations", "Talk bursts revoked (pre-emption, maximum length, disconnect).")
        joins = counter("joins", "Members admitted to a channel.")
        refusals = counter("join_refusals", "Joins refused (bad token, unknown channel).")
        controlErrors = counter("control_errors", "Control messages that could not be read.")
        controlRateLimited = counter("control_rate_limited", "Control messages dropped because their connection sent them too fast.")
        tokenExpiries = counter("token_expiries", "Sessions ended because the member's participant token expired while it was connected.")
        tokenRenewals = counter("token_renewals", "Participant-token renewals (renewToken), by outcome: renewed, or refused.", labels: [("outcome", "renewed")])
        tokenRenewalsRefused = counter("token_renewals", "Participant-token renewals (renewToken), by outcome: renewed, or refused.", labels: [("outcome", "refused")])
        receptionReports = counter("reception_reports", "Listeners' loss reports (receptionReport) that changed their figure; talkers are told the worst.")
        missedBurstReplays = counter("missed_burst_replays", "Bursts that had already ended replayed to a member who missed them (woken by a push, or back after a drop) on joining.")
        rosterUpdatesHeld = counter("roster_updates_held", "Roster entries held back because the member's last went out less than 500 ms before (rosterUpdateInterval); each goes later, merged with what follows.")
        floorRequestsLimited = counter("floor_requests_limited", "Floor requests denied because the member had used its share of grants (floorGrantsPerMinute).")
        wakesLimited = counter("wakes_limited", "Wake pushes not sent because the sleeping member had been woken its share of times (3 in a row, then 10 a minute).")
        silentMembers = counter("members_silent", "Connected members shown as reconnecting because their connection went silent (pushWakeSilenceSeconds) before it closed.")
        packetsIn = counter("packets_in", "Audio datagrams received.")
        packetsOut = counter("packets_out", "Audio datagrams forwarded live to listeners.")
        catchUpPacketsOut = counter("catchup_packets_out", "Audio datagrams replayed to late joiners.")
        bytesIn = counter("bytes_in", "Audio datagram bytes received (header and payload).")
        bytesOut = counter("bytes_out", "Audio datagram bytes forwarded live to listeners (header and payload).")
        catchUpBytesOut = counter("catchup_bytes_out", "Audio datagram bytes replayed to late joiners (header and payload).")
        drops = DropReason.allCases.map { counter("drops", "Audio datagrams dropped, by reason.", labels: [("reason", $0.label)]) }
        handshakes = Dictionary(uniqueKeysWithValues: HandshakeOutcome.allCases.map {
            ($0, counter("handshakes", "Transport handshakes by outcome: completed; failed (closed before the client's Finished: timed out, bad message, certificate or parameters refused); refused (server at its connection limit, stale Retry token); address_limit (refused: maxConnectionsPerAddress open from that IP already); rate_limited (over handshakesPerSecondPerAddress from one IP, dropped).",
                         labels: [("outcome", $0.rawValue)]))
        })
        evicted = counter("transport_evicted", "Connections that had not joined, closed to make room for new ones (maxUnadmitted budgets): many means someone handshakes and never joins.")
        tokensRefused = counter("transport_tokens_refused", "Address tokens presented again after they had opened a connection, counted as no token.")
        retriesSent = counter("transport_retries", "Retry packets sent: handshakes asked to prove their address first, because many were in progress.")
        statelessResetsSent = counter("transport_stateless_resets", "Stateless resets sent to packets for connections the server does not know (it restarted, or the connection closed).")
        versionNegotiationsSent = counter("transport_version_negotiations", "Version Negotiation packets sent to clients of another protocol version.")
        unroutable = counter("transport_datagrams_dropped", "Transport datagrams dropped, by reason: unroutable (no connection and cannot start one: too short, unparsable, bad Retry token); and for a connection, undecryptable (failed authentication: forged, tampered or damaged), replayed, malformed, no_keys (before its keys or after they were discarded).",
                             labels: [("reason", "unroutable")])
        transportTroubles = ConnectionTrouble.allCases.map { trouble in
            switch trouble {
            case .undecryptable, .replayed, .malformed, .noKeys:
                let label = trouble == .noKeys ? "no_keys" : "\(trouble)"
                return counter("transport_datagrams_dropped", "Transport datagrams dropped, by reason: unroutable (no connection and cannot start one: too short, unparsable, bad Retry token); and for a connection, undecryptable (failed authentication: forged, tampered or damaged), replayed, malformed, no_keys (before its keys or after they were discarded).",
                               labels: [("reason", label)])
            case .packetLost:
                return counter("transport_packets_lost", "Packets the server sent that asked for an acknowledgement (control) and were declared lost: the network's loss towards its clients. Audio asks for none; the listeners' own loss is in their reception reports.")
            case .probeTimeout:
                return counter("transport_probe_timeouts", "Probe timeouts: the server's packets went unacknowledged long enough to probe (a client gone silent, or heavy loss).")
            case .amplificationBlocked:
                return counter("transport_amplification_blocked", "Sends held back because a client's unvalidated address had used its 3x budget (anti-amplification).")
            }
        }
        storeFailures = counter("store_failures", "Database writes given up: refused by the database, or still failing when the server stopped.")
        fencedWrites = counter("cluster_fenced_writes", "Database writes refused because this node no longer held the channel (another node is its home under a later epoch).")
        storeRetries = counter("store_retries", "Database transactions (each the writes waiting together) tried again after a failure that passes (locked too long, disk full, I/O error).")
        storeCommits = counter("store_commits", "Database transactions that saved the hub's writes, several writes each when they come together; each costs a disk flush.")
        storeFolded = counter("store_folded", "Database writes folded into a waiting write of the same member (a newer last-seen time, push token or record, or a second removal).")
        transmissionsPruned = counter("transmissions_pruned", "Transmission-log records deleted for being older than transmissionLogDays.")
        membersForgotten = counter("members_forgotten", "Members forgotten for staying away longer than memberRetentionDays.")
        storeRefused = counter("store_refused", "Transmission-log records not written because too many were already waiting for the database.")
        storeWaiting = gauge("store_waiting", "Database writes waiting for the database.")
        storeFailing = gauge("store_failing", "1 while a write the database failed for a reason that passes is being tried again (until a write succeeds), else 0. /healthz also reports hung writes and writes lost for good; squelch_store_failures_total counts the latter.")
        relayFanout = registry.makeDurationHistogram(
            descriptor: MetricNameDescriptor(namespace: "squelch", metricName: "relay_fanout", unitName: "seconds",
                                             helpText: "Time from a talker packet reaching the relay to its last listener's copy handed to the kernel."),
            buckets: [.microseconds(10), .microseconds(25), .microseconds(50), .microseconds(100), .microseconds(200),
                      .microseconds(300), .microseconds(500), .microseconds(750), .milliseconds(1), .microseconds(1_500),
                      .milliseconds(2), .milliseconds(3), .milliseconds(5), .milliseconds(10), .milliseconds(50)])
        loopTicks = registry.makeDurationHistogram(
            descriptor: MetricNameDescriptor(namespace: "squelch", metricName: "event_loop_tick", unitName: "seconds",
                                             helpText: "How long each tick of the relay's event loop ran (the ready packets and due timers it handled before waiting again): the longest anything on it waited behind other work."),
            buckets: [.microseconds(50), .microseconds(100), .microseconds(250), .microseconds(500), .milliseconds(1), .milliseconds(2),
                      .milliseconds(5), .milliseconds(10), .milliseconds(20), .milliseconds(50), .milliseconds(100), .milliseconds(250),
                      .seconds(1)])
        loopStalls = counter("event_loop_stalls", "Ticks of the relay's event loop that ran 20 ms or more (an audio frame's length): everything else on it, audio included, waited that long.")
    }

    /// Adds the difference between two snapshots of the relay's counters.
    func publish(from old: HubCounters, to new: HubCounters, connections: Int, channels: Int) {
        func add(_ counter: Counter, _ a: Int, _ b: Int) { if b > a { counter.increment(by: Int64(b - a)) } }
        add(bursts, old.bursts, new.bursts)
        add(floorGrants, old.floorGrants, new.floorGrants)
        add(floorDenials, old.floorDenials, new.floorDenials)
        add(floorRevocations, old.floorRevocations, new.floorRevocations)
        add(joins, old.joins, new.joins)
        add(refusals, old.refusals, new.refusals)
        add(controlErrors, old.controlErrors, new.controlErrors)
        add(controlRateLimited, old.controlRateLimited, new.controlRateLimited)
        add(tokenExpiries, old.tokenExpiries, new.tokenExpiries)
        add(tokenRenewals, old.tokenRenewals, new.tokenRenewals)
        add(tokenRenewalsRefused, old.tokenRenewalsRefused, new.tokenRenewalsRefused)
        add(receptionReports, old.receptionReports, new.receptionReports)
        add(silentMembers, old.silentMembers, new.silentMembers)
        add(missedBurstReplays, old.missedBurstReplays, new.missedBurstReplays)
        add(rosterUpdatesHeld, old.rosterUpdatesHeld, new.rosterUpdatesHeld)
        add(floorRequestsLimited, old.floorRequestsLimited, new.floorRequestsLimited)
        add(wakesLimited, old.wakesLimited, new.wakesLimited)
        add(packetsIn, old.packetsIn, new.packetsIn)
        add(packetsOut, old.packetsOut, new.packetsOut)
        add(catchUpPacketsOut, old.catchUpPacketsOut, new.catchUpPacketsOut)
        add(bytesIn, old.bytesIn, new.bytesIn)
        add(bytesOut, old.bytesOut, new.bytesOut)
        add(catchUpBytesOut, old.catchUpBytesOut, new.catchUpBytesOut)
        for reason in DropReason.allCases { add(drops[reason.rawValue], old.drops[reason.rawValue], new.drops[reason.rawValue]) }
        self.connections.set(Int64(connections))
        self.channels.set(Int64(channels))
    }

    /// Adds the difference between two snapshots of the transport endpoint's counters.
    func publish(from old: EndpointStats, to new: EndpointStats, troubles oldTroubles: ConnectionTroubleTotals,
                 _ newTroubles: ConnectionTroubleTotals) {
        func add(_ counter: Counter?, _ a: Int, _ b: Int) { if b > a { counter?.increment(by: Int64(b - a)) } }
        add(handshakes[.completed], old.handshakesCompleted, new.handshakesCompleted)
        add(handshakes[.failed], old.handshakesFailed, new.handshakesFailed)
        add(handshakes[.refused], old.refused - old.refusedForAddress, new.refused - new.refusedForAddress)
        add(handshakes[.rateLimited], old.rateLimited, new.rateLimited)
        add(handshakes[.addressLimit], old.refusedForAddress, new.refusedForAddress)
        add(retriesSent, old.retriesSent, new.retriesSent)
        add(statelessResetsSent, old.statelessResetsSent, new.statelessResetsSent)
        add(versionNegotiationsSent, old.versionNegotiationsSent, new.versionNegotiationsSent)
        add(unroutable, old.dropped, new.dropped)
        add(evicted, old.evicted, new.evicted)
        add(tokensRefused, old.tokensRefused, new.tokensRefused)
        for trouble in ConnectionTrouble.allCases {
            add(transportTroubles[trouble.rawValue], oldTroubles[trouble], newTroubles[trouble])
        }
    }

    /// The Prometheus text exposition.
    public func emit() -> String {
        var buffer: [UInt8] = []
        registry.emit(into: &buffer)
        return String(decoding: buffer, as: UTF8.self)
    }
}

/// `squelch_handshakes_total{outcome}`.
enum HandshakeOutcome: String, CaseIterable {
    case completed, failed, refused
    case rateLimited = "rate_limited"
    case addressLimit = "address_limit"
}
