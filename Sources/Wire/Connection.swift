import Crypto
import Foundation
import X509

/// One end of a connection, as a sans-I/O state machine (docs/protocol.md §13).
///
/// Datagrams, time and commands go in (`receive`, `handleTimeout`, `sendControl`, `close`, …);
/// datagrams (`poll`, `sendDatagram`), events (`nextEvent`) and the next deadline (`nextDeadline`) come
/// out. It never touches a socket or a clock, so tests drive it through loss, reordering and time jumps.
///
/// Not Sendable: a connection belongs to one event loop (or one test), which owns every call.
///
/// Every stored property is `@exclusivity(unchecked)`, as are those of `Endpoint`, `PacketKey` and
/// `WireClient`: Swift's dynamic exclusivity checks on class properties (`swift_beginAccess`, a
/// thread-local access set per mutation) were a tenth of the relay's user-space samples. One thread
/// owns these objects, so a violation could only be a method overlapping its own access to a
/// property; nothing here passes a property `inout` while the callee can reach it again
/// (docs/decisions/0010-exclusivity-unchecked-in-wire.md).
public final class Connection {
    public enum Role: Sendable { case client, server }
    public enum State: Sendable, Equatable { case handshaking, established, closing, draining, closed }

    public let role: Role
    /// Where the peer is now (it changes when a client migrates).
    public var remoteAddress: PathAddress { path.address }
    @exclusivity(unchecked) public internal(set) var state: State = .handshaking
    @exclusivity(unchecked) public internal(set) var stats = ConnectionStats()
    /// The endpoint's sum of every connection's troubles; nil for a client's connection.
    @exclusivity(unchecked) var tally: TroubleTally?
    /// Why it ended, once it has.
    @exclusivity(unchecked) public internal(set) var error: ConnectionError?

    let config: ConnectionConfiguration
    @exclusivity(unchecked) var random: any RandomNumberGenerator

    // MARK: Connection IDs

    /// The longest NEW_TOKEN a client keeps (`Connection+Receive`).
    static let maximumNewTokenBytes = 256
    /// The ID the peer puts in packets to us: for a client, its only one; for a server, the first.
    public let localID: ConnectionID
    /// The client's first destination ID (Initial keys and the transcript bind it).
    public let originalDestination: ConnectionID
    /// The ID we address the peer by.
    @exclusivity(unchecked) public internal(set) var peerID: ConnectionID
    struct PeerID { var sequence: UInt64; var id: ConnectionID; var resetToken: [UInt8]?; var retired: Bool }
    /// Client: the server's IDs (sequence 0 from the handshake, more from NEW_CONNECTION_ID).
    @exclusivity(unchecked) var peerIDs: [PeerID] = []
    @exclusivity(unchecked) var currentPeerSequence: UInt64 = 0
    /// A connection ID this server issued and the client has not retired (retired ones are dropped, so
    /// a client retiring IDs in a loop can't grow the list).
    struct IssuedID { var sequence: UInt64; var id: ConnectionID }
    /// Server: the IDs issued to the client.
    @exclusivity(unchecked) var issuedIDs: [IssuedID] = []
    /// The sequence number the next issued ID gets.
    @exclusivity(unchecked) var nextIssuedSequence: UInt64 = 1
    /// The highest sequence number sent in a NEW_CONNECTION_ID (0: the handshake's own ID); a RETIRE
    /// beyond it is a protocol violation (RFC 9000 §19.16).
    @exclusivity(unchecked) var highestSentSequence: UInt64 = 0
    /// Routing changes the endpoint must apply: (id, true) to add, (id, false) to remove.
    @exclusivity(unchecked) var routingChanges: [(ConnectionID, Bool)] = []
    @exclusivity(unchecked) var retryToken: [UInt8] = []
    @exclusivity(unchecked) var retrySource: ConnectionID?
    let serverSecrets: ServerSecrets?

    // MARK: Paths

    struct Path {
        var address: PathAddress
        var validated: Bool
        var bytesReceived = 0
        var bytesSent = 0
        var challenge: UInt64?
        var challengePending = false
        var challengeResendAt: WireInstant?
        var challengeAbandonAt: WireInstant?

        mutating func endChallenge() {
            challenge = nil
            challengePending = false
            challengeResendAt = nil
            challengeAbandonAt = nil
        }
    }

