import ArgumentParser
import Audio
import Crypto
import Foundation
import Wire
import WireNIO
import WireTesting

/// The transport's costs on one core: handshakes per second, sealing and opening a 100-byte
/// packet, and the whole send and receive paths of a connection.
struct Transport: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Wire: handshakes per second, seal/open ns per 100-byte packet, send/receive path cost.")

    @Option(help: "Handshakes to run.")
    var handshakes = 2_000

    @Option(help: "Packets per seal/open measurement.")
    var packets = 1_000_000

    @Option(help: "Connections in the in-memory fan-out measurement.")
    var fanout = 200

    @Flag(help: "Only the in-memory fan-out measurement (for A/B runs of the relay's user-space path).")
    var fanoutOnly = false

    @Option(help: "Milliseconds between talker packets in the in-memory fan-out (the relay's are 20 ms apart; 0 runs them back to back, with every connection's state still in the caches).")
    var gap = 0

    @Option(help: "Only run N packets through client send and server receive, for an allocation count (heaptrack): compare two values of N.")
    var allocationProbe: Int?

    func validate() throws {
        guard handshakes >= 10, packets >= 1_000 else { throw ValidationError("--handshakes ≥ 10 and --packets ≥ 1000") }
        guard (1...40_000).contains(fanout) else { throw ValidationError("--fanout takes 1 to 40000 connections") }
        guard (0...1_000).contains(gap) else { throw ValidationError("--gap takes 0 to 1000 milliseconds") }
    }

    func run() async throws {
        let pki = try BenchPKI()
        if let n = allocationProbe {
            let (client, endpoint, _) = try await connectedPair(pki: pki)
            let payload = [UInt8](repeating: 0x33, count: 100)
            var buffer = [UInt8](repeating: 0, count: 1500)
            let now = WireInstant(nanoseconds: monotonicNanoseconds())
            let from = PathAddress(ipv4: 0x7F00_0001, port: 50_000)
            var delivered = 0
            payload.withUnsafeBytes { p in
                buffer.withUnsafeMutableBytes { b in
                    for _ in 0..<n {
                        guard let t = client.sendDatagram(p, into: b, now: now) else { continue }
                        endpoint.receive(UnsafeMutableRawBufferPointer(rebasing: b[..<t.count]), from: from, now: now) { _, _ in delivered += 1 }
                    }
                }
            }
            print("allocation probe: \(delivered) packets sealed by the client and opened by the server")
            return
        }
        if fanoutOnly {
            try await fanoutPath(pki: pki)
            return
        }
        try sealAndOpen()
        try await handshakeRate(pki: pki)
        try await connectionPaths(pki: pki)
        try await fanoutPath(pki: pki)
        try await loopback(pki: pki)
    }

    /// The server's user-space share of the relay, without the kernel: one endpoint with `fanout`
    /// established connections seals each talker packet for every one of them in turn, as the relay
    /// does, and takes in the listeners' ACKs (one per ten packets). Unlike `connectionPaths`, each
    /// connection's state and keys have gone cold in the caches by the time its next copy comes,
    /// which is what the relay pays. Only the server's calls are timed.
    func fanoutPath(pki: BenchPKI) async throws {
        var configuration = EndpointConfiguration()
        configuration.handshakesPerSecondPerAddress = .max
        configuration.maxConnectionsPerAddress = .max
        // The bench admits nobody: it measures the transport alone, not the join budget.
        configuration.maxUnadmittedPerAddress = .max
        configuration.maxUnadmitted = .max
        configuration.retryThreshold = .max
        let endpoint = Endpoint(secrets: ServerSecrets(identity: pki.identity, resetKey: SymmetricKey(size: .bits256)),
                                configuration: configuration)
        var clients: [(Connection, PathAddress, Endpoint.Handle)] = []
        for index in 0 ..< fanout {
            let from = PathAddress(ipv4: 0x7F00_0001, port: UInt16(20_000 + index))
            let client = try await connect(to: endpoint, from: from, pki: pki)
            var handle: Endpoint.Handle?
            while let (connected, event) = endpoint.nextEvent() { if case .connected = event { handle = connected } }
            guard let handle else { throw ValidationError("in-memory handshake \(index) left no connection") }
            clients.append((client, from, handle))
        }
        let payload = [UInt8](repeating: 0x33, count: 88)
        let server = PathAddress(ipv4: 0x7F00_0001, port: 4433)
        // Each round's copies are kept (outside the timed part) so the clients can open them and ACK.
        var copies = [[UInt8]](repeating: [UInt8](repeating: 0, count: 1500), count: fanout)
        var envelopeBuffer = [UInt8](repeating: 0, count: 1500)
        var counts = [Int](repeating: 0, count: fanout)
        var buffer = [UInt8](repeating: 0, count: 1500)
        let rounds = max(50, min(2_000, packets / fanout))
        var now = WireInstant(nanoseconds: monotonicNanoseconds())
        var sendNanoseconds: UInt64 = 0
        var envelopeNanoseconds: UInt64 = 0
        var ackNanoseconds: UInt64 = 0
        var acks = 0
        for _ in 0 ..< rounds {
            now = now + 20_000_000
            if gap > 0 { try await Task.sleep(for: .milliseconds(gap)) }
            // The relay's path since frames are sealed once (decision 0047): an envelope per listener,
            // nothing sealed. First, so that it meets the connections as cold as the relay does.
            let t2 = monotonicNanoseconds()
            var enveloped = 0
            payload.withUnsafeBytes { p in
                for index in 0 ..< fanout {
                    enveloped += envelopeBuffer.withUnsafeMutableBytes { endpoint.sendEnvelope(p, to: clients[index].2, into: $0, now: now) } == nil ? 0 : 1
                }
            }
            envelopeNanoseconds += monotonicNanoseconds() - t2
            guard enveloped == fanout else { throw ValidationError("the endpoint refused \(fanout - enveloped) envelopes") }
            let t0 = monotonicNanoseconds()
            payload.withUnsafeBytes { p in
                for index in 0 ..< fanout {
                    counts[index] = copies[index].withUnsafeMutableBytes { endpoint.sendDatagram(p, to: clients[index].2, into: $0, now: now)?.count ?? -1 }
                }
            }
            sendNanoseconds += monotonicNanoseconds() - t0
            if let refused = counts.firstIndex(of: -1) { throw ValidationError("the endpoint refused a copy for connection \(refused)") }
            for index in 0 ..< fanout {
                let (client, from, _) = clients[index]
                copies[index].withUnsafeMutableBytes { client.receive(UnsafeMutableRawBufferPointer(rebasing: $0[..<counts[index]]), from: server, now: now) }
                while let t = buffer.withUnsafeMutableBytes({ client.poll(into: $0, now: now) }) {
                    let t1 = monotonicNanoseconds()
                    buffer.withUnsafeMutableBytes { endpoint.receive(UnsafeMutableRawBufferPointer(rebasing: $0[..<t.count]), from: from, now: now) }
                    while buffer.withUnsafeMutableBytes({ endpoint.poll(into: $0, now: now) }) != nil {}
                    ackNanoseconds += monotonicNanoseconds() - t1
                    acks += 1
                }
                while client.nextEvent() != nil {}
            }
        }
        let copiesSent = Double(rounds * fanout)
        print("transport: the relay's user-space path in memory, \(fanout) listeners, 88-byte datagram payload, \(rounds) talker packets (no sockets), "
              + (gap > 0 ? "\(gap) ms apart" : "back to back"))
        print("| part | ns per forwarded copy |")
        print("|---|---|")
        print(String(format: "| sealing the copies (Endpoint.sendDatagram, round robin over %d connections) | %.0f |", fanout, Double(sendNanoseconds) / copiesSent))
        print(String(format: "| enveloping the copies, as the relay does (Endpoint.sendEnvelope) | %.0f |", Double(envelopeNanoseconds) / copiesSent))
        print(String(format: "| the listeners' ACKs (%d, receive and poll) | %.0f |", acks, Double(ackNanoseconds) / copiesSent))
        print(String(format: "| total of the sealed path (sealing and ACKs) | %.0f |", Double(sendNanoseconds + ackNanoseconds) / copiesSent))
    }

    /// Runs the in-memory handshake of a new client from `from` with `endpoint`.
    func connect(to endpoint: Endpoint, from: PathAddress, pki: BenchPKI) async throws -> Connection {
        let now = WireInstant(nanoseconds: monotonicNanoseconds())
        let client = Connection(client: ClientConfiguration(serverName: "localhost", validator: pki.validator),
                                remote: PathAddress(ipv4: 0x7F00_0001, port: 4433), now: now)
        var buffer = [UInt8](repeating: 0, count: 1500)
        for _ in 0..<10 {
            while let t = buffer.withUnsafeMutableBytes({ client.poll(into: $0, now: now) }) {
                buffer.withUnsafeMutableBytes { endpoint.receive(UnsafeMutableRawBufferPointer(rebasing: $0[..<t.count]), from: from, now: now) }
            }
            while let t = buffer.withUnsafeMutableBytes({ endpoint.poll(into: $0, now: now) }) {
                var reply = Array(buffer[..<t.count])
                reply.withUnsafeMutableBytes { client.receive($0, from: PathAddress(ipv4: 0x7F00_0001, port: 4433), now: now) }
            }
            if let check = client.pendingCertificateCheck {
                client.completeCertificateCheck(await pki.validator.validate(check), now: now)
            }
        }
        guard client.state == .established else { throw ValidationError("in-memory handshake failed") }
        return client
    }

    /// Real UDP on 127.0.0.1 through WireNIO: vectored reads, one flush per burst, both directions.
    func loopback(pki: BenchPKI) async throws {
        let secrets = ServerSecrets(identity: pki.identity, resetKey: SymmetricKey(size: .bits256))
        let count = min(packets, 300_000)
        let result = try await WireBenchmark.loopback(secrets: secrets,
                                                      client: ClientConfiguration(serverName: "localhost", validator: pki.validator),
                                                      count: count)
        print("transport: WireNIO on loopback, \(count) datagrams of 100 bytes each way, sent flat out (client and server each on their own event loop)")
        print("| direction | sent | delivered | delivered packets/s |")
        print("|---|---|---|---|")
        for (name, t) in [("client to server", result.uplink), ("server to client", result.downlink)] {
            print(String(format: "| %@ | %d | %d | %.0f |", name, t.sent, t.delivered, t.deliveredPerSecond))
        }
    }

    func sealAndOpen() throws {
        print("transport: seal and open in place, 100-byte payload with an 11-byte short header, header protection included")
        print("| suite | seal ns | open ns |")
        print("|---|---|---|")
        for suite in CipherSuite.allCases {
            let secret = [UInt8](repeating: 7, count: 32)
            let sealer = try PacketKey(secret: secret, suite: suite, sealing: true)
            let opener = try PacketKey(secret: secret, suite: suite, sealing: false)
            var packet = [UInt8](repeating: 0x5A, count: 11 + 100 + 16)
            let n = packets
            var sealed: [UInt8] = []
            let tSeal = try packet.withUnsafeMutableBytes { raw in
                try time {
                    for pn in 0..<UInt64(n) {
                        try sealer.seal(raw, payloadStart: 11, payloadEnd: 111, packetNumber: pn)
                        if let mask = sealer.headerMask(UnsafeRawBufferPointer(raw), sampleOffset: 13) { raw[0] ^= UInt8(truncatingIfNeeded: mask >> 56) & 0x1F }
                    }
                }
            }
            // Open the same sealed packet repeatedly: restore it each time (a memcpy of 127 bytes).
            try packet.withUnsafeMutableBytes { raw in
                for i in 0..<11 { raw[i] = 0x5A }
                try sealer.seal(raw, payloadStart: 11, payloadEnd: 111, packetNumber: 1)
                sealed = Array(raw)
            }
            var failures = 0
            let tOpen = sealed.withUnsafeBytes { original in
                packet.withUnsafeMutableBytes { raw in
                    time {
                        for _ in 0..<n {
                            raw.copyMemory(from: original)
                            _ = opener.headerMask(UnsafeRawBufferPointer(raw), sampleOffset: 13)
                            if !opener.open(raw, payloadStart: 11, tagStart: 111, packetNumber: 1) { failures += 1 }
                        }
                    }
                }
            }
            precondition(failures == 0, "open failed")
            print(String(format: "| %@ | %.0f | %.0f |", "\(suite)", tSeal / Double(n) * 1e9, tOpen / Double(n) * 1e9))
        }
    }

    func handshakeRate(pki: BenchPKI) async throws {
        let secrets = ServerSecrets(identity: pki.identity, resetKey: SymmetricKey(size: .bits256))
        var configuration = EndpointConfiguration()
        configuration.handshakesPerSecondPerAddress = .max
        configuration.maxConnectionsPerAddress = .max
        // The bench admits nobody: it measures the transport alone, not the join budget.
        configuration.maxUnadmittedPerAddress = .max
        configuration.maxUnadmitted = .max
        configuration.retryThreshold = .max
        let endpoint = Endpoint(secrets: secrets, configuration: configuration)
        var serverNanoseconds: UInt64 = 0
        var clientNanoseconds: UInt64 = 0
        var buffer = [UInt8](repeating: 0, count: 1500)
        let start = monotonicNanoseconds()
        for i in 0..<handshakes {
            let address = PathAddress(ipv4: 0x0A00_0000 | UInt32(i & 0xFFFF), port: UInt16(truncatingIfNeeded: 1024 + i))
            let now = WireInstant(nanoseconds: monotonicNanoseconds())
            var t0 = monotonicNanoseconds()
            let client = Connection(client: ClientConfiguration(serverName: "localhost", validator: pki.validator),
                                    remote: PathAddress(ipv4: 0x7F00_0001, port: 4433), now: now)
            clientNanoseconds += monotonicNanoseconds() - t0
            var rounds = 0
            while client.state != .established || endpoint.connectionCount == 0 || !client.handshakeConfirmed {
                rounds += 1
                precondition(rounds < 20, "handshake did not complete")
                t0 = monotonicNanoseconds()
                while let t = buffer.withUnsafeMutableBytes({ client.poll(into: $0, now: now) }) {
                    clientNanoseconds += monotonicNanoseconds() - t0
                    t0 = monotonicNanoseconds()
                    buffer.withUnsafeMutableBytes { endpoint.receive(UnsafeMutableRawBufferPointer(rebasing: $0[..<t.count]), from: address, now: now) }
                    serverNanoseconds += monotonicNanoseconds() - t0
                    t0 = monotonicNanoseconds()
                }
                t0 = monotonicNanoseconds()
                var replies: [[UInt8]] = []
                while let t = buffer.withUnsafeMutableBytes({ endpoint.poll(into: $0, now: now) }) { replies.append(Array(buffer[..<t.count])) }
                serverNanoseconds += monotonicNanoseconds() - t0
                t0 = monotonicNanoseconds()
                for var reply in replies {
                    reply.withUnsafeMutableBytes { client.receive($0, from: PathAddress(ipv4: 0x7F00_0001, port: 4433), now: now) }
                }
                if let check = client.pendingCertificateCheck {
                    let result = await pki.validator.validate(check)
                    client.completeCertificateCheck(result, now: now)
                }
                clientNanoseconds += monotonicNanoseconds() - t0
            }
            // Free the server's session so the table stays small.
            while let _ = endpoint.nextEvent() {}
            for handle in endpoint.handles { endpoint.close(handle, now: now) }
            endpoint.handleTimeout(now: now + 10_000_000_000)
            while buffer.withUnsafeMutableBytes({ endpoint.poll(into: $0, now: now) }) != nil {}
        }
        let total = Double(monotonicNanoseconds() - start) / 1e9
        let n = Double(handshakes)
        print("transport: \(handshakes) full handshakes (X25519 both sides, ECDSA P-256 sign and verify, X.509 chain validation)")
        print("| measurement | per handshake | handshakes/s on one core |")
        print("|---|---|---|")
        print(String(format: "| server side only | %.0f µs | %.0f |", Double(serverNanoseconds) / n / 1e3, n / (Double(serverNanoseconds) / 1e9)))
        print(String(format: "| client side only | %.0f µs | %.0f |", Double(clientNanoseconds) / n / 1e3, n / (Double(clientNanoseconds) / 1e9)))
        print(String(format: "| both, one core | %.0f µs | %.0f |", total / n * 1e6, n / total))
    }

    func connectionPaths(pki: BenchPKI) async throws {
        let (client, endpoint, handle) = try await connectedPair(pki: pki)
        let payload = [UInt8](repeating: 0x33, count: 100)
        var buffer = [UInt8](repeating: 0, count: 1500)
        var sent: [[UInt8]] = []
        let n = min(packets, 200_000)
        var now = WireInstant(nanoseconds: monotonicNanoseconds())
        // Server → client fan-out path: seal a datagram for one listener.
        let tSend = payload.withUnsafeBytes { p in
            buffer.withUnsafeMutableBytes { b in
                time { for _ in 0..<n { _ = endpoint.sendDatagram(p, to: handle, into: b, now: now) } }
            }
        }
        // Client → server receive path: open, replay check, frame parse, delivery.
        for _ in 0..<n {
            let t = payload.withUnsafeBytes { p in buffer.withUnsafeMutableBytes { client.sendDatagram(p, into: $0, now: now) } }
            sent.append(Array(buffer[..<t!.count]))
        }
        var delivered = 0
        let from = PathAddress(ipv4: 0x7F00_0001, port: 50_000)
        now = now + 1
        let tReceive = time {
            for i in sent.indices {
                sent[i].withUnsafeMutableBytes { endpoint.receive($0, from: from, now: now) { _, _ in delivered += 1 } }
            }
        }
        precondition(delivered == n, "delivered \(delivered) of \(n)")
        print("transport: a connection's data path, 100-byte audio payload (header, ACK bookkeeping, seal, header protection)")
        print("| path | ns per packet |")
        print("|---|---|")
        print(String(format: "| Endpoint.sendDatagram (server to one listener) | %.0f |", tSend / Double(n) * 1e9))
        print(String(format: "| Endpoint.receive (open, replay check, deliver) | %.0f |", tReceive / Double(n) * 1e9))
    }

    func connectedPair(pki: BenchPKI) async throws -> (Connection, Endpoint, Endpoint.Handle) {
        let endpoint = Endpoint(secrets: ServerSecrets(identity: pki.identity, resetKey: SymmetricKey(size: .bits256)))
        let client = try await connect(to: endpoint, from: PathAddress(ipv4: 0x7F00_0001, port: 50_000), pki: pki)
        guard let handle = endpoint.handles.first else { throw ValidationError("in-memory handshake failed") }
        return (client, endpoint, handle)
    }
}

/// A CA and server identity made in memory (WireTesting's), so the benchmark needs no files.
struct BenchPKI {
    let identity: ServerIdentity
    let validator: CertificateValidator

    init() throws {
        let pki = try TestPKI(name: "squelch-bench CA")
        identity = try pki.identity(names: ["localhost"])
        validator = pki.validator
    }
}
