import Crypto
import Foundation
import SeededRandom
import Testing
@testable import Wire

@Suite struct MigrationTests {
    @Test func natRebindingIsValidatedAndTheSessionCarriesOn() async throws {
        let pki = try TestPKI()
        let sim = Simulation(seed: 20, pki: pki, secrets: try pki.secrets())
        sim.addClient()
        let handle = try await sim.connect(0)
        await sim.run(for: seconds(1))
        let rtt = try #require(sim.endpoint.connection(handle)?.rtt)
        #expect(rtt.hasSample)
        // The NAT gives the client a new port; the client doesn't even know.
        sim.clientAddresses[0].port = 61_000
        try sim.clients[0].sendControl(Array("still here".utf8))
        await sim.run(for: seconds(1)) { sim.serverEvents.contains { $0.1 == .peerMigrated(sim.clientAddresses[0]) } }
        // Only the port changed: the RTT estimate is kept (RFC 9000 §9.4); a new host would reset it.
        #expect(sim.endpoint.connection(handle)?.rtt.hasSample == true)
        #expect(sim.endpoint.connection(handle)?.rtt.smoothed == rtt.smoothed)
        await sim.run(for: seconds(1))
        #expect(sim.serverControlMessages(handle) == [Array("still here".utf8)])
        #expect(sim.serverEvents.contains { $0.1 == .peerMigrated(sim.clientAddresses[0]) })
        #expect(sim.serverEvents.contains { $0.1 == .pathValidated(sim.clientAddresses[0]) })
        #expect(sim.endpoint.connectionCount == 1)
        #expect(sim.sendDatagram(server: handle, [5]))
        await sim.run(for: ms(200))
        #expect(sim.clientDatagrams[0] == [[5]])
    }

    /// A phone moves from Wi-Fi to cellular and back: the address it returns to was validated
    /// minutes ago at most, so it is trusted at once and its audio is not held to the 3× limit while
    /// a challenge goes round; one left longer ago than a NAT must keep a mapping is validated again.
    @Test func anAddressLeftRecentlyIsTrustedAgainAtOnce() async throws {
        let pki = try TestPKI()
        let sim = Simulation(seed: 23, pki: pki, secrets: try pki.secrets())
        sim.addClient()
        let handle = try await sim.connect(0)
        await sim.run(for: seconds(1))
        let wifi = sim.clientAddresses[0]
        let cellular = PathAddress.v4(100, 64, 0, 7, port: 41_000)
        func move(to address: PathAddress) async {
            func migrations() -> Int { sim.serverEvents.filter { $0.1 == .peerMigrated(address) }.count }
            let before = migrations()
            sim.clientAddresses[0] = address
            try? sim.clients[0].sendControl([1])
            // Until the server has the packet, not a moment longer: no answer from the client yet.
            #expect(await sim.run(for: seconds(1)) { migrations() > before }, "the server saw the move to \(address)")
        }
        func validations(_ address: PathAddress) -> Int {
            sim.serverEvents.filter { $0.1 == .pathValidated(address) }.count
        }
        await move(to: cellular)
        await sim.run(for: seconds(1))
        #expect(sim.endpoint.connection(handle)?.path.validated == true, "the new network is validated by a challenge")

        // Back on Wi-Fi 30 s later: validated as it arrives, and a burst of audio goes out in full
        // before any answer from the client could have come back.
        await sim.run(for: seconds(30))
        let blocked = sim.endpoint.connection(handle)?.stats.amplificationBlocked ?? 0
        await move(to: wifi)
        #expect(sim.endpoint.connection(handle)?.path.validated == true)
        #expect(sim.endpoint.connection(handle)?.path.challenge == nil, "no challenge for an address left 30 s ago")
        var sent = 0
        for _ in 0..<20 where sim.sendDatagram(server: handle, [UInt8](repeating: 9, count: 80)) { sent += 1 }
        #expect(sent == 20)
        #expect(sim.endpoint.connection(handle)?.stats.amplificationBlocked == blocked)
        #expect(validations(wifi) == 1, "said once, as it happened")

        // To cellular and, three minutes later, back: the old mapping may be someone else's by now.
        await move(to: cellular)
        await sim.run(for: seconds(180))
        await move(to: wifi)
        #expect(sim.endpoint.connection(handle)?.path.validated == false)
        #expect(sim.endpoint.connection(handle)?.path.challenge != nil)
        await sim.run(for: seconds(1))
        #expect(sim.endpoint.connection(handle)?.path.validated == true)
        #expect(sim.endpoint.connection(handle)?.state == .established)
    }

