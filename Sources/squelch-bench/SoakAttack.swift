import ArgumentParser
import ChannelProtocol
import Foundation
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import SquelchTesting
import Wire
import WireNIO

/// The attacker of `squelch-bench soak`, in a process of its own (its CPU is not the server's):
/// everything issue 42 defends against, at the highest rates the server's default limits allow, each
/// from loopback sources of its own (127.66–69.x.x), never from the real members' addresses.
/// - handshake flood: per source, as many handshakes a second as the limit lets through, never
///   joining (each client stays until the server evicts it or 15 s pass);
/// - an insider with a real token cycling mute and floor request/release at the control-message rate;
/// - the reflector: real ClientHello Initials sent again and again, and cut short under 1,200 bytes,
///   counting the bytes the server sends back against those sent;
/// - garbage datagrams (random, and shaped like long- and short-header packets);
/// - malformed admin requests on new TCP connections.
/// It prints one line of JSON with what it did and what came back.
struct SoakAttack: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "soak-attack", abstract: "The soak's attacker process (squelch-bench soak starts it).", shouldDisplay: false)

    @Option(help: "squelchd's voice port.") var port: Int
    @Option(help: "squelchd's admin port.") var adminPort: Int
    @Option(help: "A participant token for the insider (talk only).") var tokenFile: String
    @Option(help: "The insider's channel.") var channel: String
    @Option(help: "Directory with ca.pem.") var certs = "certs"
    @Option(help: "How long to attack.") var seconds: Double
    @Option(help: "Sources for the handshake flood.") var sources = 12
    @Option(help: "Handshakes a second per source (the server's handshakesPerSecondPerAddress).") var handshakeRate = 20
    @Option(help: "The insider's control messages a second (the server's controlMessagesPerSecond).") var controlRate = 20
    @Option(help: "Garbage datagrams a second.") var garbageRate = 500
    @Option(help: "Malformed admin requests a second.") var adminRate = 20

    func run() async throws {
        guard let channel = UUID(uuidString: channel) else { throw ValidationError("--channel must be a UUID") }
        let token = try String(contentsOfFile: tokenFile, encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)
        let ca = try String(contentsOfFile: certs + "/ca.pem", encoding: .utf8)
        let client = ClientConfiguration(serverName: "localhost", validator: try CertificateValidator(caPEM: ca))
        let server = try SocketAddress(ipAddress: "127.0.0.1", port: port)
        let tally = AttackTally()
        let deadline = ContinuousClock.now + .seconds(seconds)
        await withTaskGroup(of: Void.self) { vectors in
            for source in 0 ..< sources {
                vectors.addTask { await handshakeFlood(from: "127.66.0.\(source + 1)", to: server, client: client, until: deadline, tally) }
            }
            vectors.addTask { await insider(token: token, channel: channel, client: client, until: deadline, tally) }
            vectors.addTask { await reflector(to: server, client: client, until: deadline, tally) }
            vectors.addTask { await garbage(to: server, until: deadline, tally) }
            vectors.addTask { await malformedAdmin(until: deadline, tally) }
        }
        let data = try JSONSerialization.data(withJSONObject: tally.counts, options: [.sortedKeys])
        print("soak-attack: " + String(decoding: data, as: UTF8.self))
    }

    /// Ticks at `rate` a second until the deadline, each in a task of its own so that a slow one
    /// never lowers the rate.
    func every(_ rate: Int, until deadline: ContinuousClock.Instant, _ body: @escaping @Sendable (Int) async -> Void) async {
        let interval = Duration.seconds(1) / max(1, rate)
        await withDiscardingTaskGroup { ticks in
            var next = ContinuousClock.now, index = 0
            while next < deadline {
                let at = index
                ticks.addTask { await body(at) }
                index += 1
                next += interval
                try? await Task.sleep(until: next)
            }
        }
    }

    func handshakeFlood(from source: String, to server: SocketAddress, client: ClientConfiguration,
                        until deadline: ContinuousClock.Instant, _ tally: AttackTally) async {
        var options = UDPOptions()
        options.localHost = source
        options.vectorReadMessageCount = 1  // thousands of these live at once: small buffers
        options.receiveBufferSize = 64 << 10
        options.sendBufferSize = 64 << 10
        let flood = options
        await every(handshakeRate, until: deadline) { _ in
            guard let connection = try? WireClientChannel(configuration: client, server: server, options: flood) else {
                tally.add("handshake_socket_errors"); return
            }
            do {
                try await connection.connect()
                tally.add("handshakes_completed")
                try? await Task.sleep(for: .seconds(15))
            } catch {
                tally.add("handshakes_failed")
            }
            await connection.close()
        }
    }

    func insider(token: String, channel: UUID, client: ClientConfiguration, until deadline: ContinuousClock.Instant,
                 _ tally: AttackTally) async {
        let cycle: [ClientMessage] = [.setMuted(true), .floorRequest(), .setMuted(false), .floorRelease]
        while ContinuousClock.now < deadline {
            var options = UDPOptions()
            options.localHost = "127.67.0.1"
            guard let member = try? TestMember(port: port, configuration: client, options: options, keepsAudio: false) else { return }
            do {
                try await member.connect()
                guard case .joined? = try await member.join(token: token, channel: channel) else {
                    tally.add("insider_refused"); await member.close(); try? await Task.sleep(for: .seconds(1)); continue
                }
                tally.add("insider_joins")
                let interval = Duration.seconds(1) / max(1, controlRate)
                var index = 0
                while ContinuousClock.now < deadline {
                    try await member.send(cycle[index % cycle.count])
                    tally.add("insider_messages")
                    index += 1
                    try await Task.sleep(for: interval)
                }
            } catch {
                tally.add("insider_lost")  // closed by the server, or the send failed: join again
            }
            await member.close()
        }
    }

    func reflector(to server: SocketAddress, client: ClientConfiguration, until deadline: ContinuousClock.Instant,
                   _ tally: AttackTally) async {
        guard let socket = try? await RawUDP.bind("127.68.0.1", counting: "reflector_bytes_received", tally),
              let remote = PathAddress(server) else { return }
        await every(10, until: deadline) { _ in
            // A new connection's ClientHello, then exactly the same datagram five times (what a
            // retransmission looks like) and five copies cut short, under 1,200 bytes.
            var buffer = [UInt8](repeating: 0, count: 1_500)
            let hello = Connection(client: client, remote: remote, now: WireNIO.now())
            guard let first = buffer.withUnsafeMutableBytes({ hello.poll(into: $0, now: WireNIO.now()) }) else { return }
            let datagram = Array(buffer[..<first.count])
            for _ in 0 ..< 6 { socket.send(datagram, to: server); tally.add("reflector_bytes_sent", datagram.count) }
            for _ in 0 ..< 5 {
                let cut = Array(datagram[..<300])
                socket.send(cut, to: server); tally.add("reflector_bytes_sent", cut.count)
            }
        }
        socket.close()
    }

    func garbage(to server: SocketAddress, until deadline: ContinuousClock.Instant, _ tally: AttackTally) async {
        guard let socket = try? await RawUDP.bind("127.69.0.1", counting: "garbage_bytes_received", tally) else { return }
        await every(garbageRate, until: deadline) { index in
            var random = SystemRandomNumberGenerator()
            var bytes = (0 ..< Int.random(in: 1 ... 1_400, using: &random)).map { _ in UInt8.random(in: 0 ... 255, using: &random) }
            switch index % 3 {
            case 0:  // a long header: Initial, version 1, random connection IDs, padded to 1,200
                bytes = [0xC0 | (bytes[0] & 0x0F), 0, 0, 0, 1, 8] + bytes.prefix(8) + [8] + bytes.dropFirst(8).prefix(8)
                    + [UInt8](repeating: 0, count: 1_200)
            case 1:  // a short header with a random connection ID
                bytes[0] = 0x40 | (bytes[0] & 0x3F)
                if bytes.count < 40 { bytes += [UInt8](repeating: 0xAB, count: 40) }
            default: break  // anything at all
            }
            socket.send(bytes, to: server)
            tally.add("garbage_datagrams")
        }
        socket.close()
    }

    func malformedAdmin(until deadline: ContinuousClock.Instant, _ tally: AttackTally) async {
        let requests: [[UInt8]] = [
            Array("GET /v1/channels HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer not-the-key\r\n\r\n".utf8),
            Array("POST /v1/channels HTTP/1.1\r\nHost: x\r\nContent-Length: 12\r\nAuthorization: Bearer x\r\n\r\n{\"name\": [}".utf8),
            Array("GET /../../etc/passwd HTTP/1.1\r\nHost: x\r\n\r\n".utf8),
            Array("GET /metrics HTTP/1.1\r\nHost: x\r\nX-Pad: \(String(repeating: "a", count: 100_000))\r\n\r\n".utf8),
            Array("POST /v1/tokens HTTP/1.1\r\nHost: x\r\nContent-Length: 999999999\r\n\r\nshort".utf8),
            Array("\u{16}\u{03}\u{01}\u{02}\u{00}\u{01}\u{00}\u{01}\u{fc}\u{03}\u{03} TLS to a plain port\r\n\r\n".utf8),
            Array("GARBAGE\u{0}\u{1}\u{2} / HTTP/9.9\r\n\r\n".utf8),
        ]
        let port = adminPort
        await every(adminRate, until: deadline) { index in
            let status = await AdminProbe.send(requests[index % requests.count], port: port)
            tally.add("admin_requests")
            tally.add("admin_" + status)
        }
    }
}

