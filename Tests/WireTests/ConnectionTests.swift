import Crypto
import Foundation
import SeededRandom
import Testing
import X509
@testable import Wire

@Suite struct HandshakeTests {
    @Test func handshakeControlAndDatagramsOnAPerfectNetwork() async throws {
        let pki = try TestPKI()
        let sim = Simulation(seed: 1, pki: pki, secrets: try pki.secrets())
        sim.addClient()
        #expect(await sim.run(for: seconds(5)) { sim.connected(0) && sim.endpoint.connection(sim.serverHandle(of: 0)!)?.state == .established })
        let handle = try #require(sim.serverHandle(of: 0))
        try sim.clients[0].sendControl(Array("join dispatch".utf8))
        try sim.endpoint.sendControl(Array("welcome".utf8), to: handle, now: sim.network.now)
        sim.sendDatagram(client: 0, [1, 2, 3])
        #expect(sim.sendDatagram(server: handle, [9, 8, 7, 6]))
        await sim.run(for: seconds(1))
        #expect(sim.serverControlMessages(handle) == [Array("join dispatch".utf8)])
        #expect(sim.controlMessages(client: 0) == [Array("welcome".utf8)])
        #expect(sim.serverDatagrams.map(\.1) == [[1, 2, 3]])
        #expect(sim.clientDatagrams[0] == [[9, 8, 7, 6]])
        // One round trip: the client is connected one RTT (2 × 20 ms) after it starts, at simulated
        // time 1000 s + 40 ms.
        #expect(sim.clientEvents[0].first == .connection(.connected))
        #expect(sim.trace.first { $0.contains("C0 connection(Wire.ConnectionEvent.connected)") }?.hasPrefix("\(seconds(1000) + ms(40)) ") == true,
                "\(sim.trace.prefix(3))")
    }
}

