import Crypto
import NIOConcurrencyHelpers
import NIOCore
import NIOEmbedded
import NIOPosix
import SquelchTesting
import Testing
import Wire
@testable import WireNIO

/// Real UDP sockets on 127.0.0.1. Every test runs under `withEventLoopGroup`, which times out and
/// always shuts its event loops down.
@Suite(.timeLimit(.minutes(1)))
struct WireNIOTests {
    @Test func handshakeThenControlAndDatagramsBothWays() async throws {
        let pki = try TestPKI()
        let secrets = try pki.secrets()
        try await withEventLoopGroup { group in
            let (server, records) = try await startServer(secrets: secrets, echoPrefix: [0xEC], group: group)
            let client = try WireClientChannel(configuration: pki.client(), server: server.localAddress, group: group)
            let events = Recorder(client.events)
            let datagrams = Recorder(client.datagrams)
            try await client.connect()
            let handle = try await records.connectedHandle("server connected")

            try await client.send(control: bytes("hello server"))
            try await records.wait("control at the server") { $0.controls(handle) == [bytes("hello server")] }
            try await server.send(control: bytes("hello client"), to: handle)
            try await events.wait("control at the client") { $0.controls == [bytes("hello client")] }

            // Client → server, echoed by the delegate from inside the read cycle.
            for i in 0..<5 { #expect(await client.send(datagram: [UInt8(i), 1, 2, 3])) }
            let received = try await records.wait("datagrams at the server") { $0.datagrams(handle).count == 5 }
            #expect(Set(received.datagrams(handle)) == Set((0..<5).map { [UInt8($0), 1, 2, 3] }))
            let echoed = try await datagrams.wait("echoes at the client") { $0.count == 5 }
            #expect(Set(echoed) == Set((0..<5).map { [0xEC, UInt8($0), 1, 2, 3] }))

            // Server → client from off the event loop.
            #expect(await server.send(datagram: bytes("downlink"), to: handle))
            try await datagrams.wait("server datagram at the client") { $0.contains(bytes("downlink")) }

            // Full-size datagrams arrive whole through vector reads (each has its own 2 KiB slot).
            let large = [UInt8](repeating: 0x42, count: 1_100)
            #expect(await client.send(datagram: large))
            try await records.wait("a large datagram at the server") { $0.datagrams(handle).contains(large) }
            try await datagrams.wait("its echo at the client") { $0.contains([0xEC] + large) }

            await client.close(code: 7, reason: "bye")
            try await records.wait("the client's close at the server") {
                $0.contains(.event(handle, .closed(.peer(code: 7, reason: "bye", application: true))))
            }
            try await events.waitUntilFinished("the client's events")
            #expect(await events.items.contains(.connection(.closed(.local(code: 7, reason: "bye")))))
            let stats = try await server.submit { $0.stats }
            #expect(stats.droppedSources == 0 && stats.refusedDestinations == 0 && stats.rebinds == 0)
            await server.stop()
        }
    }

    /// A certificate chain near the 16 KiB the handshake carries (a corporate CA's RSA chain, or
    /// many names) connects over real sockets: the client's acknowledgements lift the server's 3×
    /// limit as the flight arrives. Before, the handshake of any chain over about 3.4 KB timed out.
    @Test func aLargeCertificateChainConnects() async throws {
        let pki = try TestPKI()
        let identity = try pki.identity(names: ["localhost", "127.0.0.1"] + (0..<500).map { "relay-\($0).squelch.example.net" })
        #expect(identity.derChain.reduce(0) { $0 + $1.count } > 15_000)
        try await withEventLoopGroup { group in
            let (server, records) = try await startServer(secrets: try pki.secrets(identity: identity), echoPrefix: [0xEC], group: group)
            let client = try WireClientChannel(configuration: pki.client(), server: server.localAddress, group: group)
            let datagrams = Recorder(client.datagrams)
            try await client.connect()
            _ = try await records.connectedHandle("server connected")
            #expect(await client.send(datagram: [1, 2, 3]))
            try await datagrams.wait("the echo at the client") { $0.contains([0xEC, 1, 2, 3]) }
            await client.close(code: 0, reason: "done")
            await server.stop()
        }
    }

    @Test func worksOverIPv6() async throws {
        let pki = try TestPKI()
        let secrets = try pki.secrets()
        try await withEventLoopGroup { group in
            let (stream, sink) = AsyncStream.makeStream(of: ServerRecord.self)
            let server: WireServer
            do {
                server = try await WireServer.start(host: "::1", port: 0, secrets: secrets, delegate: RecordingDelegate(sink: sink), group: group)
            } catch {
                // No IPv6 loopback on this machine: nothing to test.
                return
            }
            let records = Recorder(stream)
            let client = try WireClientChannel(configuration: pki.client(), server: server.localAddress, group: group)
            let datagrams = Recorder(client.datagrams)
            try await client.connect()
            let handle = try await records.connectedHandle("server connected")
            #expect(await client.send(datagram: [6, 6]))
            try await records.wait("datagram over IPv6") { $0.datagrams(handle) == [[6, 6]] }
            #expect(await server.send(datagram: [7, 7], to: handle))
            try await datagrams.wait("datagram back over IPv6") { $0 == [[7, 7]] }
            #expect(server.localAddress.protocol == .inet6)
            #expect(await client.localAddress()?.protocol == .inet6)
            await client.close()
            await server.stop()
        }
    }

    @Test func connectCanBeCancelledWhileNoServerAnswers() async throws {
        let pki = try TestPKI()
        try await withEventLoopGroup { group in
            // A port that was just free: nothing answers there.
            let probe = try await DatagramBootstrap(group: group).bind(host: "127.0.0.1", port: 0).get()
            let address = try #require(probe.localAddress)
            try await probe.close()
            let client = try WireClientChannel(configuration: pki.client(), server: address, group: group)
            let attempt = Task { try await client.connect() }
            try await Task.sleep(for: .milliseconds(50))
            attempt.cancel()
            await #expect(throws: CancellationError.self) { try await attempt.value }
            await client.close()
        }
    }

    @Test func aClientThatDistrustsTheServerFailsToConnect() async throws {
        let pki = try TestPKI()
        let stranger = try TestPKI(name: "Another CA")
        let secrets = try pki.secrets()
        try await withEventLoopGroup { group in
            let (server, _) = try await startServer(secrets: secrets, group: group)
            let client = try WireClientChannel(configuration: stranger.client(), server: server.localAddress, group: group)
            await #expect(throws: ConnectionError.self) { try await client.connect() }
            do {
                try await client.connect()
                Issue.record("a second connect should fail as well")
            } catch let error as ConnectionError {
                guard case .handshake(.untrustedCertificate) = error else {
                    Issue.record("expected an untrusted certificate, got \(error)")
                    return
                }
            }
            await client.close()
            await server.stop()
        }
    }

    @Test func clientRebindKeepsTheSessionWithoutANewHandshake() async throws {
        try await withServerAndClient { server, records, client in
            let events = Recorder(client.events)
            let datagrams = Recorder(client.datagrams)
            try await client.connect()
            let handle = try await records.connectedHandle("server connected")
            // Let the server's NEW_CONNECTION_ID arrive, so the client has a fresh ID to move to.
            try await client.send(control: bytes("before"))
            try await records.wait("first control") { $0.controls(handle) == [bytes("before")] }
            try await server.send(control: bytes("ack"), to: handle)
            try await events.wait("server reply") { $0.controls == [bytes("ack")] }

            let oldPort = try #require(await client.localAddress()?.port)
            try await client.rebind()
            let newPort = try #require(await client.localAddress()?.port)
            #expect(newPort != oldPort)

            try await client.send(control: bytes("after"))
            let seen = try await records.wait("control from the new port") { $0.controls(handle) == [bytes("before"), bytes("after")] }
            #expect(seen.contains { record in
                if case .event(handle, .peerMigrated(let address)) = record { return address.port == UInt16(newPort) }
                return false
            })
            try await server.send(control: bytes("still here"), to: handle)
            try await events.wait("reply on the new path") { $0.controls == [bytes("ack"), bytes("still here")] }
            #expect(await client.send(datagram: [9, 9]))
            try await records.wait("datagram from the new port") { $0.datagrams(handle) == [[9, 9]] }
            #expect(await server.send(datagram: [8, 8], to: handle))
            try await datagrams.wait("datagram to the new port") { $0 == [[8, 8]] }

            // One session throughout: one connection on the server, one handshake on each side.
            let (connections, accepted) = try await server.submit { ($0.endpoint.connectionCount, $0.endpoint.stats.accepted) }
            #expect(connections == 1 && accepted == 1)
            #expect(try await client.withClient { $0?.reconnects } == 0)
            #expect(await events.items.filter { $0 == .connection(.connected) }.count == 1)
            #expect(await records.items.connectedHandles == [handle])
            await client.close()
            await server.stop()
        }
    }

    @Test func aRestartedServerResetsTheSessionAndTheClientReconnects() async throws {
        let pki = try TestPKI()
        let identity = try pki.identity()
        let resetKey = SymmetricKey(size: .bits256)
        try await withEventLoopGroup { group in
            let (first, firstRecords) = try await startServer(secrets: ServerSecrets(identity: identity, resetKey: resetKey), group: group)
            let port = try #require(first.localAddress.port)
            let client = try WireClientChannel(configuration: pki.client(), server: first.localAddress, group: group)
            let events = Recorder(client.events)
            try await client.connect()
            try await firstRecords.wait("first server connected") { !$0.connectedHandles.isEmpty }

            // A crash: no CONNECTION_CLOSE. A new endpoint with new token keys, but the same reset key.
            await first.stop(closingConnections: false)
            let (second, records) = try await startServer(secrets: ServerSecrets(identity: identity, resetKey: resetKey),
                                                          port: port, group: group)

            // The next packet reaches a server that doesn't know it, which answers with a reset.
            try await client.send(control: bytes("anyone there?"))
            let seen = try await events.wait("reset and reconnect") { events in
                guard let reset = events.firstIndex(of: .reconnecting(.statelessReset)) else { return false }
                return events[(reset + 1)...].contains(.connection(.connected))
            }
            #expect(seen.contains(.connection(.closed(.statelessReset))))
            let handle = try await records.connectedHandle("second server connected")

            try await client.send(control: bytes("rejoin"))
            // If the client drew its reset with an earlier packet (an ACK) and had already reconnected,
            // "anyone there?" went out on the new session, which is right too.
            try await records.wait("control on the new session") {
                [[bytes("rejoin")], [bytes("anyone there?"), bytes("rejoin")]].contains($0.controls(handle))
            }
            let resets = try await second.submit { $0.endpoint.stats.statelessResetsSent }
            #expect(resets >= 1)
            #expect(try await client.withClient { $0?.reconnects } == 1)
            await client.close()
            await second.stop()
        }
    }

    /// Another process takes the port the moment the server's socket closes: the server says so
    /// (squelchd's `/healthz` answers 503 with it) for as long as binding again fails, and is whole
    /// again once the port is free.
    @Test func aRebindThatKeepsFailingIsReportedUntilItWorks() async throws {
        let pki = try TestPKI()
        let secrets = try pki.secrets()
        try await withEventLoopGroup { group in
            let (server, _) = try await startServer(secrets: secrets, group: group)
            let port = try #require(server.localAddress.port)
            #expect(try await server.submit { $0.socketProblem } == nil)
            let squatter = Squatter()
            try await server.submit { server in
                let channel = server.core.value.channel!
                // Runs after the server's own close callback, added first, has released the port, and
                // before its first rebind, which that callback scheduled.
                channel.closeFuture.assumeIsolated().whenComplete { _ in squatter.bind(port: port) }
                channel.close(promise: nil)
            }
            #expect(await eventually { squatter.descriptor >= 0 }, "the test could not take the port")
            #expect(await eventually { (try? await server.submit { $0.socketProblem })??.contains("in use") == true })
            let problem = try await server.submit { $0.socketProblem } ?? ""
            #expect(problem.contains("port \(port)") && problem.contains("no other process took the port"), "\(problem)")
            squatter.release()
            // The rebind backs off to every 2 s at most.
            #expect(await eventually(seconds: 5) { (try? await server.submit { $0.socketProblem }) == .some(nil) })
            let client = try WireClientChannel(configuration: pki.client(), server: server.localAddress, group: group)
            try await client.connect()
            await client.close()
            await server.stop()
        }
    }

    @Test func theServerRebindsWhenItsSocketClosesAndSessionsSurvive() async throws {
        try await withServerAndClient { server, records, client in
            let events = Recorder(client.events)
            try await client.connect()
            let handle = try await records.connectedHandle("server connected")

            // What NIO does after a fatal send errno.
            try await server.submit { $0.core.value.channel?.close(promise: nil) }
            try await records.wait("the rebind") { $0.contains(.rebound) }
            let stats = try await server.submit { $0.stats }
            #expect(stats.rebinds == 1)

            try await client.send(control: bytes("still connected?"))
            try await records.wait("control after the rebind") { $0.controls(handle) == [bytes("still connected?")] }
            try await server.send(control: bytes("yes"), to: handle)
            try await events.wait("reply after the rebind") { $0.controls == [bytes("yes")] }
            #expect(try await server.submit { $0.endpoint.connectionCount } == 1)
            await client.close()
            await server.stop()
        }
    }

    @Test func stoppingTheServerClosesItsSessions() async throws {
        try await withServerAndClient { server, records, client in
            let events = Recorder(client.events)
            try await client.connect()
            try await records.wait("server connected") { !$0.connectedHandles.isEmpty }
            await server.stop(code: 3, reason: "maintenance")
            try await events.wait("the server's close") {
                $0.contains(.connection(.closed(.peer(code: 3, reason: "maintenance", application: true))))
            }
            // A peer's close is final: no reconnect, and the stream ends.
            try await events.waitUntilFinished("the client's events")
            #expect(await !(events.items.contains { if case .reconnecting = $0 { true } else { false } }))
            await client.close()
            await server.stop()
        }
    }

    @Test func stoppingClosesEverySessionEvenPastOnePassOfOutput() async throws {
        // The server writes at most `datagramsPerDrain` datagrams before yielding the loop (4,096 in
        // production); at stop nothing may wait for a later tick, since the socket closes at once.
        let pki = try TestPKI()
        let secrets = try pki.secrets()
        let options = { var options = UDPOptions(); options.datagramsPerDrain = 2; return options }()
        try await withEventLoopGroup { group in
            let (server, records) = try await startServer(secrets: secrets, options: options, group: group)
            var clients: [(WireClientChannel, Recorder<ClientEvent>)] = []
            for _ in 0..<7 {
                let client = try WireClientChannel(configuration: pki.client(), server: server.localAddress, group: group)
                clients.append((client, Recorder(client.events)))
                try await client.connect()
            }
            try await records.wait("all connected") { $0.connectedHandles.count == 7 }
            await server.stop(code: 3, reason: "maintenance")
            for (index, (client, events)) in clients.enumerated() {
                try await events.wait("client \(index) told") {
                    $0.contains(.connection(.closed(.peer(code: 3, reason: "maintenance", application: true))))
                }
                await client.close()
            }
        }
    }
}