    /// Probes the current path: PATH_CHALLENGE in the next packet, resent every PTO, abandoned after
    /// 3 × max(PTO, the initial PTO) (RFC 9000 §8.2.4).
    func startPathChallenge(now: WireInstant) {
        path.challenge = random.next()
        path.challengePending = true
        path.challengeResendAt = now + currentPTO
        path.challengeAbandonAt = now + 3 * max(currentPTO, RTTEstimator().probeTimeout(maxAckDelay: config.maxAckDelay))
    }
    @exclusivity(unchecked) var path: Path
    @exclusivity(unchecked) var previousPath: Path?
    /// The last validated address the peer moved away from, and when (`migratePath`).
    @exclusivity(unchecked) var recentlyValidated: (address: PathAddress, leftAt: WireInstant)?
    @exclusivity(unchecked) var pendingPathResponse: UInt64?

    // MARK: Packet spaces

    struct HandshakeSpace {
        var seal: PacketKey?
        var open: PacketKey?
        var nextPN: UInt64 = 0
        var largestReceived: UInt64?
        /// Every CRYPTO byte this side sends in the space; a retransmission resends all of it.
        var flight: [UInt8] = []
        var flightSent = 0
        var receive = ReassemblyBuffer(limit: 64 * 1024)
        var inbox: [UInt8] = []
        /// Client, Initial space: padded PING datagrams owed to a server whose flight has not all come
        /// (`Connection.oweFlightAcknowledgement`).
        var pingsOwed = 0
        var hasSomethingToSend: Bool { seal != nil && (flightSent < flight.count || pingsOwed > 0) }
    }
    @exclusivity(unchecked) var initialSpace = HandshakeSpace()
    @exclusivity(unchecked) var handshakeSpace = HandshakeSpace()
    @exclusivity(unchecked) var closeInHandshakeSpace = false
    /// Authenticated Handshake packets received, for `oweFlightAcknowledgement`.
    @exclusivity(unchecked) var handshakePacketsReceived = 0

    @exclusivity(unchecked) var appSeal: PacketKey?
    @exclusivity(unchecked) var appOpen: PacketKey?
    @exclusivity(unchecked) var appOpenPrevious: PacketKey?
    @exclusivity(unchecked) var appOpenNext: PacketKey?
    @exclusivity(unchecked) var sendKeyPhase = false
    @exclusivity(unchecked) var readKeyPhase = false
    @exclusivity(unchecked) var firstPNInReadPhase: UInt64 = 0
    @exclusivity(unchecked) var previousReadKeyDiscardAt: WireInstant?
    @exclusivity(unchecked) var firstPNInSendPhase: UInt64 = 0
    @exclusivity(unchecked) var sentInSendPhase: UInt64 = 0
    @exclusivity(unchecked) var sendPhaseAcknowledged = false
    /// Key generation of received packets, and of sent ones.
    @exclusivity(unchecked) public internal(set) var keyGeneration = 0
    @exclusivity(unchecked) public internal(set) var sendGeneration = 0
    /// Server: 1-RTT packets are not processed until the client's Finished verifies.
    @exclusivity(unchecked) var peerFinished = false
    @exclusivity(unchecked) public internal(set) var handshakeConfirmed = false

    @exclusivity(unchecked) var appNextPN: UInt64 = 0
    @exclusivity(unchecked) var largestAckedByPeer: UInt64?
    @exclusivity(unchecked) var replay = ReplayWindow()
    @exclusivity(unchecked) var received = ReceivedRanges()
    @exclusivity(unchecked) var ackElicitingSinceAck = 0
    @exclusivity(unchecked) var ackDeadline: WireInstant?
    /// An ACK is due at the next poll.
    @exclusivity(unchecked) var ackNow = false
    @exclusivity(unchecked) var largestReceivedTime: WireInstant?
    @exclusivity(unchecked) var sent = SentPackets()
    /// Sealing a packet queued something for the next poll: it displaced an unacknowledged packet
    /// from `sent`, whose content may now wait to be retransmitted, or a key update asks for a PING.
    /// `Endpoint.sendDatagram` checks this one flag, rather than everything `hasPendingOutput` looks
    /// at, after each fan-out copy.
    @exclusivity(unchecked) var outputQueuedOnSend = false
    /// When a key update last asked the peer for an acknowledgement (`updateKeysIfDue`).
    @exclusivity(unchecked) var keyUpdatePingAt: WireInstant?
    @exclusivity(unchecked) public internal(set) var rtt = RTTEstimator()
    @exclusivity(unchecked) var ptoCount = 0
    @exclusivity(unchecked) var retransmittableInFlight = 0
    @exclusivity(unchecked) var lastRetransmittableSent: WireInstant?
    @exclusivity(unchecked) var lossTime: WireInstant?
    @exclusivity(unchecked) var handshakeRetransmitAt: WireInstant?
    @exclusivity(unchecked) var handshakePTOCount = 0