    @Test func anUnvalidatedPathGetsAtMostThreeTimesWhatItSent() async throws {
        let pki = try TestPKI()
        let sim = Simulation(seed: 21, pki: pki, secrets: try pki.secrets())
        sim.addClient()
        let handle = try await sim.connect(0)
        let newAddress = PathAddress.v4(172, 16, 0, 9, port: 40_000)
        sim.clientAddresses[0] = newAddress
        // One small packet arrives from the new address, then the client goes silent (its answers are
        // lost), so the path never validates.
        sim.sendDatagram(client: 0, [1])
        sim.network.blackhole.insert(newAddress)
        await sim.run(for: ms(50))
        let received = try #require(sim.endpoint.connection(handle)?.path.bytesReceived)
        // The relay tries to fan out plenty of audio to it.
        var sentAudio = 0
        for _ in 0..<50 where sim.sendDatagram(server: handle, [UInt8](repeating: 7, count: 80)) { sentAudio += 1 }
        await sim.run(for: seconds(5))
        let total = sim.serverBytesTo[newAddress] ?? 0
        #expect(total > 0)
        #expect(total <= 3 * received, "sent \(total) bytes to an unvalidated address that sent \(received)")
        #expect(sentAudio < 50)
        #expect(sim.endpoint.connection(handle)?.stats.amplificationBlocked ?? 0 > 0)
        #expect(sim.serverEvents.contains { $0.1 == .pathValidationFailed(newAddress) })
    }

    @Test func fastResumeAfterMinutesOfSilenceNeedsNoHandshake() async throws {
        let pki = try TestPKI()
        let sim = Simulation(seed: 22, pki: pki, secrets: try pki.secrets())
        sim.addClient()
        let handle = try await sim.connect(0)
        await sim.run(for: seconds(1))  // the spare connection IDs arrive
        // The app goes to the background: no keepalives, and the NAT mapping expires.
        sim.clients[0].connection.keepAlive = false
        let sentBefore = sim.network.sent
        await sim.run(for: seconds(240))
        #expect(sim.network.sent == sentBefore, "a backgrounded client stays silent")
        #expect(sim.endpoint.connection(handle)?.state == .established, "the server keeps the session")
        // Wake: new port, and the floor request goes out in the very first packet.
        sim.clientAddresses[0].port = 62_000
        let oldID = sim.clients[0].connection.peerID
        sim.clients[0].migrate(now: sim.network.now)
        try sim.clients[0].sendControl(Array("floor request".utf8))
        #expect(sim.clients[0].connection.peerID != oldID, "a fresh connection ID, so the paths can't be linked")
        let start = sim.network.now
        await sim.run(for: seconds(1)) { sim.serverControlMessages(handle) == [Array("floor request".utf8)] }
        #expect(sim.serverControlMessages(handle) == [Array("floor request".utf8)])
        // Delivered one way after one network delay (20 ms), with no handshake in between.
        #expect(sim.network.now.since(start) <= ms(25))
        #expect(sim.endpoint.stats.accepted == 1)
        #expect(sim.clients[0].reconnects == 0)
        await sim.run(for: seconds(1))
        #expect(sim.serverEvents.contains { $0.1 == .pathValidated(sim.clientAddresses[0]) })
    }
}

@Suite struct StatelessResetTests {
    @Test func aRestartedServerResetsTheClientWhichReconnectsByItself() async throws {
        let pki = try TestPKI()
        let resetKey = SymmetricKey(size: .bits256)
        let secrets = try pki.secrets(resetKey: resetKey)
        let sim = Simulation(seed: 30, pki: pki, secrets: secrets)
        sim.addClient()
        _ = try await sim.connect(0)
        // Restart: a new endpoint with no sessions, but the same reset key (it is persisted).
        sim.endpoint = Endpoint(secrets: secrets, random: SplitMix64(seed: 5), forkRandom: { SplitMix64(seed: $0.next()) })
        try sim.clients[0].sendControl(Array("anyone there?".utf8))
        let start = sim.network.now
        let ok = await sim.run(for: seconds(5)) { sim.connected(0) && sim.clients[0].reconnects == 1 }
        #expect(ok)
        #expect(sim.endpoint.stats.statelessResetsSent == 1)
        #expect(sim.clientEvents[0].contains(.reconnecting(.statelessReset)))
        // Reset after one round trip (40 ms), new handshake after one more: about 2 RTT in all.
        #expect(sim.network.now.since(start) <= ms(100), "took \(sim.network.now.since(start) / 1_000_000) ms")
    }

