import Crypto
import Foundation

/// Transport error codes carried in CONNECTION_CLOSE (docs/protocol.md §10). QUIC's values.
public enum TransportErrorCode: UInt64, Sendable {
    case noError = 0x00
    case internalError = 0x01
    /// The server refuses new connections (connection limit or shutting down).
    case connectionRefused = 0x02
    case frameEncodingError = 0x07
    case transportParameterError = 0x08
    case protocolViolation = 0x0a
    /// The server could not validate the token in a client's Initial (an expired or foreign Retry token).
    case invalidToken = 0x0b
    /// An application closed before the handshake finished; its own code stays private.
    case applicationError = 0x0c
    case keyUpdateError = 0x0e
    case aeadLimitReached = 0x0f
    /// Handshake failures: 0x100 plus a TLS alert number.
    case handshakeFailure = 0x128
    case badCertificate = 0x12a
    case certificateExpired = 0x12d
    case decryptError = 0x133
}

/// Why a connection ended.
public enum ConnectionError: Error, Sendable, Equatable, CustomStringConvertible {
    /// This side closed it (the application, or a protocol error this side detected).
    case local(code: UInt64, reason: String)
    /// The peer sent CONNECTION_CLOSE.
    case peer(code: UInt64, reason: String, application: Bool)
    case handshake(HandshakeFailure)
    case handshakeTimeout
    case idleTimeout
    /// Nothing came back for `livenessTimeout` after this side sent something that needed an answer:
    /// the peer is gone (crashed, unplugged) or the path is dead.
    case peerUnresponsive
    /// The server no longer knows this connection (it restarted); a new handshake is needed.
    case statelessReset
    /// The server speaks none of the versions this client offered.
    case versionNegotiation(serverVersions: [UInt32])

    /// The server refused a stale token; a fresh handshake without it works.
    public var isInvalidToken: Bool {
        if case .peer(TransportErrorCode.invalidToken.rawValue, _, false) = self { return true }
        return false
    }

    /// Whether `WireClient` starts a new handshake by itself after this (and reports `.reconnecting`).
    public var clientReconnects: Bool {
        self == .statelessReset || self == .idleTimeout || self == .peerUnresponsive || isInvalidToken
    }

    public var description: String {
        switch self {
        case .local(let code, let reason): return "closed locally (code \(code)): \(reason)"
        case .peer(let code, let reason, let app):
            return "closed by the peer (\(app ? "application" : "transport") code \(code))\(reason.isEmpty ? "" : ": \(reason)")"
        case .handshake(let failure): return "handshake failed: \(failure)"
        case .handshakeTimeout: return "no handshake response in time; check the server address and that squelchd is running"
        case .idleTimeout: return "the connection was idle too long"
        case .peerUnresponsive: return "the other side stopped answering"
        case .statelessReset: return "the server no longer knows this connection (it restarted)"
        case .versionNegotiation(let versions):
            return "the server speaks only protocol versions \(versions.map { "0x" + String($0, radix: 16) }); upgrade this client"
        }
    }
}

/// What a connection reports to its owner. Audio datagrams do not come through here: they are handed
/// to a closure during `receive`, so that a received packet allocates nothing.
public enum ConnectionEvent: Sendable, Equatable {
    /// The handshake finished; control messages and datagrams can flow.
    case connected
    /// Server: the client presented an entry pass this server honours (docs/protocol.md §7.8), and
    /// this is what the pass carries (squelchd: the client's join, as a control message). Control
    /// messages can be sent at once, ahead of the client's Finished; `.connected` follows.
    case entered([UInt8])
    /// One control message, whole, in order, exactly once.
    case control([UInt8])
    /// The server saw the client arrive from a new address (resume or NAT rebinding).
    case peerMigrated(PathAddress)
    /// The current path answered PATH_CHALLENGE.
    case pathValidated(PathAddress)
    case pathValidationFailed(PathAddress)
    /// A token the client can present on its next connection to skip a Retry.
    case newToken([UInt8])
    case keyUpdated(generation: Int)
    /// Nothing has come back for `stallTimeout` after this side sent something that needed an answer.
    /// The connection stays open (`livenessTimeout` gives the verdict), but whoever relies on it should
    /// stop counting on it: a push-to-talk user must not talk into a server that has died.
    case stalled
    /// The peer was heard again after `.stalled`.
    case stallEnded
    case closed(ConnectionError)
}