    // MARK: Streams and pending frames

    @exclusivity(unchecked) var controlSend: SendStream
    @exclusivity(unchecked) var controlReceive: ReassemblyBuffer
    @exclusivity(unchecked) var controlInbox: [UInt8] = []
    @exclusivity(unchecked) var pendingHandshakeDone = false
    @exclusivity(unchecked) var pendingNewToken: [UInt8]?
    @exclusivity(unchecked) var pendingNewIDs: UInt64 = 0
    @exclusivity(unchecked) var pendingRetireIDs: UInt64 = 0
    @exclusivity(unchecked) var pendingPing = false
    @exclusivity(unchecked) var pendingClose: (code: UInt64, reason: String, application: Bool)?
    @exclusivity(unchecked) var closeResends = 0
    @exclusivity(unchecked) var closeSent = false
    @exclusivity(unchecked) var pendingCloseResend = false
    /// The time of the latest poll or timeout, for timers armed while building packets.
    @exclusivity(unchecked) var lastPollTime: WireInstant

    // MARK: Handshake state

    @exclusivity(unchecked) var transcript = Transcript()
    @exclusivity(unchecked) var ephemeral: Curve25519.KeyAgreement.PrivateKey?
    @exclusivity(unchecked) var clientHello: [UInt8] = []
    @exclusivity(unchecked) var secrets: HandshakeCrypto.Secrets?
    @exclusivity(unchecked) var suite: CipherSuite = .aes128GCMSHA256
    @exclusivity(unchecked) var peerParameters: TransportParameters?
    @exclusivity(unchecked) var serverChain: [[UInt8]] = []
    @exclusivity(unchecked) var serverFinishedHash: [UInt8] = []
    /// Client: the CertificateVerify signature checked out (the server's Finished may follow).
    @exclusivity(unchecked) var certificateVerified = false
    @exclusivity(unchecked) var clientApplicationSecret: [UInt8] = []
    @exclusivity(unchecked) var serverApplicationSecret: [UInt8] = []
    let clientConfiguration: ClientConfiguration?
    /// Set when the client needs the server's chain validated before it can finish.
    @exclusivity(unchecked) public internal(set) var pendingCertificateCheck: CertificateCheck?
    @exclusivity(unchecked) var receivedServerPacket = false
    /// Server: the ClientHello has been processed.
    @exclusivity(unchecked) var clientHelloProcessed = false
    /// Server: the length and hash of the first CRYPTO fragment at offset 0 in the Initial space, to
    /// tell a real retransmission of the ClientHello (its flight was lost: resend ours), which
    /// repeats it, from any other Initial that claims offset 0. The whole ClientHello when it fits
    /// one packet; its first packet's part when it doesn't (a long entry pass), as the client cuts a
    /// retransmission the same way.
    @exclusivity(unchecked) var clientHelloFirstFragment: (length: Int, digest: SHA256Digest)?
    /// Client: the server honoured the entry pass (its EncryptedExtensions say so): what the pass
    /// carried is being answered already, and is not to be sent again.
    @exclusivity(unchecked) public internal(set) var entryPassAccepted = false
    /// Server: the endpoint's record of the passes that have entered (one thread, the endpoint's).
    @exclusivity(unchecked) var spentPasses: SpentPasses?

    // MARK: Timers

