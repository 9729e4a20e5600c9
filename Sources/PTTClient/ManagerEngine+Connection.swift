import Audio
import ChannelProtocol
import Foundation
import JitterBuffer
import NIOConcurrencyHelpers
import NIOCore
import Wire
import WireNIO

// The voice connection: opening it, its events, closing it.
extension ManagerEngine {
    func openConnection(_ credentials: ChannelCredentials, cluster: Bool = false, pass: HomePass? = nil) async {
        // A connection replaced by a new one closes as going away, not normally: squelchd shows a
        // member whose client closed normally offline at once and gives its floor away, while this
        // one is back in a moment (its grace period covers that).
        await closeConnection(code: .goingAway)
        generation += 1
        let g = generation
        let sink = commandSink
        let client: WireClientChannel
        // Audio goes from the event loop straight into the jitter buffer, stamped as it arrives,
        // rather than through a task that a busy thread pool (or a delegate blocking one of its
        // threads) can hold back past the buffer's patience.
        let receiver = self.receiver
        do throws(SetupProblem) {
            let connection = cluster ? Self.clusterLiveness(configuration.connection) : configuration.connection
            client = try Self.makeClient(credentials, connection: connection, pass: pass, onDatagram: { bytes in
                // A burst's key may come as a datagram too, ahead of its control message.
                if let key = MediaKey(datagram: bytes) { receiver.addMediaKey(key) } else { receiver.receive(bytes) }
            })
        } catch {
            sink.yield(.transportFailed(g, error.message))
            return
        }
        self.client = client
        let codec = MessageCodec()
        let transmitter = self.transmitter
        connectionTasks = [
            Task {
                // Media keys go to the receiver and transmitter here, in the control stream's order,
                // rather than through the session: a catch-up's frames arrive right behind them.
                var keys = SessionKeys(receiver: receiver, transmitter: transmitter)
                var entered = false
                for await event in client.events {
                    switch event {
                    case .entered:
                        entered = true
                    case .connection(.control(let bytes)):
                        if let message = try? codec.decodeServerMessage(bytes) {
                            keys.take(message)
                            sink.yield(.server(g, message))
                        }
                    case .reconnecting:
                        sink.yield(.transportReconnecting(g))
                    case .connection(.connected):
                        sink.yield(.transportConnected(g, entered: entered))
                        entered = false
                    case .connection(.stalled):
                        sink.yield(.transportStalled(g, true))
                    case .connection(.stallEnded):
                        sink.yield(.transportStalled(g, false))
                    case .connection(.closed(let error)) where error.clientReconnects:
                        // The client is already handshaking again; `.reconnecting` comes next and says
                        // so. Taking this for a failure would mark the channel unavailable and open a
                        // second connection after the backoff.
                        break
                    case .connection(.closed(let error)):
                        sink.yield(.transportFailed(g, Self.describe(error, credentials), serverWentAway: Self.isGoingAway(error)))
                    default:
                        break
                    }
                }
            },
            Task {
                do {
                    try await client.connect()
                } catch {
                    sink.yield(.transportFailed(g, Self.describe(error, credentials)))
                }
            },
        ]
    }

    /// `base` with the liveness a cluster's failover needs: a keepalive every second, a stall after
    /// two seconds unanswered, and a handshake given up after three, so that a dead home is noticed (and the channel found on its new
    /// node) within about three seconds while the channel is quiet, instead of up to eight. Costs one
    /// small packet a second each way.
    static func clusterLiveness(_ base: ConnectionConfiguration) -> ConnectionConfiguration {
        let second: UInt64 = 1_000_000_000
        var connection = base
        connection.keepAliveInterval = base.keepAliveInterval == 0 ? second : min(base.keepAliveInterval, second)
        connection.stallTimeout = base.stallTimeout == 0 ? 2 * second : min(base.stallTimeout, 2 * second)
        // A home that has just died can still be named by a redirect (its heartbeat is not stale
        // yet): give up on it after 3 s and ask the entry point again, rather than after 10.
        connection.handshakeTimeout = min(base.handshakeTimeout, 3 * second)
        return connection
    }

    func closeConnection(code: CloseCode = .normal) async {
        guard let client else { return }
        self.client = nil
        generation += 1
        let tasks = connectionTasks
        connectionTasks = []
        await Self.waitUntilControlAcknowledged(client, atMost: .milliseconds(1_500))
        await client.close(code: code.rawValue, reason: code == .normal ? "client closed" : "client reconnecting")
        for task in tasks { task.cancel() }
    }

