/// What a `WireClient` reports: its connection's events, and when it starts over by itself.
public enum ClientEvent: Sendable, Equatable {
    case connection(ConnectionEvent)
    /// The connection ended in a way a new handshake fixes (the server restarted, or the session
    /// idled out); a new connection is already handshaking. The application re-joins on `.connected`.
    case reconnecting(ConnectionError)
    /// The server honoured the configuration's entry pass: what the pass carried is being answered
    /// and must not be sent again. Comes right before that connection's `.connected`.
    case entered
}

/// A client that keeps itself connected: on a stateless reset (the server restarted and forgot the
/// session), an idle timeout, a server that stopped answering (`peerUnresponsive`) or a refused address
/// token it starts a new handshake at once, with no help from the application
/// (`ConnectionError.clientReconnects`). Sans-I/O like `Connection`.
public final class WireClient {
    @exclusivity(unchecked) public private(set) var connection: Connection
    /// Its entry pass goes after the first connection: a pass is for one.
    public private(set) var configuration: ClientConfiguration
    @exclusivity(unchecked) public private(set) var remote: PathAddress
    /// A server token from NEW_TOKEN, presented on the next handshake to skip a Retry, then dropped.
    @exclusivity(unchecked) public private(set) var token: [UInt8] = []
    @exclusivity(unchecked) public private(set) var reconnects = 0
    @exclusivity(unchecked) var random: any RandomNumberGenerator
    /// Makes each connection's generator (see `Endpoint.forkRandom`): a reconnection must not repeat
    /// the first connection's IDs and keys.
    let forkRandom: (inout any RandomNumberGenerator) -> any RandomNumberGenerator
    @exclusivity(unchecked) var events = FIFOQueue<ClientEvent>()

    public init(configuration: ClientConfiguration, remote: PathAddress, now: WireInstant,
                random: any RandomNumberGenerator = SystemRandomNumberGenerator(),
                forkRandom: @escaping (inout any RandomNumberGenerator) -> any RandomNumberGenerator = { _ in SystemRandomNumberGenerator() }) {
        self.configuration = configuration
        self.remote = remote
        self.random = random
        self.forkRandom = forkRandom
        connection = Connection(client: configuration, remote: remote, now: now, random: forkRandom(&self.random))
    }

    public func nextEvent() -> ClientEvent? { events.next() }

    public func receive(_ datagram: UnsafeMutableRawBufferPointer, from address: PathAddress, now: WireInstant,
                        datagrams: (UnsafeRawBufferPointer) -> Void = { _ in }) {
        // With an entry pass the server's answer comes with its flight, in 1-RTT packets the
        // connection can't open until the certificate check is done: kept (a copy, as receiving
        // unprotects in place) and received again then, rather than waiting for a retransmission.
        // State first: an established connection's every audio datagram pays this one compare.
        let keep = connection.state == .handshaking && configuration.entryPass != nil && earlyBytes + datagram.count <= Self.earlyByteLimit
        let copy = keep ? Array(datagram) : []
        let dropped = keep ? connection.stats.droppedNoKeys : 0
        connection.receive(datagram, from: address, now: now, datagrams: datagrams)
        if keep, connection.stats.droppedNoKeys > dropped {
            earlyDatagrams.append((copy, address))
            earlyBytes += copy.count
        }
        drain(now: now)
    }

    /// 1-RTT datagrams that came before the keys to open them (`receive`), and their size: room for
    /// a large channel's `joined`, which the home may send whole to the host its pass names.
    @exclusivity(unchecked) var earlyDatagrams: [([UInt8], PathAddress)] = []
    @exclusivity(unchecked) var earlyBytes = 0
    static let earlyByteLimit = 64 << 10

    public func handleTimeout(now: WireInstant) {
        connection.handleTimeout(now: now)
        drain(now: now)
    }

    public func poll(into buffer: UnsafeMutableRawBufferPointer, now: WireInstant) -> Transmit? {
        connection.poll(into: buffer, now: now)
    }

    public var nextDeadline: WireInstant? { connection.nextDeadline }

    public func completeCertificateCheck(_ result: Result<Void, HandshakeFailure>, now: WireInstant) {
        connection.completeCertificateCheck(result, now: now)
        let early = earlyDatagrams
        earlyDatagrams = []
        earlyBytes = 0
        if connection.state == .established {
            for (var bytes, address) in early {
                bytes.withUnsafeMutableBytes { connection.receive($0, from: address, now: now, datagrams: { _ in }) }
            }
        }
        drain(now: now)
    }

    public func sendControl(_ message: [UInt8]) throws(ConnectionError) { try connection.sendControl(message) }

    public func sendDatagram(_ payload: UnsafeRawBufferPointer, into buffer: UnsafeMutableRawBufferPointer, now: WireInstant) -> Transmit? {
        connection.sendDatagram(payload, into: buffer, now: now)
    }

    /// After the app wakes with a new local address or port: carry on the same session from there.
    /// - Parameter newPath: false when only the socket was replaced on the same network after a send
    ///   error; the liveness count then goes on (`Connection.migrate`).
    public func migrate(now: WireInstant, newPath: Bool = true) {
        connection.migrate(now: now, newPath: newPath)
    }

    public func close(code: UInt64 = 0, reason: String = "", now: WireInstant) {
        connection.close(code: code, reason: reason, now: now)
        drain(now: now)
    }

    func drain(now: WireInstant) {
        while let event = connection.nextEvent() {
            switch event {
            case .newToken(let fresh):
                token = fresh
                events.append(.connection(event))
            case .closed(let error) where error.clientReconnects:
                if error.isInvalidToken { token = [] }
                events.append(.connection(event))
                reconnects += 1
                configuration.entryPass = nil
                earlyDatagrams = []
                earlyBytes = 0
                connection = Connection(client: configuration, remote: remote, now: now, token: token, random: forkRandom(&random))
                token = []  // a token opens one connection (the server refuses it again); the new one brings another
                events.append(.reconnecting(error))
            case .connected where connection.entryPassAccepted:
                events.append(.entered)
                events.append(.connection(event))
            default:
                events.append(.connection(event))
            }
        }
    }
}
