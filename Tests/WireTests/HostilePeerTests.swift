import Crypto
import Foundation
import SeededRandom
import Testing
@testable import Wire

/// What a peer that follows the wire format but not the spirit of the protocol can do: each case once
/// crashed a process, froze its event loop or grew memory without limit, or ended a healthy session.
@Suite struct HostilePeerTests {
    @Test func aHugeIdleTimeoutIsClampedInsteadOfOverflowingEveryDeadline() throws {
        // 2^62 − 1 ms in nanoseconds overflows UInt64: the server trapped on any Initial carrying it.
        var parameters = TransportParameters()
        parameters.maxIdleTimeout = (1 << 62) - 1
        var bytes = [UInt8](repeating: 0, count: 256)
        let count = bytes.withUnsafeMutableBytes { buffer -> Int in
            var writer = WireWriter(buffer)
            parameters.encode(into: &writer)
            return writer.offset
        }
        let decoded = try Array(bytes[..<count]).withUnsafeBytes { raw in
            var reader = WireReader(raw, offset: 0)
            return try TransportParameters.decode(&reader, end: count)
        }
        #expect(decoded.maxIdleTimeout == TransportParameters.maximumIdleTimeout)
        // And 2^32 ms as nanoseconds still leaves room to add it to any instant.
        #expect(TransportParameters.maximumIdleTimeout.multipliedReportingOverflow(by: 1_000_000).overflow == false)
    }

    @Test func oneByteFragmentsOutOfOrderAreRefusedBeforeTheyCostMoreThanTwiceTheLimit() {
        var buffer = ReassemblyBuffer(limit: 64 * 1024)
        var output: [UInt8] = []
        var accepted = 0
        var refused = false
        // From the far end backwards, one byte each: every fragment is held, none delivered.
        for offset in stride(from: UInt64(64 * 1024 - 1), through: 1, by: -1) {
            do {
                try [UInt8(truncatingIfNeeded: offset)].withUnsafeBytes { try buffer.receive(offset: offset, data: $0, into: &output) }
                accepted += 1
            } catch {
                refused = true
                break
            }
        }
        #expect(refused, "a flood of tiny fragments is a protocol error")
        #expect(buffer.heldCost <= 2 * 64 * 1024)
        #expect(accepted == 2 * 64 * 1024 / (1 + ReassemblyBuffer.fragmentCharge))
        #expect(output.isEmpty)
    }