    @Test func aResetIsSmallerThanItsTriggerAndTinyPacketsGetNone() throws {
        let pki = try TestPKI()
        let endpoint = Endpoint(secrets: try pki.secrets())
        var buffer = [UInt8](repeating: 0, count: 1500)
        for size in [PacketHeader.minimumShortPacket, 30, 43, 44, 100, 1200] {
            var packet = [UInt8](repeating: 0x41, count: size)
            packet.withUnsafeMutableBytes { endpoint.receive($0, from: .v4(1, 2, 3, 4, port: 5), now: WireInstant(nanoseconds: 1)) }
            let reset = try #require(buffer.withUnsafeMutableBytes { endpoint.poll(into: $0, now: WireInstant(nanoseconds: 1)) })
            #expect(reset.count < size && reset.count >= 21)
            #expect(buffer[0] & 0xC0 == 0x40, "looks like a short header")
            #expect(Array(buffer[(reset.count - 16)..<reset.count]) == endpoint.secrets.resetToken(for: ConnectionID(0x4141_4141_4141_4141)))
        }
        // Shorter than any valid packet: not answered.
        var tiny = [UInt8](repeating: 0x41, count: PacketHeader.minimumShortPacket - 1)
        tiny.withUnsafeMutableBytes { endpoint.receive($0, from: .v4(1, 2, 3, 4, port: 5), now: WireInstant(nanoseconds: 1)) }
        #expect(buffer.withUnsafeMutableBytes { endpoint.poll(into: $0, now: WireInstant(nanoseconds: 1)) } == nil)
    }
}

@Suite struct DefenceTests {
    @Test func underLoadClientsGoThroughRetryAndStillConnect() async throws {
        let pki = try TestPKI()
        var configuration = EndpointConfiguration()
        configuration.retryThreshold = 0
        let sim = Simulation(seed: 40, pki: pki, secrets: try pki.secrets(), configuration: configuration)
        sim.addClient()
        _ = try await sim.connect(0)
        #expect(sim.endpoint.stats.retriesSent == 1)
        #expect(sim.clients[0].connection.retrySource != nil)
    }

    @Test func aTokenFromAnEarlierConnectionSkipsTheRetry() async throws {
        let pki = try TestPKI()
        var configuration = EndpointConfiguration()
        configuration.retryThreshold = 0
        let sim = Simulation(seed: 41, pki: pki, secrets: try pki.secrets(), configuration: configuration)
        sim.addClient()
        _ = try await sim.connect(0)
        await sim.run(for: seconds(1))
        let token = sim.clients[0].token
        #expect(!token.isEmpty)
        let client = Connection(client: sim.clients[0].configuration, remote: sim.serverAddress, now: sim.network.now, token: token,
                                random: SplitMix64(seed: 8))
        var buffer = [UInt8](repeating: 0, count: 1500)
        let transmit = try #require(buffer.withUnsafeMutableBytes { client.poll(into: $0, now: sim.network.now) })
        buffer.withUnsafeMutableBytes { sim.endpoint.receive(UnsafeMutableRawBufferPointer(rebasing: $0[..<transmit.count]),
                                                             from: sim.clientAddresses[0], now: sim.network.now) }
        #expect(sim.endpoint.stats.retriesSent == 1, "no second Retry")
        #expect(sim.endpoint.stats.accepted == 2)
    }

    @Test func handshakesPerSecondFromOneAddressAreLimited() async throws {
        let pki = try TestPKI()
        var configuration = EndpointConfiguration()
        configuration.handshakesPerSecondPerAddress = 3
        let endpoint = Endpoint(secrets: try pki.secrets(), configuration: configuration)
        let now = WireInstant(nanoseconds: seconds(10))
        let validator = pki.validator
        for i in 0..<10 {
            let client = Connection(client: ClientConfiguration(serverName: "localhost", validator: validator), remote: .v4(10, 0, 0, 1, port: 1),
                                    now: now, random: SplitMix64(seed: UInt64(i)))
            var buffer = [UInt8](repeating: 0, count: 1500)
            let transmit = try #require(buffer.withUnsafeMutableBytes { client.poll(into: $0, now: now) })
            // Different ports, same host: the limit is per host.
            buffer.withUnsafeMutableBytes { endpoint.receive(UnsafeMutableRawBufferPointer(rebasing: $0[..<transmit.count]),
                                                             from: .v4(203, 0, 113, 5, port: UInt16(1000 + i)), now: now) }
        }
        #expect(endpoint.stats.accepted == 3)
        #expect(endpoint.stats.rateLimited == 7)
    }