@Suite struct AddressTests {
    @Test func ipv4RoundTrips() throws {
        let address = try SocketAddress(ipAddress: "192.0.2.33", port: 4433)
        let path = try #require(PathAddress(address))
        #expect(path == PathAddress(ipv4: 0xC000_0221, port: 4433))
        #expect(path.description == "192.0.2.33:4433")
        #expect(PathAddress(SocketAddress(path)) == path)
        #expect(SocketAddress(path).ipAddress == "192.0.2.33")
    }

    @Test func ipv6RoundTrips() throws {
        let address = try SocketAddress(ipAddress: "2001:db8::1:2", port: 443)
        let path = try #require(PathAddress(address))
        #expect(path == PathAddress(ipv6High: 0x2001_0DB8_0000_0000, low: 0x0000_0000_0001_0002, port: 443))
        #expect(PathAddress(SocketAddress(path)) == path)
        #expect(SocketAddress(path).ipAddress == "2001:db8::1:2")
    }

    @Test func unixSocketsHaveNoPathAddress() throws {
        #expect(PathAddress(try SocketAddress(unixDomainSocketPath: "/tmp/squelch.sock")) == nil)
    }

    @Test func addressesThatWouldCloseTheSocketAreRefused() throws {
        #expect(!PathAddress(ipv4: 0x7F00_0001, port: 0).isUnicastSendable)
        #expect(!PathAddress(ipv4: 0xFFFF_FFFF, port: 9).isUnicastSendable)
        #expect(!PathAddress(ipv4: 0xE000_00FB, port: 5353).isUnicastSendable)
        #expect(!PathAddress(ipv6High: 0xFF02_0000_0000_0000, low: 1, port: 9).isUnicastSendable)
        #expect(PathAddress(ipv4: 0x7F00_0001, port: 9).isUnicastSendable)

        var cache = AddressCache()
        cache.socketIsIPv6 = false
        #expect(cache.socketAddress(for: PathAddress(ipv6High: 0x2001_0DB8_0000_0000, low: 1, port: 9)) == nil)
        #expect(cache.socketAddress(for: PathAddress(ipv4: 0xFFFF_FFFF, port: 9)) == nil)
        #expect(cache.refused == 2)
        let source = try SocketAddress(ipAddress: "10.1.2.3", port: 5000)
        let path = try #require(PathAddress(source))
        let learned = cache.learn(path, source)
        #expect(learned)
        #expect(cache.socketAddress(for: path) == source)

        // A link-local IPv6 peer is answerable only through the address it came from (its scope).
        cache.socketIsIPv6 = true
        let linkLocal = PathAddress(ipv6High: 0xFE80_0000_0000_0000, low: 1, port: 9)
        #expect(cache.socketAddress(for: linkLocal) == nil)
    }
}