/// The attacker's counters, from many tasks.
final class AttackTally: Sendable {
    private let box = NIOLockedValueBox([String: Int]())
    func add(_ key: String, _ amount: Int = 1) { box.withLockedValue { $0[key, default: 0] += amount } }
    var counts: [String: Int] { box.withLockedValue { $0 } }
}

/// A plain UDP socket from a given loopback source, counting the bytes that come back.
struct RawUDP {
    let channel: any Channel

    static func bind(_ host: String, counting key: String, _ tally: AttackTally) async throws -> RawUDP {
        let channel = try await DatagramBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture { try channel.pipeline.syncOperations.addHandler(Counter(key: key, tally: tally)) }
            }
            .bind(host: host, port: 0).get()
        return RawUDP(channel: channel)
    }

    func send(_ bytes: [UInt8], to address: SocketAddress) {
        channel.writeAndFlush(AddressedEnvelope(remoteAddress: address, data: ByteBuffer(bytes: bytes)), promise: nil)
    }

    func close() { channel.close(promise: nil) }

    final class Counter: ChannelInboundHandler, Sendable {
        typealias InboundIn = AddressedEnvelope<ByteBuffer>
        let key: String
        let tally: AttackTally
        init(key: String, tally: AttackTally) { self.key = key; self.tally = tally }
        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            tally.add(key, unwrapInboundIn(data).data.readableBytes)
        }
    }
}