    @Test func oneAddressGetsAtMostItsShareOfConnections() async throws {
        let pki = try TestPKI()
        var configuration = EndpointConfiguration()
        configuration.maxConnectionsPerAddress = 2
        let sim = Simulation(seed: 43, pki: pki, secrets: try pki.secrets(), configuration: configuration)
        // Three clients behind one NAT address (different ports), a fourth elsewhere.
        for port in [40_001, 40_002, 40_003] as [UInt16] { sim.addClient(port: port) }
        for index in 0..<3 { sim.clientAddresses[index] = .v4(198, 51, 100, 7, port: 40_001 + UInt16(index)) }
        sim.addClient()
        _ = try await sim.connect(0)
        _ = try await sim.connect(1)
        await sim.run(for: seconds(2)) { sim.clientError(2) != nil }
        guard case .peer(let code, let reason, _) = sim.clientError(2) else { Issue.record("\(String(describing: sim.clientError(2)))"); return }
        #expect(code == TransportErrorCode.connectionRefused.rawValue)
        #expect(reason.contains("too many connections from this address"))
        #expect(sim.endpoint.stats.refusedForAddress >= 1)
        _ = try await sim.connect(3)
        #expect(sim.endpoint.connectionCount == 3, "another address is not limited by the first")
        // One of the first two closes: its address has room again.
        sim.clients[0].close(now: sim.network.now)
        #expect(await sim.run(for: seconds(5)) { sim.endpoint.connectionCount == 2 })
        #expect(sim.endpoint.perSource[PathAddress.v4(198, 51, 100, 7, port: 0)] == 1)
        let again = sim.addClient()
        sim.clientAddresses[again] = .v4(198, 51, 100, 7, port: 40_009)
        _ = try await sim.connect(again)
        #expect(sim.endpoint.connectionCount == 3)
    }

    @Test func anIPv6SourceIsItsSlash64() {
        let a = PathAddress(ipv6High: 0x2001_0db8_0000_0001, low: 0x1, port: 5)
        let b = PathAddress(ipv6High: 0x2001_0db8_0000_0001, low: 0xFFFF_0000_1234_5678, port: 9)
        let c = PathAddress(ipv6High: 0x2001_0db8_0000_0002, low: 0x1, port: 5)
        #expect(a.source == b.source)
        #expect(a.source != c.source)
        #expect(PathAddress.v4(10, 0, 0, 1, port: 5).source == PathAddress.v4(10, 0, 0, 1, port: 6).source)
        // IPv4 clients of a dual-stack socket arrive as ::ffff:a.b.c.d, all in ::/64: each is its own.
        let mapped1 = PathAddress(ipv6High: 0, low: 0x0000_FFFF_C633_6407, port: 5)
        let mapped2 = PathAddress(ipv6High: 0, low: 0x0000_FFFF_C633_6408, port: 5)
        #expect(mapped1.source != mapped2.source)
        #expect(mapped1.source == PathAddress(ipv6High: 0, low: 0x0000_FFFF_C633_6407, port: 9).source)
        // Teredo clients share their relay's /64.
        #expect(PathAddress(ipv6High: 0x2001_0000_4136_E378, low: 1, port: 5).source
                != PathAddress(ipv6High: 0x2001_0000_4136_E378, low: 2, port: 5).source)
    }

    @Test func beyondTheConnectionLimitClientsAreRefusedWithAReason() async throws {
        let pki = try TestPKI()
        var configuration = EndpointConfiguration()
        configuration.maxConnections = 1
        let sim = Simulation(seed: 42, pki: pki, secrets: try pki.secrets(), configuration: configuration)
        sim.addClient()
        _ = try await sim.connect(0)
        sim.addClient()
        await sim.run(for: seconds(2)) { sim.clientError(1) != nil }
        guard case .peer(let code, let reason, _) = sim.clientError(1) else { Issue.record("\(String(describing: sim.clientError(1)))"); return }
        #expect(code == TransportErrorCode.connectionRefused.rawValue)
        #expect(reason.contains("connection limit"))
        #expect(sim.endpoint.stats.refused >= 1)
    }

    @Test func shortInitialsAreDroppedSoTheyCannotAmplify() throws {
        let pki = try TestPKI()
        let endpoint = Endpoint(secrets: try pki.secrets())
        let client = Connection(client: ClientConfiguration(serverName: "localhost", validator: pki.validator), remote: .v4(10, 0, 0, 1, port: 1),
                                now: WireInstant(nanoseconds: 1), random: SplitMix64(seed: 1))
        var buffer = [UInt8](repeating: 0, count: 1500)
        let transmit = try #require(buffer.withUnsafeMutableBytes { client.poll(into: $0, now: WireInstant(nanoseconds: 1)) })
        #expect(transmit.count >= 1200)
        buffer.withUnsafeMutableBytes { endpoint.receive(UnsafeMutableRawBufferPointer(rebasing: $0[..<600]), from: .v4(1, 1, 1, 1, port: 1),
                                                         now: WireInstant(nanoseconds: 1)) }
        #expect(endpoint.connectionCount == 0)
        #expect(buffer.withUnsafeMutableBytes { endpoint.poll(into: $0, now: WireInstant(nanoseconds: 1)) } == nil)
    }
}