/// The server's batched send path (`BatchSender`), on real sockets.
@Suite(.timeLimit(.minutes(1)))
struct BatchSendTests {
    /// 700 datagrams in one event-loop tick: the arena fills twice, and the full batches go out
    /// mid-cycle instead of being lost or overwritten.
    @Test func moreDatagramsThanOneBatchHoldAllArriveIntact() async throws {
        try await withServerAndClient { server, records, client in
            let datagrams = Recorder(client.datagrams)
            try await client.connect()
            let handle = try await records.connectedHandle("server connected")
            let count = 700
            #expect(count > 2 * BatchSender.capacity)
            @Sendable func payload(_ i: Int) -> [UInt8] {
                [UInt8(i >> 8), UInt8(i & 0xFF)] + [UInt8](repeating: UInt8(i % 251), count: 60)
            }
            let accepted = try await server.submit { server in
                (0..<count).filter { i in payload(i).withUnsafeBytes { server.sendDatagram($0, to: handle) } }.count
            }
            #expect(accepted == count)
            let received = try await datagrams.wait("all \(count) datagrams") { $0.count == count }
            let expected = Set((0..<count).map(payload))
            #expect(Set(received) == expected)
            let stats = try await server.submit { $0.stats }
            #expect(stats.socketErrors == 0 && stats.refusedDestinations == 0)
            await client.close()
            await server.stop()
        }
    }