    @exclusivity(unchecked) var idleDeadline: WireInstant?
    @exclusivity(unchecked) var keepAliveDeadline: WireInstant?
    @exclusivity(unchecked) var handshakeDeadline: WireInstant?
    @exclusivity(unchecked) var closeDeadline: WireInstant?
    /// When the peer was last heard from (any authenticated packet, keepalive PINGs included).
    @exclusivity(unchecked) public internal(set) var lastReceiveTime: WireInstant
    @exclusivity(unchecked) var ackElicitingSentSinceReceive = false
    /// When the first ack-eliciting packet since the peer was last heard went out (`livenessTimeout`).
    @exclusivity(unchecked) var unansweredSince: WireInstant?
    /// When the last liveness probe (a PING while something is unanswered) went out.
    @exclusivity(unchecked) var lastLivenessProbe: WireInstant?
    /// `.stalled` went out and the peer has not been heard since.
    @exclusivity(unchecked) public internal(set) var stalled = false
    /// Whether to send keepalive PINGs (turn off while an app is in the background).
    @exclusivity(unchecked) public var keepAlive: Bool {
        didSet {
            // Liveness is judged only while keepalives run (the foreground): what went unanswered
            // while they were off counts from the next packet sent, not from before the app slept.
            if keepAlive && !oldValue { forgetUnanswered() }
        }
    }

    @exclusivity(unchecked) var events = FIFOQueue<ConnectionEvent>()

    // MARK: Creation

    /// A client connection to `remote`. `token` is one a server gave earlier (NEW_TOKEN), which lets
    /// it skip the Retry round trip. `random` is injectable for tests and test vectors.
    public init(client configuration: ClientConfiguration, remote: PathAddress, now: WireInstant, token: [UInt8] = [],
                random: any RandomNumberGenerator = SystemRandomNumberGenerator()) {
        role = .client
        config = configuration.connection
        clientConfiguration = configuration
        serverSecrets = nil
        self.random = random
        localID = ConnectionID(self.random.next())
        originalDestination = ConnectionID(self.random.next())
        peerID = originalDestination
        retryToken = token
        path = Path(address: remote, validated: true)
        controlSend = SendStream(limit: configuration.connection.controlStreamLimit)
        controlReceive = ReassemblyBuffer(limit: configuration.connection.controlStreamLimit)
        lastReceiveTime = now
        lastPollTime = now
        keepAlive = configuration.connection.keepAliveInterval > 0
        handshakeDeadline = now + config.handshakeTimeout
        setInitialKeys(destination: originalDestination)
        startClientHello()
        handshakeRetransmitAt = now + rtt.probeTimeout(maxAckDelay: 0)
    }

    /// A server connection, created by the endpoint for a client Initial that passed its checks.
    init(server secrets: ServerSecrets, configuration: ConnectionConfiguration, remote: PathAddress, now: WireInstant,
         initialDestination: ConnectionID, clientSource: ConnectionID, originalDestination: ConnectionID,
         retrySource: ConnectionID?, localID: ConnectionID, random: any RandomNumberGenerator) {
        role = .server
        config = configuration
        clientConfiguration = nil
        serverSecrets = secrets
        self.random = random
        self.localID = localID
        self.originalDestination = originalDestination
        self.retrySource = retrySource
        peerID = clientSource
        // Unvalidated until a Handshake packet comes from it, even when the client had a token: the
        // 3x limit holds until then (docs/protocol.md §8.4).
        path = Path(address: remote, validated: false)
        controlSend = SendStream(limit: configuration.controlStreamLimit)
        controlReceive = ReassemblyBuffer(limit: configuration.controlStreamLimit)
        lastReceiveTime = now
        lastPollTime = now
        keepAlive = configuration.keepAliveInterval > 0
        handshakeDeadline = now + configuration.handshakeTimeout
        issuedIDs = [IssuedID(sequence: 0, id: localID)]
        setInitialKeys(destination: initialDestination)
    }

    func setInitialKeys(destination: ConnectionID) {
        let (client, server) = KeySchedule.initialSecrets(clientDestination: destination)
        // Key setup fails only if libcrypto cannot allocate; the connection then never gets keys and
        // times out, which is the honest outcome.
        initialSpace.seal = try? PacketKey(secret: role == .client ? client : server, suite: .aes128GCMSHA256, sealing: true)
        initialSpace.open = try? PacketKey(secret: role == .client ? server : client, suite: .aes128GCMSHA256, sealing: false)
    }