@Suite struct VersionAndCloseTests {
    @Test func anUnknownVersionGetsVersionNegotiationAndTheClientSaysWhatToDo() throws {
        let pki = try TestPKI()
        let endpoint = Endpoint(secrets: try pki.secrets())
        var initial = [UInt8](repeating: 0, count: 1200)
        initial.withUnsafeMutableBytes { raw in
            var w = WireWriter(raw)
            w.u8(0xC0); w.u32(0x0A0A_0A0A); w.u8(8); w.uint(0x1111, 8); w.u8(8); w.uint(0x2222, 8)
        }
        initial.withUnsafeMutableBytes { endpoint.receive($0, from: .v4(1, 1, 1, 1, port: 9), now: WireInstant(nanoseconds: 1)) }
        var buffer = [UInt8](repeating: 0, count: 1500)
        let vn = try #require(buffer.withUnsafeMutableBytes { endpoint.poll(into: $0, now: WireInstant(nanoseconds: 1)) })
        let header = try buffer.withUnsafeBytes { try PacketHeader.parse(UnsafeRawBufferPointer(rebasing: $0[..<vn.count])) }
        guard case .versionNegotiation(let destination, let source, _) = header else { Issue.record("\(header)"); return }
        #expect(destination == ConnectionID(0x2222) && source == ConnectionID(0x1111))

        // A client whose version the server doesn't list gives up with an actionable error...
        let client = Connection(client: ClientConfiguration(serverName: "localhost", validator: pki.validator), remote: .v4(1, 1, 1, 1, port: 9),
                                now: WireInstant(nanoseconds: 1), random: SplitMix64(seed: 3))
        func negotiation(destination: ConnectionID, source: ConnectionID) -> [UInt8] {
            var packet = [UInt8]()
            packet.append(0x80); packet += [0, 0, 0, 0]; packet.append(8); packet += destination.bytes; packet.append(8); packet += source.bytes
            packet += [0x0B, 0x0B, 0x0B, 0x0B]
            return packet
        }
        var other = negotiation(destination: client.localID, source: client.originalDestination)
        var listingOurs = other
        listingOurs += [0x53, 0x51, 0x00, 0x01]
        // ...but one that lists our version is forged or stale, and ignored.
        listingOurs.withUnsafeMutableBytes { client.receive($0, from: .v4(1, 1, 1, 1, port: 9), now: WireInstant(nanoseconds: 2)) }
        #expect(client.state == .handshaking)
        // So is one that doesn't echo our Initial's connection IDs: an off-path attacker spoofing the
        // server's address can't see them, and would otherwise end the handshake with one packet.
        for var forged in [negotiation(destination: client.localID, source: ConnectionID(0x1)),
                           negotiation(destination: ConnectionID(0x2), source: client.originalDestination)] {
            forged.withUnsafeMutableBytes { client.receive($0, from: .v4(1, 1, 1, 1, port: 9), now: WireInstant(nanoseconds: 2)) }
            #expect(client.state == .handshaking && client.error == nil)
        }
        other.withUnsafeMutableBytes { client.receive($0, from: .v4(1, 1, 1, 1, port: 9), now: WireInstant(nanoseconds: 2)) }
        #expect(client.error == .versionNegotiation(serverVersions: [0x0B0B_0B0B]))
        #expect("\(client.error!)".contains("upgrade"))
    }

    @Test func closeCarriesTheCodeAndReason() async throws {
        let pki = try TestPKI()
        let sim = Simulation(seed: 50, pki: pki, secrets: try pki.secrets())
        sim.addClient()
        let handle = try await sim.connect(0)
        sim.endpoint.close(handle, code: 7, reason: "removed from channel", now: sim.network.now)
        await sim.run(for: seconds(1)) { sim.clientError(0) != nil }
        #expect(sim.clientError(0) == .peer(code: 7, reason: "removed from channel", application: true))
        await sim.run(for: seconds(5))
        #expect(sim.endpoint.connectionCount == 0, "the server frees the session after the closing period")
    }