    /// Unix datagram sockets stand in for UDP here: on loopback UDP never reports a full send buffer
    /// (the kernel hands each datagram over at once), while a Unix datagram socket refuses a
    /// non-blocking send with EAGAIN once the receiver's queue holds `max_dgram_qlen` of them, and an
    /// address nobody bound with ECONNREFUSED.
    @Test func aRefusedDestinationLosesOneDatagramAndAFullSocketHandsTheRestBack() throws {
        let name = "squelch-batch-\(UInt32.random(in: 0...UInt32.max))"
        let (receiver, sender, address, length) = try boundUnixPair(name)
        defer { _ = close(receiver) }
        let (nowhere, nowhereLength) = abstractAddress(name + "-none")

        let batch = BatchSender(descriptor: sender, slot: 64)
        func add(_ value: UInt8, to target: sockaddr_un, _ targetLength: socklen_t) {
            batch.nextSlot.storeBytes(of: value, as: UInt8.self)
            withUnsafeBytes(of: target) { batch.nextAddress.copyMemory(from: $0.baseAddress!, byteCount: Int(targetLength)) }
            batch.commit(length: 1, path: PathAddress(ipv4: 0x7F00_0001, port: UInt16(value) + 1), addressLength: Int(targetLength))
        }
        add(0, to: nowhere, nowhereLength)
        for value in 1...40 { add(UInt8(value), to: address, length) }
        let outcome = batch.send()
        #expect(outcome.failures == 1 && outcome.lastErrno == ECONNREFUSED)
        let blocked = try #require(outcome.blockedFrom, "the receiver's queue never filled")
        #expect(blocked > 1 && blocked < 41)
        // What was handed back is exactly what the kernel did not take, in order.
        #expect(batch.datagram(blocked).bytes.first == UInt8(blocked))
        #expect(batch.datagram(blocked).path.port == UInt16(blocked) + 1)
        var got: [UInt8] = []
        var byte: UInt8 = 0
        while recv(receiver, &byte, 1, CInt(MSG_DONTWAIT)) == 1 { got.append(byte) }
        #expect(got == (1..<UInt8(blocked)).map { $0 })
        batch.reset()
        batch.close()
        #expect(!batch.isOpen)
    }