    // MARK: Commands

    /// The next event, if any.
    public func nextEvent() -> ConnectionEvent? { events.next() }

    func emit(_ event: ConnectionEvent) { events.append(event) }

    /// Counts a drop or loss here and in the endpoint's totals (rare paths only: never per packet sent).
    func count(_ trouble: ConnectionTrouble) {
        switch trouble {
        case .undecryptable: stats.droppedUndecryptable += 1
        case .replayed: stats.droppedReplayed += 1
        case .malformed: stats.droppedMalformed += 1
        case .noKeys: stats.droppedNoKeys += 1
        case .packetLost: stats.packetsLost += 1
        case .probeTimeout: stats.probeTimeouts += 1
        case .amplificationBlocked: stats.amplificationBlocked += 1
        }
        tally?.totals[trouble] += 1
    }

    /// Queues a control message: delivered reliably, in order, exactly once.
    public func sendControl(_ message: [UInt8]) throws(ConnectionError) {
        guard state == .established || state == .handshaking else { throw error ?? .local(code: 0, reason: "closed") }
        guard message.count <= config.maxControlMessage else {
            throw .local(code: TransportErrorCode.internalError.rawValue, reason: "control message of \(message.count) bytes exceeds \(config.maxControlMessage)")
        }
        var framed = [UInt8](repeating: 0, count: Self.framedControlSize(message.count))
        framed.withUnsafeMutableBytes { buffer in
            var writer = WireWriter(buffer)
            writer.varint(UInt64(message.count))
            writer.bytes(message)
        }
        do { try controlSend.append(framed) } catch {
            throw .local(code: TransportErrorCode.internalError.rawValue, reason: "control stream buffer full: the peer is not acknowledging")
        }
    }

    /// Bytes `sendControl` can queue now, length prefixes included: the stream keeps what it sent
    /// until the peer acknowledges it, up to `controlStreamLimit`. A sender with more to say (a large
    /// roster) waits for this to grow rather than have messages refused.
    public var controlSendSpace: Int { controlSend.limit - controlSend.unacknowledged }
    /// `controlSendSpace` when everything sent has been acknowledged.
    public var controlSendLimit: Int { controlSend.limit }

    /// What `message.count` bytes of control message take in the stream, with their length prefix.
    public static func framedControlSize(_ count: Int) -> Int { WireWriter.varintLength(UInt64(count)) + count }

    /// Closes the connection with a CONNECTION_CLOSE carrying `code` and `reason`.
    public func close(code: UInt64 = 0, reason: String = "", application: Bool = true, now: WireInstant) {
        guard state == .handshaking || state == .established else { return }
        enterClosing(code: code, reason: reason, application: application, now: now,
                     error: .local(code: code, reason: reason))
    }

    func enterClosing(code: UInt64, reason: String, application: Bool, now: WireInstant, error: ConnectionError) {
        pendingClose = (code, reason, application)
        closeInHandshakeSpace = state == .handshaking
        state = .closing
        // 3 PTOs (RFC 9000 §10.2), but never longer than `maxClosingPeriod`: a peer that delays its
        // ACKs on purpose inflates the PTO, and its connection's state would outlive it by minutes.
        closeDeadline = now + min(3 * currentPTO, config.maxClosingPeriod)
        finish(error)
    }

    /// Server: ends the connection at once, with one CONNECTION_CLOSE and no closing period (the
    /// endpoint needs its place for another; `Endpoint.makeRoomForUnadmitted`).
    func abandon(code: UInt64, reason: String, now: WireInstant) {
        close(code: code, reason: reason, application: false, now: now)
        closeDeadline = now
    }

    /// Server: the application vouched for the peer (`Endpoint.admit`): its control stream may
    /// use the whole `controlStreamLimit`, not only the unadmitted share.
    func admitted() {
        controlReceive.limit = config.controlStreamLimit
    }

    func finish(_ error: ConnectionError) {
        guard self.error == nil else { return }
        self.error = error
        emit(.closed(error))
    }