/// Counters for operators and tests. Everything dropped is counted by cause, never acted on.
public struct ConnectionStats: Sendable, Equatable {
    public var datagramsReceived = 0
    public var datagramsSent = 0
    public var bytesReceived = 0
    public var bytesSent = 0
    public var packetsReceived = 0
    public var packetsSent = 0
    /// Failed AEAD: forged, tampered or damaged.
    public var droppedUndecryptable = 0
    /// Authentic but already received (or older than the replay window).
    public var droppedReplayed = 0
    /// Could not be parsed.
    public var droppedMalformed = 0
    /// Arrived before the keys to read them, or after they were discarded.
    public var droppedNoKeys = 0
    /// Sent packets declared lost (of `ackElicitingSent`: audio asks for no ACK, so its loss is
    /// not seen here).
    public var packetsLost = 0
    /// 1-RTT packets sent that asked for an acknowledgement (control, keepalives, path probes).
    public var ackElicitingSent = 0
    public var probeTimeouts = 0
    public var datagramsDelivered = 0
    /// Relayed media frames taken from envelopes (§3.6), not counted in `packetsReceived`.
    public var envelopesReceived = 0
    public var controlMessagesDelivered = 0
    /// Datagrams not sent because the unvalidated path's 3× budget was spent.
    public var amplificationBlocked = 0
    public var keyUpdates = 0
    public init() {}
}

/// Something a connection dropped or lost, as `ConnectionStats` counts it.
public enum ConnectionTrouble: Int, Sendable, CaseIterable {
    case undecryptable, replayed, malformed, noKeys, packetLost, probeTimeout, amplificationBlocked
}

/// The rare counters of `ConnectionStats` (drops, losses, probe timeouts, amplification stalls),
/// summed over every connection an endpoint has had, live or closed (`Endpoint.troubleTotals`).
/// Each connection adds to it as the event happens, so reading the sum costs nothing per connection
/// and nothing is lost when a connection closes.
///
/// Plain fields, not an array: the metrics keep a copy of the last sum, and an array shared with
/// it would be copied (allocated) at the next drop, on the receive path.
public struct ConnectionTroubleTotals: Sendable, Equatable {
    var undecryptable = 0, replayed = 0, malformed = 0, noKeys = 0, packetLost = 0, probeTimeout = 0, amplificationBlocked = 0
    public init() {}

    public subscript(_ trouble: ConnectionTrouble) -> Int {
        get {
            switch trouble {
            case .undecryptable: undecryptable
            case .replayed: replayed
            case .malformed: malformed
            case .noKeys: noKeys
            case .packetLost: packetLost
            case .probeTimeout: probeTimeout
            case .amplificationBlocked: amplificationBlocked
            }
        }
        set {
            switch trouble {
            case .undecryptable: undecryptable = newValue
            case .replayed: replayed = newValue
            case .malformed: malformed = newValue
            case .noKeys: noKeys = newValue
            case .packetLost: packetLost = newValue
            case .probeTimeout: probeTimeout = newValue
            case .amplificationBlocked: amplificationBlocked = newValue
            }
        }
    }
}

/// Shared by an endpoint and its connections, on the endpoint's one thread (neither is Sendable).
final class TroubleTally {
    var totals = ConnectionTroubleTotals()
}