/// The receiver's ACK policy (protocol §11.2): audio datagrams every tenth packet, everything else every
/// second one.
@Suite struct AckFrequencyTests {
    /// One client connected a second ago over a link with a fixed 20 ms delay each way.
    static func connectedOverASteadyLink(seed: UInt64) async throws -> (Simulation, Endpoint.Handle, Connection) {
        let pki = try TestPKI()
        var conditions = SimulatedNetwork.Conditions()
        conditions.jitter = 0
        let sim = Simulation(seed: seed, conditions: conditions, pki: pki, secrets: try pki.secrets())
        sim.addClient()
        let handle = try await sim.connect(0)
        await sim.run(for: seconds(1))
        return (sim, handle, try #require(sim.endpoint.connection(handle)))
    }

    /// Audio asks for no acknowledgement (protocol §11.2): a listener sends nothing back for it, and
    /// the server keeps no record of it to time out or probe for. Its packet numbers ride in the
    /// next ACK that control causes, which keeps the server's packet-number encoding short.
    @Test func audioIsNeverAcknowledgedForItsOwnSake() async throws {
        let (sim, handle, server) = try await Self.connectedOverASteadyLink(seed: 3)
        let clientSentBefore = sim.clients[0].connection.stats.packetsSent
        let serverSentBefore = server.stats.packetsSent
        for i in 0..<95 {
            #expect(sim.sendDatagram(server: handle, [UInt8(i)]))
            await sim.run(for: ms(20))
        }
        await sim.run(for: ms(500))
        #expect(sim.clientDatagrams[0].count == 95)
        #expect(sim.clients[0].connection.stats.packetsSent == clientSentBefore, "the listener answered audio")
        #expect(server.stats.packetsSent - serverSentBefore == 95, "the server probed for an answer to audio")
        #expect(server.stats.packetsLost == 0)
        let lastAudio = server.appNextPN - 1

        // Control messages are acknowledged every second packet, and those ACKs cover the audio.
        let controlBefore = sim.clients[0].connection.stats.packetsSent
        for i in 0..<10 {
            try sim.endpoint.sendControl([UInt8(i)], to: handle, now: sim.network.now)
            await sim.run(for: ms(5))
        }
        await sim.run(for: ms(200))
        #expect(sim.controlMessages(client: 0).count == 10)
        #expect(sim.clients[0].connection.stats.packetsSent - controlBefore >= 5)
        #expect((server.largestAckedByPeer ?? 0) > lastAudio)
    }

    /// A listener hears nothing but audio all through a long burst, and answers none of it; its
    /// keepalive still goes every 5 s after it last sent something (not after it last heard
    /// something), so the server hears from it, and a keepalive lost on the way is sent again at the
    /// next liveness probe, not 5 s later (audio arriving is no answer to it).
    @Test func aListenerHearingOnlyAudioKeepsTheServerHearingFromIt() async throws {
        let (sim, handle, server) = try await Self.connectedOverASteadyLink(seed: 4)
        let client = sim.clients[0].connection
        let sentBefore = client.stats.packetsSent
        var longestSilence: UInt64 = 0
        var lostKeepalive: WireInstant?
        for i in 0..<750 {  // 15 s of audio
            #expect(sim.sendDatagram(server: handle, [UInt8(truncatingIfNeeded: i)]))
            // The second keepalive of the burst is lost on the way (after the first, the client
            // knows the round trip, as it would from its join: the probe waits for max(0.5 s, PTO)).
            if lostKeepalive == nil, let due = client.keepAliveDeadline, due <= sim.network.now + ms(20), i > 300 {
                lostKeepalive = due
                sim.network.blackhole.insert(sim.clientAddresses[0])
            } else if let lost = lostKeepalive, sim.network.now > lost + ms(100) {
                sim.network.blackhole.remove(sim.clientAddresses[0])
            }
            await sim.run(for: ms(20))
            longestSilence = max(longestSilence, sim.network.now.since(server.lastReceiveTime))
        }
        #expect(lostKeepalive != nil)
        #expect(sim.clientDatagrams[0].count == 750)
        // Keepalives every 5 s; the lost one again within the 0.5 s probe (plus a round trip).
        #expect(longestSilence <= seconds(5) + ms(700), "the server went \(longestSilence / 1_000_000) ms without a word")
        #expect(client.stats.packetsSent - sentBefore <= 8, "\(client.stats.packetsSent - sentBefore) packets for 15 s of audio")
        #expect(client.state == .established)
        #expect(!sim.clientEvents[0].contains(.connection(.stalled)))
    }

}

/// The order in which the endpoint serves connections with output.
@Suite struct OutputOrderTests {
    /// A reply queued for one connection leaves before the notices the same command then queued for
    /// all the others: a floor grant must not wait behind 200 `taken`s.
    @Test func connectionsAreServedInTheOrderTheirOutputWasQueued() async throws {
        let pki = try TestPKI()
        let sim = Simulation(seed: 11, pki: pki, secrets: try pki.secrets())
        let count = 6
        for _ in 0..<count { sim.addClient() }
        var handles: [Endpoint.Handle] = []
        for index in 0..<count { handles.append(try await sim.connect(index)) }
        await sim.run(for: seconds(1))  // handshakes and their ACKs settle
        for order in [Array(0..<count), Array((0..<count).reversed()), [3, 0, 5, 1, 4, 2]] {
            for index in order { try sim.endpoint.sendControl([UInt8(index)], to: handles[index], now: sim.network.now) }
            var destinations: [PathAddress] = []
            while let transmit = sim.buffer.withUnsafeMutableBytes({ sim.endpoint.poll(into: $0, now: sim.network.now) }) {
                destinations.append(transmit.address)
                sim.network.send(Array(sim.buffer[..<transmit.count]), from: sim.serverAddress, to: transmit.address)
            }
            #expect(destinations == order.map { sim.clientAddresses[$0] })
            await sim.run(for: seconds(1))
        }
        for index in 0..<count { #expect(sim.controlMessages(client: index) == [[UInt8(index)], [UInt8(index)], [UInt8(index)]]) }
    }

    /// Stateless replies leave in the order their triggers came, ahead of connections' output.
    @Test func statelessRepliesAreServedInArrivalOrder() throws {
        let pki = try TestPKI()
        let endpoint = Endpoint(secrets: try pki.secrets())
        let now = WireInstant(nanoseconds: 1_000_000_000)
        let senders = (0..<5).map { PathAddress(ipv4: 0x0A00_0001 + UInt32($0), port: 4000) }
        for (index, sender) in senders.enumerated() {
            // A short-header packet for a connection ID the endpoint doesn't know: a stateless reset.
            var datagram = [UInt8](repeating: UInt8(index), count: 60)
            datagram[0] = PacketHeader.fixedBit
            datagram.withUnsafeMutableBytes { endpoint.receive($0, from: sender, now: now) }
        }
        var buffer = [UInt8](repeating: 0, count: 1500)
        var destinations: [PathAddress] = []
        while let transmit = buffer.withUnsafeMutableBytes({ endpoint.poll(into: $0, now: now) }) { destinations.append(transmit.address) }
        #expect(destinations == senders)
        #expect(endpoint.stats.statelessResetsSent == senders.count)
    }
}

extension Simulation {
    func clientError(_ index: Int) -> ConnectionError? {
        clientEvents[index].lazy.compactMap { if case .connection(.closed(let e)) = $0 { return e } else { return nil } }.first
    }
    /// Connects client `index` and returns the server's handle for it.
    func connect(_ index: Int) async throws -> Endpoint.Handle {
        let ok = await run(for: seconds(10)) {
            connected(index) && clients[index].connection.handshakeConfirmed
                && serverHandle(of: index).flatMap { endpoint.connection($0)?.state } == .established
        }
        try #require(ok, "client \(index) did not connect: \(String(describing: clientError(index)))")
        return try #require(serverHandle(of: index))
    }
}

@Suite struct HandshakeFailureTests {
    func failure(pki: TestPKI, clientPKI: TestPKI? = nil, identity: ServerIdentity, serverName: String = "localhost") async throws -> ConnectionError? {
        let sim = Simulation(seed: 2, pki: clientPKI ?? pki, secrets: try pki.secrets(identity: identity))
        sim.addClient(serverName: serverName)
        await sim.run(for: seconds(5)) { sim.clientError(0) != nil }
        #expect(!sim.connected(0))
        // The server never reports a connection for a client that refused it.
        #expect(!sim.serverEvents.contains { $0.1 == .connected })
        return sim.clientError(0)
    }