    /// Client: continue after a long silence, from whatever address the socket now has. Switches to
    /// a fresh server connection ID (so the two paths can't be linked), retires the old one, and
    /// probes with PATH_CHALLENGE. The next packet can carry audio or a floor request at once.
    ///
    /// - Parameter newPath: false when only the socket was replaced after an error on the same network
    ///   (`WireClientChannel`'s recovery): the liveness count then goes on.
    public func migrate(now: WireInstant, newPath: Bool = true) {
        guard role == .client, state == .established else { return }
        if let next = peerIDs.first(where: { !$0.retired && $0.sequence != currentPeerSequence }) {
            if let index = peerIDs.firstIndex(where: { $0.sequence == currentPeerSequence }) {
                peerIDs[index].retired = true
                pendingRetireIDs |= 1 << (currentPeerSequence % 64)
            }
            currentPeerSequence = next.sequence
            peerID = next.id
        }
        startPathChallenge(now: now)
        lastReceiveTime = now
        // Whatever went unanswered before the app moved (the last keepalive before it slept) says
        // nothing of the new path: its liveness counts from what is sent from here on. A socket
        // replaced after a send error (no route, the network gone) is the same path, and the count
        // goes on: otherwise a phone with no network would rebind every few seconds and never be
        // told the server is unreachable.
        if newPath { forgetUnanswered() }
        resetIdleTimer(now: now)
    }

    func forgetUnanswered() {
        ackElicitingSentSinceReceive = false
        unansweredSince = nil
        lastLivenessProbe = nil
    }

    /// Client: the certificate check came back. On success the client sends its Finished and the
    /// connection is established.
    public func completeCertificateCheck(_ result: Result<Void, HandshakeFailure>, now: WireInstant) {
        guard role == .client, pendingCertificateCheck != nil, state == .handshaking else { return }
        pendingCertificateCheck = nil
        switch result {
        case .failure(let failure):
            failHandshake(failure, now: now)
        case .success:
            guard let secrets else { return }
            let finished = HandshakeMessage.finished(HandshakeCrypto.finished(baseSecret: secrets.clientHandshake,
                                                                           transcriptHash: serverFinishedHash)).encoded()
            transcript.add(finished)
            handshakeSpace.flight += finished
            installApplicationKeys()
            state = .established
            // The client sends no more Initial packets once it has Handshake keys in use.
            initialSpace = HandshakeSpace()
            handshakeRetransmitAt = now + currentPTO
            handshakePTOCount = 0
            handshakeDeadline = nil
            resetIdleTimer(now: now)
            armKeepAlive(now: now)
            emit(.connected)
        }
    }

    /// Starts a key update now (normally automatic after `keyUpdateInterval` packets).
    public func initiateKeyUpdate() -> Bool {
        // RFC 9001 §6: not before the handshake is confirmed, and not again until the peer has
        // acknowledged a packet under the current keys (so it has them too).
        guard handshakeConfirmed, sendGeneration == 0 || sendPhaseAcknowledged, let seal = appSeal,
              let next = try? seal.nextGeneration() else { return false }
        appSeal = next
        sendGeneration += 1
        sendKeyPhase.toggle()
        firstPNInSendPhase = appNextPN
        sentInSendPhase = 0
        sendPhaseAcknowledged = false
        return true
    }

    func failHandshake(_ failure: HandshakeFailure, now: WireInstant) {
        let code: TransportErrorCode = switch failure {
        case .certificateExpired, .certificateNotYetValid: .certificateExpired
        case .untrustedCertificate, .wrongServerName, .unreadableCertificate, .notForServers: .badCertificate
        case .badSignature, .badFinished: .decryptError
        case .transportParameters: .transportParameterError
        default: .handshakeFailure
        }
        enterClosing(code: code.rawValue, reason: "\(failure)", application: false, now: now, error: .handshake(failure))
    }

    func protocolViolation(_ reason: String, now: WireInstant, code: TransportErrorCode = .protocolViolation) {
        enterClosing(code: code.rawValue, reason: reason, application: false, now: now,
                     error: .local(code: code.rawValue, reason: reason))
    }

    /// Routing changes for the endpoint (server only).
    func takeRoutingChanges() -> [(ConnectionID, Bool)] {
        defer { routingChanges.removeAll() }
        return routingChanges
    }

    /// Every connection ID that currently routes to this connection (server only).
    var activeLocalIDs: [ConnectionID] { issuedIDs.map(\.id) }
}
