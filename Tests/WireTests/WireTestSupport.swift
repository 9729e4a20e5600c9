import Crypto
import Foundation
import SeededRandom
import SwiftASN1
import X509
@testable import Wire
@_exported import WireTesting

/// A seeded in-memory network between clients and one server endpoint: loss, duplication,
/// reordering (random extra delay), base delay and NAT rebinding, all decided by the seed.
final class SimulatedNetwork {
    struct Conditions {
        var loss = 0.0
        var duplicate = 0.0
        var reorder = 0.0
        var delay: UInt64 = ms(20)
        var jitter: UInt64 = ms(30)
    }
    struct InFlight { var at: WireInstant; var order: Int; var from: PathAddress; var to: PathAddress; var bytes: [UInt8] }

    var random: SplitMix64
    var conditions: Conditions
    var now = WireInstant(nanoseconds: seconds(1000))
    var queue: [InFlight] = []
    var order = 0
    var sent = 0
    var dropped = 0
    /// Drops everything sent by this address while set (tests of a blocked return path).
    var blackhole: Set<PathAddress> = []

    init(seed: UInt64, conditions: Conditions = Conditions()) {
        random = SplitMix64(seed: seed)
        self.conditions = conditions
    }

    func send(_ bytes: [UInt8], from: PathAddress, to: PathAddress) {
        sent += 1
        if blackhole.contains(from) || random.unitInterval() < conditions.loss { dropped += 1; return }
        let copies = random.unitInterval() < conditions.duplicate ? 2 : 1
        for _ in 0..<copies {
            var delay = conditions.delay
            if random.unitInterval() < conditions.reorder { delay += random.next() % max(conditions.jitter, 1) }
            order += 1
            queue.append(InFlight(at: now + delay, order: order, from: from, to: to, bytes: bytes))
        }
    }

    var nextArrival: WireInstant? { queue.min { ($0.at, $0.order) < ($1.at, $1.order) }?.at }

    /// Removes and returns every datagram due by `now`, in arrival order.
    func due() -> [InFlight] {
        let ready = queue.filter { $0.at <= now }.sorted { ($0.at, $0.order) < ($1.at, $1.order) }
        queue.removeAll { $0.at <= now }
        return ready
    }
}

/// Drives one endpoint and several clients over a `SimulatedNetwork`, collecting their events.
final class Simulation {
    let network: SimulatedNetwork
    var endpoint: Endpoint
    var clients: [WireClient] = []
    var clientAddresses: [PathAddress] = []
    let serverAddress = PathAddress.v4(10, 0, 0, 1, port: 4433)
    var serverEvents: [(Endpoint.Handle, ConnectionEvent)] = []
    var clientEvents: [[ClientEvent]] = []
    var serverDatagrams: [(Endpoint.Handle, [UInt8])] = []
    var clientDatagrams: [[[UInt8]]] = []
    var trace: [String] = []
    var buffer = [UInt8](repeating: 0, count: 2048)
    let validator: CertificateValidator
    /// Bytes the server sent to each address (amplification checks).
    var serverBytesTo: [PathAddress: Int] = [:]
    var onServerEvent: ((Endpoint.Handle, ConnectionEvent) -> Void)?

    init(seed: UInt64, conditions: SimulatedNetwork.Conditions = .init(), pki: TestPKI, secrets: ServerSecrets,
         configuration: EndpointConfiguration = EndpointConfiguration()) {
        network = SimulatedNetwork(seed: seed, conditions: conditions)
        validator = pki.validator
        endpoint = Endpoint(secrets: secrets, configuration: configuration, random: SplitMix64(seed: seed &* 31 &+ 7),
                            forkRandom: { SplitMix64(seed: $0.next()) })
    }

    @discardableResult
    func addClient(serverName: String = "localhost", connection: ConnectionConfiguration = .client, port: UInt16? = nil,
                   address given: PathAddress? = nil, entryPass: EntryPass? = nil) -> Int {
        let index = clients.count
        let address = given ?? PathAddress.v4(192, 168, 1, UInt8(10 + index), port: port ?? UInt16(50_000 + index))
        let configuration = ClientConfiguration(serverName: serverName, validator: validator, connection: connection, entryPass: entryPass)
        clients.append(WireClient(configuration: configuration, remote: serverAddress, now: network.now,
                                  random: SplitMix64(seed: network.random.next())))
        clientAddresses.append(address)
        clientEvents.append([])
        clientDatagrams.append([])
        return index
    }