    @Test func aServerFromAnotherCAIsUntrusted() async throws {
        let pki = try TestPKI(), other = try TestPKI(name: "Some Other CA")
        let error = try await failure(pki: pki, clientPKI: other, identity: try pki.identity())
        guard case .handshake(.untrustedCertificate) = error else { Issue.record("got \(String(describing: error))"); return }
        #expect("\(error!)".contains("pinned CA"))
    }

    @Test func anExpiredCertificateSaysExpired() async throws {
        let pki = try TestPKI()
        let identity = try pki.identity(notBefore: Date().addingTimeInterval(-86_400 * 2), notAfter: Date().addingTimeInterval(-86_400))
        let error = try await failure(pki: pki, identity: identity)
        guard case .handshake(.certificateExpired) = error else { Issue.record("got \(String(describing: error))"); return }
    }

    @Test func theWrongNameSaysWhichNameWasExpected() async throws {
        let pki = try TestPKI()
        let error = try await failure(pki: pki, identity: try pki.identity(names: ["relay.example.org"]), serverName: "localhost")
        #expect(error == .handshake(.wrongServerName(expected: "localhost")))
    }

    @Test func anIPAddressIsCheckedAgainstIPSubjectAltNames() async throws {
        let pki = try TestPKI()
        let sim = Simulation(seed: 3, pki: pki, secrets: try pki.secrets(identity: try pki.identity(names: ["127.0.0.1"])))
        sim.addClient(serverName: "127.0.0.1")
        _ = try await sim.connect(0)
        let wrong = try await failure(pki: pki, identity: try pki.identity(names: ["127.0.0.1"]), serverName: "127.0.0.2")
        #expect(wrong == .handshake(.wrongServerName(expected: "127.0.0.2")))
    }

    /// A certificate from the pinned CA that was issued for clients only (EKU clientAuth) can't
    /// stand in for the server; one with serverAuth, or with no EKU at all, can.
    @Test func aCertificateWhoseUsageLacksServerAuthCannotServe() async throws {
        let pki = try TestPKI()
        let error = try await failure(pki: pki, identity: try pki.identity(usages: [.clientAuth]))
        guard case .handshake(.notForServers) = error else { Issue.record("got \(String(describing: error))"); return }
        #expect("\(error!)".contains("serverAuth"))
        for usages: [ExtendedKeyUsage.Usage]? in [[.clientAuth, .serverAuth], [.any], nil] {
            let sim = Simulation(seed: 5, pki: pki, secrets: try pki.secrets(identity: try pki.identity(usages: usages)))
            sim.addClient()
            _ = try await sim.connect(0)
        }
    }

    @Test func anAllZeroSharedSecretIsRejected() throws {
        // u = 0 is a low-order point: X25519 with it yields all zeros whatever the private key.
        let key = Curve25519.KeyAgreement.PrivateKey()
        #expect(throws: HandshakeFailure.zeroSharedSecret) {
            try HandshakeCrypto.sharedSecret(key, peerShare: [UInt8](repeating: 0, count: 32))
        }
        let good = Curve25519.KeyAgreement.PrivateKey().publicKey.rawRepresentation
        #expect(try HandshakeCrypto.sharedSecret(key, peerShare: Array(good)).count == 32)
    }