    /// What the kernel's full buffer hands back goes to NIO only while the channel is under its
    /// high watermark; past it, the rest is dropped and counted. NIO's queue has no limit of its
    /// own: under sustained overload it grew every cycle. (An embedded channel stands in for NIO's,
    /// since its writability can be set; the socket is real, as in the test above.)
    @Test func aFullSocketHandsNIOOnlyWhatFitsUnderItsWatermark() throws {
        let (receiver, sender, address, length) = try boundUnixPair("squelch-watermark-\(UInt32.random(in: 0...UInt32.max))")
        defer { _ = close(receiver) }

        final class Holder: ChannelOutboundHandler {
            typealias OutboundIn = AddressedEnvelope<ByteBuffer>
            var context: ChannelHandlerContext?
            func handlerAdded(context: ChannelHandlerContext) { self.context = context }
        }
        let holder = Holder()
        let channel = EmbeddedChannel(handler: holder)
        let context = try #require(holder.context)
        let batch = BatchSender(descriptor: sender, slot: 64)
        var output = DatagramOutput(slot: 64)
        output.attach(context, socketIsIPv6: false, batch: batch)
        func fill(_ count: Int) {
            for value in 0..<count {
                batch.nextSlot.storeBytes(of: UInt8(value), as: UInt8.self)
                withUnsafeBytes(of: address) { batch.nextAddress.copyMemory(from: $0.baseAddress!, byteCount: Int(length)) }
                batch.commit(length: 1, path: PathAddress(ipv4: 0x7F00_0001, port: 4_000), addressLength: Int(length))
            }
        }
        func handedToNIO() throws -> Int {
            var count = 0
            while try channel.readOutbound(as: AddressedEnvelope<ByteBuffer>.self) != nil { count += 1 }
            return count
        }
        // Writable: what the kernel refused goes to NIO, every datagram of it.
        fill(40)
        output.flush()
        let queued = try handedToNIO()
        #expect(queued > 0, "the receiver's queue never filled")
        #expect(output.takeFailures().count == 0)
        // Over the watermark: the receiver's queue is still full, and nothing more goes to NIO.
        channel.isWritable = false
        fill(10)
        output.flush()
        #expect(try handedToNIO() == 0)
        let dropped = output.takeFailures()
        #expect(dropped.count == 10 && dropped.errno == ENOBUFS)
        output.detach(context)
        _ = try channel.finish()
    }