    @Test func aLossyPathsFragmentsInAnyOrderStillAssembleExactly() throws {
        // 900 packets' worth (about 1 MB, a large roster) arriving in a random order, some twice, some
        // cut differently on retransmission: the stream comes out whole and in order.
        var random = SplitMix64(seed: 77)
        let stream = (0..<(900 * 1100)).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ $0 >> 8) }
        var fragments: [Range<Int>] = stride(from: 0, to: stream.count, by: 1100).map { $0..<min($0 + 1100, stream.count) }
        for _ in 0..<200 {
            let start = Int(random.next() % UInt64(stream.count - 600))
            fragments.append(start..<(start + 500))
        }
        for i in fragments.indices.reversed() {
            fragments.swapAt(i, Int(random.next() % UInt64(i + 1)))
        }
        var buffer = ReassemblyBuffer(limit: 1 << 20)
        var output: [UInt8] = []
        for range in fragments {
            try stream[range].withUnsafeBytes { try buffer.receive(offset: UInt64(range.lowerBound), data: $0, into: &output) }
        }
        #expect(output == stream)
        #expect(buffer.delivered == UInt64(stream.count))
        #expect(buffer.heldCost == 0)
    }

    @Test func retiringConnectionIDsInALoopKeepsTheServersTableSmall() async throws {
        let pki = try TestPKI()
        let sim = Simulation(seed: 60, pki: pki, secrets: try pki.secrets())
        sim.addClient()
        let handle = try await sim.connect(0)
        await sim.run(for: seconds(1))
        // Fifty moves, each retiring the ID in use: each time the server issues a replacement.
        for move in 0..<50 {
            sim.clientAddresses[0].port = UInt16(40_000 + move)
            sim.clients[0].connection.migrate(now: sim.network.now)
            try sim.clients[0].sendControl([UInt8(move)])
            await sim.run(for: ms(300))
        }
        let server = try #require(sim.endpoint.connection(handle))
        #expect(server.issuedIDs.count == 4, "only the active IDs are kept, not every one ever retired")
        #expect(server.nextIssuedSequence > 40, "and the moves did retire and replace IDs")
        #expect(sim.serverControlMessages(handle).count == 50 && sim.connected(0))
    }

    @Test func retiringAnIDTheServerNeverIssuedClosesTheConnection() async throws {
        let pki = try TestPKI()
        let sim = Simulation(seed: 61, pki: pki, secrets: try pki.secrets())
        sim.addClient()
        let handle = try await sim.connect(0)
        await sim.run(for: seconds(1))
        let sent = try #require(sim.endpoint.connection(handle)).highestSentSequence
        // The next replacement's number is predictable: a client retiring it before it was sent
        // would make the server issue IDs as fast as it can send packets.
        let client = sim.clients[0].connection
        client.peerIDs.append(.init(sequence: sent + 1, id: ConnectionID(99), resetToken: nil, retired: true))
        client.pendingRetireIDs |= 1 << ((sent + 1) % 64)
        try sim.clients[0].sendControl([1])
        await sim.run(for: seconds(1))
        #expect(sim.clientEvents[0].contains { if case .connection(.closed(.peer(0x0a, _, false))) = $0 { return true } else { return false } },
                "\(sim.clientEvents[0].suffix(3))")
    }

    @Test func aResetTokenOfARetiredIDNoLongerEndsTheSession() async throws {
        let pki = try TestPKI()
        let secrets = try pki.secrets()
        let sim = Simulation(seed: 62, pki: pki, secrets: secrets)
        sim.addClient()
        _ = try await sim.connect(0)
        await sim.run(for: seconds(1))
        let old = sim.clients[0].connection.peerID
        sim.clientAddresses[0].port = 41_000
        sim.clients[0].connection.migrate(now: sim.network.now)
        try sim.clients[0].sendControl([1])
        await sim.run(for: seconds(1))
        #expect(sim.clients[0].connection.peerID != old)
        // What the server answers a late packet to the retired ID with (or what anyone who saw that ID
        // can ask it for): a reset with the old ID's token.
        func reset(for id: ConnectionID) -> [UInt8] { [0x45] + [UInt8](repeating: 0x33, count: 20) + secrets.resetToken(for: id) }
        var datagram = reset(for: old)
        datagram.withUnsafeMutableBytes { sim.clients[0].connection.receive($0, from: sim.serverAddress, now: sim.network.now) }
        #expect(sim.connected(0), "a retired ID's reset is ignored")
        // The current ID's reset still works: a restarted server must be recognised.
        datagram = reset(for: sim.clients[0].connection.peerID)
        datagram.withUnsafeMutableBytes { sim.clients[0].connection.receive($0, from: sim.serverAddress, now: sim.network.now) }
        #expect(sim.clients[0].connection.error == .statelessReset)
    }

    @Test func nothingInAPacketIsActedOnOnceThisSideIsClosing() async throws {
        let pki = try TestPKI()
        let sim = Simulation(seed: 63, pki: pki, secrets: try pki.secrets())
        sim.addClient()
        let handle = try await sim.connect(0)
        await sim.run(for: seconds(1))
        // The client closes, but its close never reaches the server, which goes on sending.
        sim.network.blackhole.insert(sim.clientAddresses[0])
        sim.clients[0].close(code: 0, reason: "bye", now: sim.network.now)
        try sim.endpoint.sendControl(Array("late news".utf8), to: handle, now: sim.network.now)
        await sim.run(for: seconds(1))
        #expect(sim.controlMessages(client: 0).isEmpty, "a message that arrived while closing was delivered")
    }

    @Test func anAddressTokenFromAnotherBootIsInvalid() throws {
        let pki = try TestPKI()
        let key = SymmetricKey(size: .bits256), reset = SymmetricKey(size: .bits256)
        let thisBoot = ServerSecrets(identity: try pki.identity(), resetKey: reset, tokenKey: key, clockEpoch: 1)
        let nextBoot = ServerSecrets(identity: try pki.identity(), resetKey: reset, tokenKey: key, clockEpoch: 2)
        let address = PathAddress.v4(192, 168, 1, 10, port: 50_000)
        let issued = WireInstant(nanoseconds: seconds(5_000))
        let token = AddressToken.seal(address: address, original: nil, secrets: thisBoot, now: issued)
        #expect(AddressToken.validate(token, address: address, secrets: thisBoot, now: issued + seconds(60)) != nil)
        // The same key (kept on disk) after a reboot: the monotonic clock restarted, so an old token's
        // age can't be read from it.
        #expect(AddressToken.validate(token, address: address, secrets: nextBoot, now: issued + seconds(60)) == nil)
    }

    /// An authenticated peer that sends any mix of well-formed frames, in any order and with any
    /// values (ACKs for packets never sent, stream and CRYPTO offsets far ahead, connection IDs out
    /// of sequence, frames only a server may send, garbage after them): a seeded fuzz of the
    /// connection's frame handling, where the frame-parser fuzz target stops. The server must never
    /// trap, must end a connection it closes with a transport error code, and must keep its per-
    /// connection state bounded; other connections carry on.
    @Test func seededFrameSequencesFromAnAuthenticatedPeerNeverBreakTheServer() async throws {
        let pki = try TestPKI()
        var random = SplitMix64(seed: 0x5eed)
        var closed = 0
        var survived = 0
        for round in 0..<30 {
            let sim = Simulation(seed: 500 + UInt64(round), pki: pki, secrets: try pki.secrets())
            sim.addClient()
            sim.addClient()
            let handle = try await sim.connect(0)
            let bystander = try await sim.connect(1)
            for _ in 0..<40 {
                guard sim.endpoint.connection(handle)?.state == .established, sim.connected(0) else { break }
                var packet = sealed(on: sim.clients[0].connection, now: sim.network.now) { w in
                    for _ in 0..<(1 + Int(random.next() % 4)) { Self.writeRandomFrame(&w, &random) }
                    // Sometimes bytes that are no frame at all follow.
                    if random.next() % 8 == 0 { for _ in 0..<(random.next() % 6) { w.u8(UInt8(truncatingIfNeeded: random.next())) } }
                }
                packet.withUnsafeMutableBytes { sim.endpoint.receive($0, from: sim.clientAddresses[0], now: sim.network.now) }
                await sim.run(for: ms(30))
            }
            if let connection = sim.endpoint.connection(handle) {
                #expect(connection.issuedIDs.count <= 8, "round \(round): \(connection.issuedIDs.count) IDs issued")
                #expect(connection.peerIDs.count <= 8, "round \(round): \(connection.peerIDs.count) peer IDs kept")
                survived += 1
            }
            let serverCloses = sim.serverEvents.compactMap { $0.0 == handle ? { if case .closed(let e) = $0.1 { return e } else { return nil } }($0) : nil }
            if let error = serverCloses.first {
                closed += 1
                // Closed for what the peer sent (a violation this side named with a transport code,
                // or the peer's own close): never a timeout, and never this side's internal error.
                switch error {
                case .local(let code, _):
                    #expect(TransportErrorCode(rawValue: code) != nil && code != TransportErrorCode.internalError.rawValue,
                            "round \(round): \(error)")
                case .peer: break
                default: Issue.record("round \(round): closed by \(error)")
                }
            }
            // The other member never noticed.
            #expect(sim.endpoint.connection(bystander)?.state == .established, "round \(round)")
            try sim.clients[1].sendControl([UInt8(round)])
            await sim.run(for: ms(200))
            #expect(sim.serverControlMessages(bystander).last == [UInt8(round)], "round \(round)")
        }
        // Both outcomes happened, or the sequences were too tame (or too wild) to test anything.
        #expect(closed > 0 && survived > 0, "closed \(closed), survived \(survived)")
    }

    /// One short-header packet from `connection` carrying whatever `frames` writes, sealed with its
    /// keys as its own packets are (so the server authenticates it).
    func sealed(on connection: Connection, now: WireInstant, frames: (inout WireWriter) -> Void) -> [UInt8] {
        var buffer = [UInt8](repeating: 0, count: 1_200)
        let end = buffer.withUnsafeMutableBytes { raw -> Int in
            guard let key = connection.appSeal else { return 0 }
            let pn = connection.appNextPN
            var w = WireWriter(UnsafeMutableRawBufferPointer(rebasing: raw[..<(raw.count - 16)]))
            let pnOffset = w.writeShortHeader(destination: connection.peerID, keyPhase: connection.sendKeyPhase, packetNumber: pn, pnLength: 4)
            let payloadStart = w.offset
            frames(&w)
            if w.offset < pnOffset + 8 { w.writePadding(pnOffset + 8 - w.offset) }
            guard !w.overflowed else { return 0 }
            var record = SentPacket.empty
            record.number = pn
            record.time = now
            return connection.sealApplicationPacket(raw, start: 0, pnOffset: pnOffset, pnLength: 4, payloadStart: payloadStart,
                                                    payloadEnd: w.offset, key: key, record: record, ackEliciting: false, now: now)
        }
        return Array(buffer[..<end])
    }

    static func writeRandomFrame(_ w: inout WireWriter, _ random: inout SplitMix64) {
        func small() -> UInt64 { random.next() % 16 }
        func any() -> UInt64 { [small(), random.next() % 70_000, random.next() % (1 << 30), (1 << 62) - 1][Int(random.next() % 4)] }
        func bytes(_ count: Int) -> [UInt8] { (0..<count).map { _ in UInt8(truncatingIfNeeded: random.next()) } }
        switch random.next() % 13 {
        case 0: w.writePing()
        case 1: w.writePadding(Int(small()))
        case 2:
            // Disjoint ranges, highest first, acknowledging packets that may never have been sent.
            var ranges: [ClosedRange<UInt64>] = []
            var top = min(any(), 1 << 40) + 40
            for _ in 0..<(1 + random.next() % 3) where top >= 4 {
                let length = min(random.next() % 4, top - 2)
                ranges.append((top - length)...top)
                guard top >= length + 4 else { break }
                top = top - length - 2 - random.next() % 2
            }
            w.writeAck(ranges: ranges, delay: any())
        case 3: bytes(Int(small())).withUnsafeBytes { w.writeCrypto(offset: any(), data: $0) }
        case 4: bytes(Int(small()) * 4).withUnsafeBytes { w.writeControl(offset: any(), data: $0) }
        case 5: bytes(Int(small())).withUnsafeBytes { w.writeNewToken($0) }
        case 6:
            let sequence = small()
            bytes(16).withUnsafeBytes { w.writeNewConnectionID(sequence: sequence, retirePriorTo: random.next() % (sequence + 2),
                                                               id: ConnectionID(random.next()), resetToken: $0) }
        case 7: w.writeRetireConnectionID(sequence: any())
        case 8: w.writePathChallenge(random.next())
        case 9: w.writePathResponse(random.next())
        case 10:
            // Rarely: the peer closes, which ends the round early.
            if random.next() % 10 == 0 { w.writeConnectionClose(code: small(), reason: "bye") } else { w.writePing() }
        case 11: w.writeHandshakeDone()
        default: bytes(Int(small())).withUnsafeBytes { w.writeDatagram($0, last: false) }
        }
    }
}