    /// Sends everything every side has to send.
    func flush() {
        var progressed = true
        var rounds = 0
        while progressed {
            rounds += 1
            precondition(rounds < 1000, "flush never finishes: \(network.sent) datagrams sent")
            progressed = false
            while let transmit = buffer.withUnsafeMutableBytes({ endpoint.poll(into: $0, now: network.now) }) {
                serverBytesTo[transmit.address, default: 0] += transmit.count
                network.send(Array(buffer[..<transmit.count]), from: serverAddress, to: transmit.address)
                progressed = true
                precondition(network.sent < 100_000, "server sends without end")
            }
            for (index, client) in clients.enumerated() {
                while let transmit = buffer.withUnsafeMutableBytes({ client.poll(into: $0, now: network.now) }) {
                    network.send(Array(buffer[..<transmit.count]), from: clientAddresses[index], to: transmit.address)
                    progressed = true
                    precondition(network.sent < 100_000, "client sends without end")
                }
            }
        }
    }

    func collectEvents() {
        while let (handle, event) = endpoint.nextEvent() {
            serverEvents.append((handle, event))
            trace.append("\(network.now.nanoseconds) S\(handle) \(event)")
            onServerEvent?(handle, event)
        }
        for (index, client) in clients.enumerated() {
            while let event = client.nextEvent() {
                clientEvents[index].append(event)
                // Tokens are AES-GCM with a random nonce: record only that one arrived.
                let described = if case .connection(.newToken(let t)) = event { "newToken(\(t.count) bytes)" } else { "\(event)" }
                trace.append("\(network.now.nanoseconds) C\(index) \(described)")
            }
        }
    }

    /// Certificate checks are async in swift-certificates; the simulation awaits them in place,
    /// taking no simulated time.
    func runCertificateChecks() async {
        for client in clients {
            if let check = client.connection.pendingCertificateCheck {
                let result = await client.configuration.validator.validate(check)
                client.completeCertificateCheck(result, now: network.now)
            }
        }
    }

    /// Runs until `done` holds or `limit` of simulated time passes. Returns whether `done` held.
    @discardableResult
    func run(for limit: UInt64, until done: () -> Bool = { false }) async -> Bool {
        let end = network.now + limit
        var spins = 0
        var lastNow = network.now
        while true {
            if network.now == lastNow { spins += 1 } else { spins = 0; lastNow = network.now }
            precondition(spins < 10_000, "simulation stuck at \(network.now): deadlines \(String(describing: endpoint.nextDeadline)) \(clients.map { String(describing: $0.nextDeadline) })")
            await runCertificateChecks()
            flush()
            collectEvents()
            if done() { return true }
            var next = network.nextArrival
            for t in [endpoint.nextDeadline] + clients.map(\.nextDeadline) {
                if let t, next.map({ t < $0 }) ?? true { next = t }
            }
            guard let step = next, step <= end else { network.now = end; return done() }
            network.now = max(network.now, step)
            for datagram in network.due() {
                var bytes = datagram.bytes
                if datagram.to == serverAddress {
                    bytes.withUnsafeMutableBytes { raw in
                        endpoint.receive(raw, from: datagram.from, now: network.now) { handle, payload in
                            serverDatagrams.append((handle, Array(payload)))
                        }
                    }
                } else if let index = clientAddresses.firstIndex(of: datagram.to) {
                    bytes.withUnsafeMutableBytes { raw in
                        clients[index].receive(raw, from: datagram.from, now: network.now) { payload in
                            clientDatagrams[index].append(Array(payload))
                        }
                    }
                }
            }
            endpoint.handleTimeout(now: network.now)
            for client in clients { client.handleTimeout(now: network.now) }
        }
    }

    func connected(_ index: Int) -> Bool { clients[index].connection.state == .established }

    func controlMessages(client index: Int) -> [[UInt8]] {
        clientEvents[index].compactMap { if case .connection(.control(let m)) = $0 { return m } else { return nil } }
    }

    func serverControlMessages(_ handle: Endpoint.Handle) -> [[UInt8]] {
        serverEvents.compactMap { if $0.0 == handle, case .control(let m) = $0.1 { return m } else { return nil } }
    }

    func serverHandle(of client: Int) -> Endpoint.Handle? {
        let local = clients[client].connection.localID
        return endpoint.handles.first { endpoint.connection($0)?.peerID == local }
    }

    func sendDatagram(client index: Int, _ payload: [UInt8]) {
        let transmit = payload.withUnsafeBytes { p in buffer.withUnsafeMutableBytes { clients[index].sendDatagram(p, into: $0, now: network.now) } }
        if let transmit { network.send(Array(buffer[..<transmit.count]), from: clientAddresses[index], to: transmit.address) }
    }

    func sendDatagram(server handle: Endpoint.Handle, _ payload: [UInt8], enveloped: Bool = false) -> Bool {
        let transmit = payload.withUnsafeBytes { p in
            buffer.withUnsafeMutableBytes {
                enveloped ? endpoint.sendEnvelope(p, to: handle, into: $0, now: network.now)
                          : endpoint.sendDatagram(p, to: handle, into: $0, now: network.now)
            }
        }
        guard let transmit else { return false }
        serverBytesTo[transmit.address, default: 0] += transmit.count
        network.send(Array(buffer[..<transmit.count]), from: serverAddress, to: transmit.address)
        return true
    }
}