    @Test func idleConnectionsTimeOutAndKeepalivesPreventIt() async throws {
        let pki = try TestPKI()
        var server = EndpointConfiguration()
        server.connection.idleTimeout = seconds(30)
        let sim = Simulation(seed: 51, pki: pki, secrets: try pki.secrets(), configuration: server)
        var quiet = ConnectionConfiguration.client
        quiet.keepAliveInterval = 0
        sim.addClient(connection: quiet)
        sim.addClient()  // keepalive every 15 s
        _ = try await sim.connect(0)
        _ = try await sim.connect(1)
        await sim.run(for: seconds(29))
        #expect(sim.clients[0].reconnects == 0)
        await sim.run(for: seconds(2))
        #expect(sim.clientEvents[0].contains(.connection(.closed(.idleTimeout))))
        #expect(sim.clients[1].reconnects == 0 && sim.connected(1))
        await sim.run(for: seconds(120))
        #expect(sim.clients[1].reconnects == 0 && sim.connected(1), "keepalives hold the connection open")
    }

    @Test func aServerThatStopsAnsweringIsNoticedInSecondsNotAtTheIdleTimeout() async throws {
        let pki = try TestPKI()
        let sim = Simulation(seed: 53, pki: pki, secrets: try pki.secrets())
        sim.addClient()  // keepalive every 5 s, stall 3 s, liveness 20 s, idle timeout 300 s
        _ = try await sim.connect(0)
        await sim.run(for: seconds(1))
        // The server crashes, or the path dies: nothing the client sends gets through.
        sim.network.blackhole.insert(sim.serverAddress)
        let start = sim.network.now
        await sim.run(for: seconds(60)) { sim.clientEvents[0].contains(.connection(.stalled)) }
        // The first unanswered packet is the next keepalive (at most 5 s away): stalled 3 s later,
        // given up 20 s later.
        let stalled = sim.network.now.since(start)
        #expect(stalled >= seconds(3) && stalled <= seconds(8) + ms(100), "stalled after \(stalled / 1_000_000) ms")
        await sim.run(for: seconds(60)) { sim.clientEvents[0].contains(.connection(.closed(.peerUnresponsive))) }
        let noticed = sim.network.now.since(start)
        #expect(sim.clientEvents[0].contains(.connection(.closed(.peerUnresponsive))))
        #expect(noticed >= seconds(20) && noticed <= seconds(25) + ms(100), "noticed after \(noticed / 1_000_000) ms")
        #expect(noticed - stalled >= seconds(16), "the stall comes well before the verdict")
        #expect(sim.clients[0].reconnects == 1, "and it handshakes again by itself")
        #expect(sim.clientEvents[0].contains(.reconnecting(.peerUnresponsive)))
        #expect(ConnectionError.peerUnresponsive.clientReconnects && !ConnectionError.handshakeTimeout.clientReconnects)
    }

    @Test func aStallIsReportedThreeSecondsAfterAnUnansweredRequestAndEndsWhenTheServerAnswers() async throws {
        let pki = try TestPKI()
        let sim = Simulation(seed: 56, pki: pki, secrets: try pki.secrets())
        sim.addClient()
        _ = try await sim.connect(0)
        await sim.run(for: seconds(1))
        func count(_ event: ConnectionEvent) -> Int { sim.clientEvents[0].filter { $0 == .connection(event) }.count }
        // A floor request into a dead path: the user must hear within seconds that nobody got it.
        sim.network.blackhole.insert(sim.serverAddress)
        try sim.clients[0].sendControl(Array("floor request".utf8))
        let start = sim.network.now
        await sim.run(for: seconds(10)) { count(.stalled) > 0 }
        let stalled = sim.network.now.since(start)
        #expect(stalled >= seconds(3) && stalled <= seconds(3) + ms(100), "stalled after \(stalled / 1_000_000) ms")
        #expect(sim.clients[0].connection.stalled)
        // Said once, however long the silence lasts short of the verdict.
        await sim.run(for: seconds(10))
        #expect(count(.stalled) == 1 && count(.stallEnded) == 0)
        // The path comes back: the next probe (every half second) is answered, and the same
        // connection carries on.
        sim.network.blackhole.remove(sim.serverAddress)
        let back = sim.network.now
        await sim.run(for: seconds(5)) { count(.stallEnded) > 0 }
        #expect(count(.stallEnded) == 1)
        #expect(sim.network.now.since(back) <= seconds(1), "answered within a probe interval")
        #expect(!sim.clients[0].connection.stalled && sim.clients[0].reconnects == 0 && sim.connected(0))
    }

    @Test func anIdleClientOnALossyLinkIsNotTakenForDead() async throws {
        let pki = try TestPKI()
        var conditions = SimulatedNetwork.Conditions()
        conditions.loss = 0.2  // each way: a keepalive's round trip fails 36 % of the time
        let sim = Simulation(seed: 54, conditions: conditions, pki: pki, secrets: try pki.secrets())
        sim.addClient()
        _ = try await sim.connect(0)
        // Two idle hours: 1,440 keepalives. Were the verdict left to the next keepalive alone, two
        // failed round trips in a row (13 % of them) would each have closed the session.
        await sim.run(for: seconds(7_200))
        #expect(sim.clients[0].reconnects == 0 && sim.connected(0), "\(sim.clientEvents[0].suffix(3))")
    }

