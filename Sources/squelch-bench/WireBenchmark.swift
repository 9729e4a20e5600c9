import NIOCore
import NIOPosix
import Wire
import WireNIO

/// How many datagrams one direction of a connection carried, and how fast.
struct DatagramThroughput: Sendable, Equatable, CustomStringConvertible {
    /// Datagrams the sender sealed and wrote.
    var sent: Int
    /// Datagrams the receiving connection delivered (the rest were dropped by a full socket buffer).
    var delivered: Int
    /// From the first send to the last delivery seen.
    var seconds: Double

    init(sent: Int, delivered: Int, seconds: Double) {
        self.sent = sent
        self.delivered = delivered
        self.seconds = seconds
    }

    var deliveredPerSecond: Double { seconds > 0 ? Double(delivered) / seconds : 0 }
    var sentPerSecond: Double { seconds > 0 ? Double(sent) / seconds : 0 }

    var description: String {
        let lost = sent - delivered
        return "\(delivered)/\(sent) datagrams in \(String(Int(seconds * 1000))) ms: \(Int(deliveredPerSecond)) pkt/s delivered"
            + (lost > 0 ? " (\(lost) dropped)" : "")
    }
}

/// Datagram throughput through the real adapters over real sockets, for squelch-bench.
///
/// The sender seals `burst` datagrams per event-loop task and flushes once per burst (one
/// `sendmmsg`), with no flow control: it runs flat out, so when it outpaces the receiver the kernel
/// drops the excess, which `delivered` shows. Deliveries are counted from the receiving connection's
/// `ConnectionStats.datagramsDelivered`, sampled every 2 ms until all that were sent arrive or
/// nothing arrives for `settle`.
enum WireBenchmark {
    /// Client → server over an established connection.
    static func uplink(client: WireClientChannel, server: WireServer, count: Int, payloadSize: Int = 100,
                              burst: Int = 32, settle: Duration = .milliseconds(300)) async throws -> DatagramThroughput {
        let delivered: @Sendable () async throws -> Int = {
            try await server.submit { server in
                server.endpoint.handles.reduce(0) { $0 + (server.endpoint.connection($1)?.stats.datagramsDelivered ?? 0) }
            }
        }
        return try await measure(settle: settle, delivered: delivered) {
            pump(on: client.eventLoop, count: count, payloadSize: payloadSize, burst: burst) { client.sendDatagram($0) }
        }
    }

    /// Server → client over an established connection (`handle` is the client's connection).
    static func downlink(server: WireServer, to handle: Endpoint.Handle, client: WireClientChannel, count: Int,
                                payloadSize: Int = 100, burst: Int = 32,
                                settle: Duration = .milliseconds(300)) async throws -> DatagramThroughput {
        let delivered: @Sendable () async throws -> Int = {
            try await client.withClient { $0?.connection.stats.datagramsDelivered ?? 0 }
        }
        return try await measure(settle: settle, delivered: delivered) {
            pump(on: server.eventLoop, count: count, payloadSize: payloadSize, burst: burst) { server.sendDatagram($0, to: handle) }
        }
    }

    /// Starts a server on 127.0.0.1 and a client on two event-loop threads of their own, connects,
    /// measures both directions, and shuts everything down.
    static func loopback(secrets: ServerSecrets, client configuration: ClientConfiguration, count: Int,
                                payloadSize: Int = 100, burst: Int = 32) async throws -> (uplink: DatagramThroughput, downlink: DatagramThroughput) {
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 2)
        do {
            let result = try await run(group: group, secrets: secrets, configuration: configuration, count: count,
                                       payloadSize: payloadSize, burst: burst)
            try await group.shutdownGracefully()
            return result
        } catch {
            try? await group.shutdownGracefully()
            throw error
        }
    }

    static func run(group: MultiThreadedEventLoopGroup, secrets: ServerSecrets, configuration: ClientConfiguration, count: Int,
                    payloadSize: Int, burst: Int) async throws -> (uplink: DatagramThroughput, downlink: DatagramThroughput) {
        let server = try await WireServer.start(host: "127.0.0.1", port: 0, secrets: secrets, delegate: nil, group: group)
        let client = try WireClientChannel(configuration: configuration, server: server.localAddress, group: group)
        do {
            try await client.connect()
            // The server's side is established once the client's Finished arrives.
            var handle: Endpoint.Handle?
            for _ in 0..<500 where handle == nil {
                handle = try await server.submit { server in
                    server.endpoint.handles.first { server.endpoint.connection($0)?.state == .established }
                }
                if handle == nil { try await Task.sleep(for: .milliseconds(2)) }
            }
            guard let handle else { throw ConnectionError.handshakeTimeout }
            let up = try await uplink(client: client, server: server, count: count, payloadSize: payloadSize, burst: burst)
            let down = try await downlink(server: server, to: handle, client: client, count: count, payloadSize: payloadSize, burst: burst)
            await client.close()
            await server.stop()
            return (up, down)
        } catch {
            await client.close()
            await server.stop()
            throw error
        }
    }

    /// Sends `count` datagrams in bursts, one event-loop task per burst; the future says how many
    /// were written.
    static func pump(on eventLoop: any EventLoop, count: Int, payloadSize: Int, burst: Int,
                     send: @escaping @Sendable (UnsafeRawBufferPointer) -> Bool) -> EventLoopFuture<Int> {
        let done = eventLoop.makePromise(of: Int.self)
        let payload = [UInt8](repeating: 0xA5, count: payloadSize)
        @Sendable func step(remaining: Int, sent: Int) {
            guard remaining > 0 else { return done.succeed(sent) }
            let n = min(burst, remaining)
            let written = payload.withUnsafeBytes { bytes in
                (0..<n).reduce(0) { count, _ in send(bytes) ? count + 1 : count }
            }
            // A task per burst lets reads, timers and the flush scheduled by the sends run in between.
            eventLoop.execute { step(remaining: remaining - n, sent: sent + written) }
        }
        eventLoop.execute { step(remaining: count, sent: 0) }
        return done.futureResult
    }

    static func measure(settle: Duration, delivered: @Sendable () async throws -> Int,
                        start: () -> EventLoopFuture<Int>) async throws -> DatagramThroughput {
        let before = try await delivered()
        let clock = ContinuousClock()
        let began = clock.now
        let sent = try await start().get()
        var last = before
        var lastChange = clock.now
        while last - before < sent, clock.now - lastChange < settle {
            try await Task.sleep(for: .milliseconds(2))
            let now = try await delivered()
            if now != last { last = now; lastChange = clock.now }
        }
        return DatagramThroughput(sent: sent, delivered: last - before, seconds: seconds(lastChange - began))
    }

    static func seconds(_ duration: Duration) -> Double {
        let (s, attoseconds) = duration.components
        return Double(s) + Double(attoseconds) / 1e18
    }
}