    @Test func theServerLearnsWhyTheClientRefused() async throws {
        let pki = try TestPKI(), other = try TestPKI(name: "Other")
        let sim = Simulation(seed: 4, pki: other, secrets: try pki.secrets())
        sim.addClient()
        await sim.run(for: seconds(5)) { sim.serverEvents.contains { if case .closed = $0.1 { return true }; return false } }
        let closed = sim.serverEvents.compactMap { if case .closed(let e) = $0.1 { return e } else { return nil } }.first
        guard case .peer(let code, let reason, false) = closed else { Issue.record("got \(String(describing: closed))"); return }
        #expect(code == TransportErrorCode.badCertificate.rawValue)
        #expect(reason.contains("pinned CA"))
    }
}

@Suite struct PacketProtectionTests {
    /// Connects one client and returns the simulation with the server handle.
    func connected(seed: UInt64 = 10) async throws -> (Simulation, Endpoint.Handle) {
        let pki = try TestPKI()
        let sim = Simulation(seed: seed, pki: pki, secrets: try pki.secrets())
        sim.addClient()
        return (sim, try await sim.connect(0))
    }

    /// Seals one datagram from the client without sending it.
    func sealed(_ sim: Simulation, _ payload: [UInt8]) -> [UInt8] {
        var buffer = [UInt8](repeating: 0, count: 1500)
        let count = payload.withUnsafeBytes { p in buffer.withUnsafeMutableBytes { sim.clients[0].sendDatagram(p, into: $0, now: sim.network.now)!.count } }
        return Array(buffer[..<count])
    }

    func deliver(_ sim: Simulation, _ bytes: [UInt8]) {
        var copy = bytes
        copy.withUnsafeMutableBytes { raw in
            sim.endpoint.receive(raw, from: sim.clientAddresses[0], now: sim.network.now) { handle, payload in
                sim.serverDatagrams.append((handle, Array(payload)))
            }
        }
    }

    @Test func tamperedReplayedAndForgedPacketsAreDroppedAndCounted() async throws {
        let (sim, handle) = try await connected()
        let server = try #require(sim.endpoint.connection(handle))
        let packet = sealed(sim, Array("audio".utf8))
        // Every single-byte change anywhere in the packet is caught (header protection and AEAD).
        for index in packet.indices.dropFirst(9) {
            var tampered = packet
            tampered[index] ^= 0x01
            deliver(sim, tampered)
        }
        #expect(sim.serverDatagrams.isEmpty)
        #expect(server.stats.droppedUndecryptable + server.stats.droppedMalformed == packet.count - 9)
        deliver(sim, packet)
        #expect(sim.serverDatagrams.count == 1)
        deliver(sim, packet)  // a replay
        #expect(sim.serverDatagrams.count == 1)
        #expect(server.stats.droppedReplayed == 1)
        // A forgery with the right connection ID but random contents.
        var rng = SplitMix64(seed: 99)
        var forged = Array(packet.prefix(9)) + (0..<40).map { _ in UInt8(truncatingIfNeeded: rng.next()) }
        forged[0] = 0x40 | (forged[0] & 0x03)
        deliver(sim, forged)
        #expect(sim.serverDatagrams.count == 1)
        #expect(server.state == .established)
    }

    /// With many gaps to report, the ACK riding on an audio datagram is sized around the payload.
    /// It was sized to the whole packet, and then a large payload no longer fit: `sendDatagram`
    /// failed, and the ACK it had written counted as sent.
    @Test func aLargeDatagramStillFitsBesideAnAckOfManyRanges() async throws {
        let (sim, handle) = try await connected()
        let client = sim.clients[0]
        var buffer = [UInt8](repeating: 0, count: 1500)
        // Every other datagram from the server reaches the client: dozens of ranges to acknowledge.
        for i in 0..<80 {
            let transmit = [UInt8(i)].withUnsafeBytes { p in buffer.withUnsafeMutableBytes { sim.endpoint.sendDatagram(p, to: handle, into: $0, now: sim.network.now) } }
            let count = try #require(transmit).count
            guard i % 2 == 0 else { continue }
            var bytes = Array(buffer[..<count])
            bytes.withUnsafeMutableBytes { client.receive($0, from: sim.serverAddress, now: sim.network.now) }
        }
        #expect(client.connection.ackElicitingSinceAck > 0, "\(client.connection.received.ranges.count) ranges, \(client.connection.ackElicitingSinceAck)")
        // Large enough that the ACK and the payload together overflow, small enough that an ACK is tried.
        let payload = [UInt8](repeating: 7, count: 1_115)
        let sent = payload.withUnsafeBytes { p in buffer.withUnsafeMutableBytes { client.sendDatagram(p, into: $0, now: sim.network.now) } }
        #expect(sent != nil, "the payload fits; the ACK gives way")
    }