    @Test func livenessIsJudgedOnlyWhileKeepalivesRunAndAcrossASocketReplacedInPlace() async throws {
        let pki = try TestPKI()
        let sim = Simulation(seed: 55, pki: pki, secrets: try pki.secrets())
        sim.addClient()
        _ = try await sim.connect(0)
        await sim.run(for: seconds(1))
        // In the background (keepalives off) something goes unanswered: no verdict and no stall, the
        // session waits for the app to wake (and the idle timeout, 300 s).
        sim.clients[0].connection.keepAlive = false
        sim.network.blackhole.insert(sim.serverAddress)
        try sim.clients[0].sendControl(Array("renewal".utf8))
        await sim.run(for: seconds(120))
        #expect(sim.clients[0].reconnects == 0 && !sim.clientEvents[0].contains(.connection(.closed(.peerUnresponsive))))
        #expect(!sim.clientEvents[0].contains(.connection(.stalled)))
        // Back in the foreground with the path still dead: counted from now, not from two minutes ago.
        sim.clients[0].connection.keepAlive = true
        var start = sim.network.now
        await sim.run(for: seconds(60)) { sim.clientEvents[0].contains(.connection(.closed(.peerUnresponsive))) }
        var noticed = sim.network.now.since(start)
        #expect(noticed >= seconds(20) && noticed <= seconds(26), "noticed after \(noticed / 1_000_000) ms")

        // The new connection's socket keeps failing (no route) and is replaced in place every 2 s:
        // that is no news of the server, and the count goes on.
        sim.network.blackhole.remove(sim.serverAddress)
        await sim.run(for: seconds(10)) { sim.connected(0) }
        #expect(sim.connected(0))
        sim.network.blackhole.insert(sim.serverAddress)
        start = sim.network.now
        let closes = sim.clientEvents[0].filter { $0 == .connection(.closed(.peerUnresponsive)) }.count
        for _ in 0 ..< 30 where sim.clientEvents[0].filter({ $0 == .connection(.closed(.peerUnresponsive)) }).count == closes {
            await sim.run(for: seconds(2))
            sim.clients[0].migrate(now: sim.network.now, newPath: false)
        }
        noticed = sim.network.now.since(start)
        #expect(sim.clientEvents[0].filter { $0 == .connection(.closed(.peerUnresponsive)) }.count == closes + 1)
        #expect(noticed <= seconds(38), "noticed after \(noticed / 1_000_000) ms")
    }

    @Test func aHandshakeWithNoAnswerTimesOutWithAHint() async throws {
        let pki = try TestPKI()
        let sim = Simulation(seed: 52, pki: pki, secrets: try pki.secrets())
        sim.addClient()
        sim.network.blackhole.insert(sim.serverAddress)
        await sim.run(for: seconds(15))
        #expect(sim.clientError(0) == .handshakeTimeout)
        #expect("\(ConnectionError.handshakeTimeout)".contains("squelchd is running"))
    }
}

/// The endpoint's counters that squelchd exports as metrics: handshakes by outcome, and what its
/// connections dropped, summed over connections that have since closed.
@Suite struct EndpointCounterTests {
    @Test func droppedPacketsAreSummedAcrossConnectionsAndKeptAfterTheyClose() async throws {
        let pki = try TestPKI()
        let sim = Simulation(seed: 41, conditions: .init(jitter: 0), pki: pki, secrets: try pki.secrets())
        sim.addClient()
        let handle = try await sim.connect(0)
        #expect(sim.endpoint.stats.handshakesCompleted == 1)
        #expect(sim.endpoint.stats.handshakesFailed == 0)
        // One audio datagram from the client, taken off the wire and delivered three times as is
        // (one fresh, two replays) and once with its last byte (the tag) changed.
        sim.sendDatagram(client: 0, [1, 2, 3])
        let sent = sim.network.queue.removeLast()
        var forged = sent.bytes
        forged[forged.count - 1] ^= 0x01
        for var bytes in [sent.bytes, sent.bytes, sent.bytes, forged] {
            bytes.withUnsafeMutableBytes { sim.endpoint.receive($0, from: sent.from, now: sim.network.now) }
        }
        #expect(sim.endpoint.connection(handle)?.stats.droppedReplayed == 2)
        #expect(sim.endpoint.connection(handle)?.stats.droppedUndecryptable == 1)
        #expect(sim.endpoint.troubleTotals[.replayed] == 2)
        #expect(sim.endpoint.troubleTotals[.undecryptable] == 1)
        // A datagram too short to name a connection belongs to none.
        var stray: [UInt8] = [0x40]
        stray.withUnsafeMutableBytes { sim.endpoint.receive($0, from: sent.from, now: sim.network.now) }
        #expect(sim.endpoint.stats.dropped == 1)
        // The connection closes; what it counted stays in the endpoint's totals.
        sim.clients[0].close(now: sim.network.now)
        #expect(await sim.run(for: seconds(5)) { sim.endpoint.connectionCount == 0 })
        #expect(sim.endpoint.troubleTotals[.replayed] == 2)
        #expect(sim.endpoint.troubleTotals[.undecryptable] == 1)
        #expect(sim.endpoint.stats.handshakesFailed == 0, "a completed handshake that closes did not fail")
    }