    /// A receiving Unix datagram socket bound to `name` (abstract namespace) and a non-blocking sender.
    func boundUnixPair(_ name: String) throws -> (receiver: CInt, sender: CInt, address: sockaddr_un, length: socklen_t) {
        let receiver = socket(AF_UNIX, CInt(SOCK_DGRAM.rawValue), 0)
        let sender = socket(AF_UNIX, CInt(SOCK_DGRAM.rawValue) | CInt(SOCK_NONBLOCK.rawValue), 0)
        try #require(receiver >= 0 && sender >= 0)
        let (address, length) = abstractAddress(name)
        let bound = withUnsafeBytes(of: address) { bind(receiver, $0.baseAddress!.assumingMemoryBound(to: sockaddr.self), length) }
        try #require(bound == 0)
        return (receiver, sender, address, length)
    }

    func abstractAddress(_ name: String) -> (sockaddr_un, socklen_t) {
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        let bytes = Array(name.utf8)
        withUnsafeMutableBytes(of: &address.sun_path) { path in
            path[0] = 0  // the abstract namespace: no file
            for (i, b) in bytes.enumerated() { path[i + 1] = b }
        }
        return (address, socklen_t(MemoryLayout<sa_family_t>.size + 1 + bytes.count))
    }
}

/// The relay's copies sent from other loops (`FanoutWorkers`), on real sockets.
@Suite(.timeLimit(.minutes(1)))
struct FanoutWorkerTests {
    @Test func copiesSpreadToAWorkerArriveAsEnvelopesAndSurviveARebind() async throws {
        let pki = try TestPKI()
        let secrets = try pki.secrets()
        try await withEventLoopGroup { group in
            let workerLoops = MultiThreadedEventLoopGroup(numberOfThreads: 1)
            defer { workerLoops.shutdownGracefully { _ in } }
            let sentReports = NIOLockedValueBox(0)
            let fanout = FanoutWorkers(loops: [workerLoops.next()]) { _ in sentReports.withLockedValue { $0 += 1 } }
            let (stream, sink) = AsyncStream.makeStream(of: ServerRecord.self)
            let server = try await WireServer.start(host: "127.0.0.1", port: 0, endpoint: Endpoint(secrets: secrets),
                                                    delegate: RecordingDelegate(sink: sink), on: group.next(), fanout: fanout)
            let records = Recorder(stream)
            let clients = try (0..<2).map { _ in try WireClientChannel(configuration: pki.client(), server: server.localAddress, group: group) }
            let received = clients.map { Recorder($0.datagrams) }
            for client in clients { try await client.connect() }
            let handles = try await records.wait("both connected") { $0.connectedHandles.count == 2 }.connectedHandles

            // In one go, as a read cycle with many talker packets: the first few are sent from the
            // loop, the rest of an odd talker's go to the one worker, an even talker's stay on the loop.
            @Sendable func relay(_ packets: [(talker: UInt32, media: [UInt8])]) async throws -> [Bool] {
                try await server.submit { server in
                    packets.map { packet in
                        let (sent, handedOver) = server.withRelaySender(talker: Endpoint.Handle(index: packet.talker, generation: 0), started: WireNIO.now()) { send in
                            packet.media.withUnsafeBytes { bytes in handles.filter { send(bytes, $0) }.count }
                        }
                        precondition(sent == 2)
                        return handedOver
                    }
                }
            }
            let burst = (0..<100).map { (talker: UInt32(1), media: [0x41, UInt8($0), 1, 2, 3] as [UInt8]) } + [(talker: 2, media: [0x41, 200, 1, 2, 3])]
            let direct = WireServer.spreadAfter
            #expect(try await relay(burst) == [Bool](repeating: false, count: direct) + [Bool](repeating: true, count: 100 - direct) + [false])
            for recorder in received {
                let got = try await recorder.wait("101 copies") { $0.count == 101 }
                #expect(Set(got) == Set(burst.map(\.media)))
            }
            #expect(sentReports.withLockedValue { $0 } == 100 - direct)

            // The socket closes under the server: the worker's duplicate goes too, the port is bound
            // again, and the worker sends on the new socket.
            try await server.submit { $0.core.value.channel?.close(promise: nil) }
            try await records.wait("the rebind") { $0.contains(.rebound) }
            let after = try await relay((0...direct).map { (1, [0x41, 250 + UInt8($0), 9]) })
            #expect(after.last == true)
            for recorder in received {
                _ = try await recorder.wait("the copies after the rebind") { got in (0...direct).allSatisfy { got.contains([0x41, 250 + UInt8($0), 9]) } }
            }
            let stats = try await server.submit { $0.stats }
            #expect(stats.socketErrors == 0 && stats.refusedDestinations == 0)
            for client in clients { await client.close() }
            await server.stop()
        }
    }
}