    /// Waits, at most `limit`, until the server has acknowledged everything sent on the control
    /// stream. A closing connection sends nothing but CONNECTION_CLOSE, so a `leave` (or the
    /// `floorRelease` before a suspend) lost on the way would be lost for good: the server would take
    /// the close for a dropped connection and keep the member, and its push token, in the channel.
    /// Returns at once when nothing waits or the connection is no longer up.
    static func waitUntilControlAcknowledged(_ client: WireClientChannel, atMost limit: Duration) async {
        let deadline = ContinuousClock.now + limit
        while ContinuousClock.now < deadline, !Task.isCancelled {
            let waiting = (try? await client.withClient { client -> Bool in
                guard let connection = client?.connection, connection.state == .established else { return false }
                return connection.controlSendSpace < connection.controlSendLimit
            }) ?? false
            guard waiting else { return }
            try? await Task.sleep(for: .milliseconds(10))
        }
    }

    static func describeSetup(_ error: any Error, _ credentials: ChannelCredentials) -> String {
        "can't reach \(credentials.address): \(error); check the server address"
    }

    /// Why no client could be made, in words: the CA file, or the address.
    struct SetupProblem: Error { var message: String }

    /// A client for the server `credentials` name, not yet connected: the session's, or an owed
    /// leave's. Fails with what to fix: a CA file that can't be used, an address that doesn't resolve.
    static func makeClient(_ credentials: ChannelCredentials, connection: ConnectionConfiguration, pass: HomePass? = nil,
                           onDatagram: @escaping WireClientChannel.DatagramHandler) throws(SetupProblem) -> WireClientChannel {
        let validator = try loadCA(credentials.caPath)
        do {
            var clientConfiguration = ClientConfiguration(serverName: credentials.serverName ?? credentials.host, validator: validator)
            clientConfiguration.connection = connection
            clientConfiguration.entryPass = pass.map { EntryPass(ticket: Array($0.ticket), key: Array($0.key)) }
            let address = try SocketAddress.makeAddressResolvingHost(credentials.host, port: credentials.port)
            return try WireClientChannel(configuration: clientConfiguration, server: address, onDatagram: onDatagram)
        } catch {
            throw SetupProblem(message: describeSetup(error, credentials))
        }
    }

    /// The CA certificates in `path`, or what is wrong with the file in words: missing, a directory,
    /// not readable, not text, or text without a certificate.
    static func loadCA(_ path: String) throws(SetupProblem) -> CertificateValidator {
        let advice = "pass the CA that signed the server's certificate (certs/ca.pem in development)"
        let pem: String
        do throws(PEMText.Problem) { pem = try PEMText.read(path) } catch {
            switch error {
            case .missing: throw SetupProblem(message: "the CA file \(path) does not exist; \(advice)")
            case .directory: throw SetupProblem(message: "the CA file \(path) is a directory; \(advice)")
            case .unreadable: throw SetupProblem(message: "can't read the CA file \(path) (check its permissions); \(advice)")
            case .notText: throw SetupProblem(message: "the CA file \(path) is not a PEM certificate (it isn't text); \(advice)")
            }
        }
        do { return try CertificateValidator(caPEM: pem) } catch {
            throw SetupProblem(message: "the CA file \(path) holds no readable CA certificate (\(error)); \(advice)")
        }
    }

    /// squelchd closed saying it is going away: it is shutting down (SIGTERM, a restart, an upgrade).
    static func isGoingAway(_ error: ConnectionError) -> Bool {
        if case .peer(let code, _, true) = error { return code == CloseCode.goingAway.rawValue }
        return false
    }

    static func describe(_ error: any Error, _ credentials: ChannelCredentials) -> String {
        let server = credentials.address
        if let error = error as? ConnectionError {
            if isGoingAway(error), case .peer(_, let reason, _) = error {
                return "squelchd at \(server) is going away (\(reason.isEmpty ? "shutting down" : reason)): a restart or an upgrade, most likely; reconnecting on its own once it is back"
            }
            switch error {
            case .handshakeTimeout:
                return "no answer from squelchd at \(server); check that it runs and the address and port are right"
            default:
                return "connection to \(server) failed: \(error.description)"
            }
        }
        return "connection to \(server) failed: \(error)"
    }
}

/// Which media keys this session's receiver and transmitter hold (docs/protocol.md §16.4.5): each
/// `joined` starts a session whose keys are numbered afresh; a key of the member's own burst also
/// goes to the transmitter.
struct SessionKeys {
    let receiver: Receiver
    let transmitter: Transmitter
    var you: UInt16?

    init(receiver: Receiver, transmitter: Transmitter) {
        self.receiver = receiver
        self.transmitter = transmitter
    }

    mutating func take(_ message: ServerMessage) {
        switch message {
        case .joined(_, let slot, _, _, _):
            you = slot
            receiver.forgetMediaKeys()
            transmitter.forgetKeys()
        case .mediaKey(let key):
            receiver.addMediaKey(key)
            if key.slot == you { transmitter.addKey(key) }
        default:
            break
        }
    }
}