/// Settings both roles share.
public struct ConnectionConfiguration: Sendable {
    /// Idle timeout this side advertises. The server keeps a silent session this long, which is what
    /// makes fast resume work after minutes in the background.
    public var idleTimeout: UInt64 = seconds(300)
    /// Send a PING when this side has sent nothing that needs an answer for this long (0: never),
    /// however much it hears: audio asks for no answer. Clients use 5 s in the foreground (as Mumble
    /// does), which keeps NAT mappings alive, lets the server hear from a listener during a long
    /// burst, and bounds how long a dead server goes unnoticed (`stallTimeout` counts from the
    /// first unanswered PING); a backgrounded client turns it off (`Connection.keepAlive`).
    public var keepAliveInterval: UInt64 = 0
    public var handshakeTimeout: UInt64 = seconds(10)
    /// Close with `peerUnresponsive` when nothing has come back this long after the first
    /// ack-eliciting packet sent since the peer was last heard (0: never; the idle timeout still
    /// applies). Clients use 20 s: with keepalives every 5 s, a server that crashed or a path that
    /// died ends the connection within 25 s instead of at the 300 s idle timeout (the user is told
    /// at `stallTimeout`). Servers leave it off: a backgrounded client answers nothing for minutes
    /// and must still find its session for a fast resume.
    public var livenessTimeout: UInt64 = 0
    /// Report `.stalled` when nothing has come back this long after an ack-eliciting packet (0: never;
    /// judged only while keepalives run, like `livenessTimeout`). Clients use 3 s, MCPTT's floor
    /// request timer (T101, 1 s, three tries): a user who presses to talk hears within that whether
    /// the server is there, instead of waiting the 20 s of the liveness verdict.
    public var stallTimeout: UInt64 = 0
    /// Suites in order of preference.
    public var suites: [CipherSuite] = [.aes128GCMSHA256, .chacha20Poly1305SHA256]
    /// Packets sealed under one key before a key update; never more than the suite's limit allows.
    public var keyUpdateInterval: UInt64 = 1 << 22
    public var maxAckDelay: UInt64 = ms(25)
    /// Largest datagram this side sends; every path must carry it (IPv6 minimum MTU less headers).
    public var maxDatagramSize = 1200
    /// Bytes buffered on the control stream, each way.
    public var controlStreamLimit = 1 << 20
    /// Largest control message.
    public var maxControlMessage = 64 * 1024
    /// Longest closing period (RFC 9000 §10.2 asks for 3 PTOs; a peer that inflates its RTT on
    /// purpose would stretch that to minutes of state).
    public var maxClosingPeriod: UInt64 = 3_000_000_000
    public var activeConnectionIDLimit: UInt64 = 4
    public init() {}

    public static var client: ConnectionConfiguration {
        var c = ConnectionConfiguration()
        c.keepAliveInterval = seconds(5)
        c.livenessTimeout = seconds(20)
        c.stallTimeout = seconds(3)
        return c
    }
}

/// Client settings: which server to trust and what name to check.
public struct ClientConfiguration: Sendable {
    public var serverName: String
    public var validator: CertificateValidator
    public var connection: ConnectionConfiguration
    public var versions: [UInt32]
    /// A cluster node's entry pass for the server dialled (docs/protocol.md §7.8): presented in the
    /// ClientHello; `Connection.entryPassAccepted` says whether the server took it.
    public var entryPass: EntryPass?

    public init(serverName: String, validator: CertificateValidator, connection: ConnectionConfiguration = .client,
                versions: [UInt32] = WireVersion.supported, entryPass: EntryPass? = nil) {
        self.serverName = serverName
        self.validator = validator
        self.connection = connection
        self.versions = versions
        self.entryPass = entryPass
    }
}

/// Server-wide secrets: the identity, and the keys for stateless reset and address tokens. The reset
/// key must survive a restart (docs/protocol.md §3.5), so that a restarted server can still reset
/// connections it has forgotten.
public struct ServerSecrets: Sendable {
    public let identity: ServerIdentity
    public let resetKey: SymmetricKey
    public let tokenKey: SymmetricKey
    /// Names the clock that `WireInstant`s come from: address tokens carry it and are honoured only
    /// under the same one. The clock is monotonic from boot, so a token key kept on disk across a
    /// reboot must not let a token from the last boot count its age on the new clock (an hour-old
    /// token could look fresh for another hour). `WireNIO.monotonicClockEpoch()` derives it from the
    /// kernel's boot ID; the default, a random number, limits tokens to this process.
    public let clockEpoch: UInt64
    /// Set on a cluster node: the entry passes it honours (and issues, to the nodes it redirects to).
    public let entryPasses: EntryPasses?

    public init(identity: ServerIdentity, resetKey: SymmetricKey, tokenKey: SymmetricKey = SymmetricKey(size: .bits256),
                clockEpoch: UInt64 = .random(in: .min ... .max), entryPasses: EntryPasses? = nil) {
        self.identity = identity
        self.resetKey = resetKey
        self.tokenKey = tokenKey
        self.clockEpoch = clockEpoch
        self.entryPasses = entryPasses
    }

    /// HMAC-SHA256(reset key, connection ID), first 16 bytes.
    public func resetToken(for id: ConnectionID) -> [UInt8] {
        Array(HMAC<SHA256>.authenticationCode(for: id.bytes, using: resetKey)).prefix(16).map { $0 }
    }
}

/// A datagram to send: `count` bytes at the start of the caller's buffer, to `address`.
public struct Transmit: Sendable, Equatable {
    public var count: Int
    public var address: PathAddress
}
