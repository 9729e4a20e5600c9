import Crypto
import Foundation
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
        var random = SeededRandom(seed: 77)
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
}