/// One request on a new TCP connection to the admin API; the answer's status class, or why none came.
enum AdminProbe {
    static func send(_ request: [UInt8], port: Int) async -> String {
        do {
            let channel = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
                .connectTimeout(.seconds(2))
                .connect(host: "127.0.0.1", port: port) { channel in
                    channel.eventLoop.makeCompletedFuture { try NIOAsyncChannel<ByteBuffer, ByteBuffer>(wrappingChannelSynchronously: channel) }
                }
            return try await channel.executeThenClose { inbound, outbound in
                try? await outbound.write(ByteBuffer(bytes: request))
                return try await withThrowingTaskGroup(of: String.self) { race in
                    race.addTask {
                        var response = ByteBuffer()
                        for try await chunk in inbound {
                            response.writeImmutableBuffer(chunk)
                            if response.readableBytes >= 12 { break }
                        }
                        let line = response.readString(length: min(12, response.readableBytes)) ?? ""
                        guard line.hasPrefix("HTTP/1.1 "), let digit = line.dropFirst(9).first, digit.isNumber else { return "closed" }
                        return "\(digit)xx"
                    }
                    race.addTask { try await Task.sleep(for: .seconds(3)); return "no_answer" }
                    let first = try await race.next() ?? "no_answer"
                    race.cancelAll()
                    return first
                }
            }
        } catch {
            return "connect_failed"
        }
    }
}