    @Test func aClientThatGivesUpMidHandshakeCountsAsAFailedHandshake() async throws {
        let pki = try TestPKI()
        let stranger = try TestPKI(name: "Another CA")
        let sim = Simulation(seed: 42, pki: stranger, secrets: try pki.secrets())
        sim.addClient()
        // The client distrusts the server's certificate and closes during the handshake.
        await sim.run(for: seconds(10)) { sim.endpoint.stats.accepted == 1 && sim.endpoint.connectionCount == 0 }
        #expect(sim.endpoint.stats.accepted == 1)
        #expect(sim.endpoint.connectionCount == 0)
        #expect(sim.endpoint.stats.handshakesFailed == 1)
        #expect(sim.endpoint.stats.handshakesCompleted == 0)
    }
}

@Suite struct LargeChainTests {
    /// A server chain larger than the 3× budget of the client's first datagram (3,600 bytes): the
    /// server sends what the budget allows and waits; the client's acknowledgement of what arrived is
    /// what lifts the limit. It must come at once, so a big chain costs a round trip, not a probe
    /// timeout.
    @Test func aChainOverTheFirstFlightsBudgetCostsARoundTripNotAProbeTimeout() async throws {
        let pki = try TestPKI()
        var conditions = SimulatedNetwork.Conditions()
        conditions.delay = ms(20)
        conditions.reorder = 0
        func handshakeTime(names: [String]) async throws -> (UInt64, Int) {
            let identity = try pki.identity(names: names)
            let sim = Simulation(seed: 61, conditions: conditions, pki: pki, secrets: try pki.secrets(identity: identity))
            sim.addClient()
            let start = sim.network.now
            _ = try await sim.connect(0)
            return (sim.network.now.nanoseconds - start.nanoseconds, identity.derChain.reduce(0) { $0 + $1.count })
        }
        let (small, smallChain) = try await handshakeTime(names: ["localhost"])
        let (large, largeChain) = try await handshakeTime(names: ["localhost"] + (0..<250).map { "relay-\($0).squelch.example.net" })
        #expect(smallChain < 1_000)
        #expect(largeChain > 6_000, "the chain must be over the first flight's 3× budget")
        #expect(large <= small + ms(2 * 20 + 5), "a \(largeChain)-byte chain took \(large / 1_000_000) ms, against \(small / 1_000_000) ms")
    }

    /// Near the 16 KiB a chain may have, and with a fifth of the datagrams lost both ways, the
    /// handshake still completes; the client's acknowledgements stay bounded by the server's flight.
    @Test func aChainNearTheLimitConnectsOverALossyLink() async throws {
        let pki = try TestPKI()
        let identity = try pki.identity(names: ["localhost"] + (0..<520).map { "relay-\($0).squelch.example.net" })
        let chain = identity.derChain.reduce(0) { $0 + $1.count }
        #expect(chain > 15_000 && chain <= 16 * 1024)
        for seed in UInt64(70)..<UInt64(76) {
            var conditions = SimulatedNetwork.Conditions()
            conditions.loss = seed == 70 ? 0 : 0.2
            let sim = Simulation(seed: seed, conditions: conditions, pki: pki, secrets: try pki.secrets(identity: identity))
            sim.addClient()
            _ = try await sim.connect(0)
            if seed == 70 {
                // Loss-free: the client sent at most one datagram per 1,200 bytes of the flight, plus
                // its ClientHello and Finished.
                let clientBytes = sim.clients[0].connection.stats.bytesSent
                #expect(clientBytes <= 1_200 * (chain / 1_200 + 4), "the client sent \(clientBytes) bytes for a \(chain)-byte chain")
            }
        }
    }
}