    @Test func oldPacketsOutsideTheReplayWindowAreDropped() async throws {
        let (sim, handle) = try await connected()
        let server = try #require(sim.endpoint.connection(handle))
        let old = sealed(sim, [1])
        for _ in 0..<Int(ReplayWindow.size) + 10 { _ = sealed(sim, [2]) }
        deliver(sim, sealed(sim, [3]))
        let before = server.stats.droppedReplayed + server.stats.droppedUndecryptable
        deliver(sim, old)
        #expect(sim.serverDatagrams.map(\.1) == [[3]])
        // Its truncated packet number now decodes near the newest packet, so it fails the AEAD or
        // the window; either way it is dropped and counted.
        #expect(server.stats.droppedReplayed + server.stats.droppedUndecryptable == before + 1)
    }

    @Test func keyUpdateKeepsTrafficFlowingBothWays() async throws {
        let (sim, handle) = try await connected()
        let server = try #require(sim.endpoint.connection(handle))
        let client = sim.clients[0].connection
        #expect(client.initiateKeyUpdate())
        for i in 0..<5 { sim.sendDatagram(client: 0, [UInt8(i)]) }
        await sim.run(for: ms(200))
        #expect(server.keyGeneration == 1)
        #expect(sim.serverDatagrams.count == 5)
        // The server followed, so its packets now use the new keys too.
        #expect(sim.sendDatagram(server: handle, [42]))
        await sim.run(for: ms(200))
        #expect(sim.clientDatagrams[0] == [[42]])
        #expect(client.keyGeneration == 1)
        // A second update after the first was acknowledged.
        try sim.clients[0].sendControl([1])
        await sim.run(for: ms(200))
        #expect(client.initiateKeyUpdate())
        sim.sendDatagram(client: 0, [7])
        await sim.run(for: ms(200))
        #expect(server.keyGeneration == 2)
        #expect(sim.serverDatagrams.last?.1 == [7])
    }

    /// RFC 9001 §6.6: a peer that never acknowledges a packet under the current keys blocks the
    /// next update, and the sender must not go past the confidentiality limit (2^23 packets for
    /// AES-128-GCM) under them. The packets sealed so far are set close to it rather than sent.
    @Test func aKeyUpdateThatCannotHappenClosesBeforeTheAEADLimit() async throws {
        let (sim, _) = try await connected()
        let client = sim.clients[0].connection
        #expect(client.suite == .aes128GCMSHA256)
        #expect(client.initiateKeyUpdate())
        client.sentInSendPhase = CipherSuite.aes128GCMSHA256.confidentialityLimit - 20
        // Nothing is delivered meanwhile, so no ACK makes the next update possible.
        for i in 0..<4 { sim.sendDatagram(client: 0, [UInt8(i)]) }
        #expect(client.state == .established)
        sim.sendDatagram(client: 0, [4])
        #expect(client.state == .closing)
        #expect(client.error == .local(code: TransportErrorCode.aeadLimitReached.rawValue,
                                       reason: "the peer acknowledged no packet under the current keys, so they could not be updated before the AEAD limit"))
        #expect(client.sentInSendPhase < CipherSuite.aes128GCMSHA256.confidentialityLimit)
        await sim.run(for: ms(200))
        #expect(sim.serverDatagrams.map(\.1) == [[0], [1], [2], [3]])
        #expect(sim.endpoint.handles.isEmpty || sim.endpoint.connection(sim.endpoint.handles[0])?.state != .established)
    }

    @Test func keysUpdateByThemselvesAfterTheConfiguredPacketCount() async throws {
        let pki = try TestPKI()
        var config = ConnectionConfiguration.client
        config.keyUpdateInterval = 50
        let sim = Simulation(seed: 11, pki: pki, secrets: try pki.secrets())
        sim.addClient(connection: config)
        let handle = try await sim.connect(0)
        for round in 0..<10 {
            for i in 0..<20 { sim.sendDatagram(client: 0, [UInt8(round), UInt8(i)]) }
            await sim.run(for: ms(100))
        }
        #expect(sim.serverDatagrams.count == 200)
        // Audio asks for no ACK, so each update asked for one with a PING before it could go.
        let client = sim.clients[0].connection
        #expect(client.sendGeneration >= 3)
        #expect(sim.endpoint.connection(handle)?.keyGeneration == client.sendGeneration)
        #expect(sim.endpoint.connection(handle)?.sendGeneration == client.sendGeneration, "the server followed")
    }
}
