import Foundation
import SeededRandom
import Testing
@testable import Wire

/// Whoever can see a client's packets, or forge its address, must not be able to turn the server
/// into a reflector aimed at that client (docs/protocol.md §8.3–8.4).
@Suite struct AmplificationTests {
    /// V connects and is given a NEW_TOKEN token, which travels in clear and binds only V's host.
    /// An attacker who copied it opens a connection with it from V's host (another port), so that
    /// the server answers V, then sends Initials that claim CRYPTO at offset 0. Each one used to
    /// make the server send its whole flight again, and the token had lifted the 3x limit: about
    /// 33x for a 1.5 KB flight.
    @Test func aCopiedTokenAndStrayInitialsCannotAmplifyTowardsItsOwner() async throws {
        let pki = try TestPKI()
        var configuration = EndpointConfiguration()
        configuration.retryThreshold = 0  // every client without a valid token gets a Retry
        let sim = Simulation(seed: 21, pki: pki, secrets: try pki.secrets(), configuration: configuration)
        sim.addClient()
        _ = try await sim.connect(0)
        #expect(await sim.run(for: seconds(2)) { !sim.clients[0].token.isEmpty })
        let token = sim.clients[0].token
        let retries = sim.endpoint.stats.retriesSent

        // V's host (client 0 is 192.168.1.10), another port.
        let victim = PathAddress.v4(192, 168, 1, 10, port: 40_000)
        var sentAsVictim = 0
        func send(_ bytes: [UInt8]) {
            sentAsVictim += bytes.count
            sim.network.send(bytes, from: victim, to: sim.serverAddress)
        }
        let attacker = Connection(client: pki.client(), remote: sim.serverAddress, now: sim.network.now, token: token,
                                  random: SplitMix64(seed: 5))
        var buffer = [UInt8](repeating: 0, count: 1_500)
        let first = try #require(buffer.withUnsafeMutableBytes { attacker.poll(into: $0, now: sim.network.now) })
        send(Array(buffer[..<first.count]))
        await sim.run(for: ms(100))
        // The token skipped the Retry, once, but did not lift the 3x limit.
        #expect(sim.endpoint.stats.retriesSent == retries)
        let handle = try #require(sim.endpoint.handles.first { sim.endpoint.connection($0)?.peerID == attacker.localID })
        let server = try #require(sim.endpoint.connection(handle))
        #expect(!server.path.validated)
        let flight = sim.serverBytesTo[victim, default: 0]
        #expect(flight > 0)

        // 200 small Initials, each with a CRYPTO frame at offset 0 holding the ClientHello's first
        // bytes: under 1,200 bytes, so dropped unread (RFC 9000 §14.1).
        for _ in 0..<200 {
            attacker.initialSpace.flightSent = 0
            let end = buffer.withUnsafeMutableBytes { attacker.writeHandshakePacket(.initial, into: UnsafeMutableRawBufferPointer(rebasing: $0[..<220]), at: 0, padTo: 0) }
            #expect(end > 0 && end < PacketHeader.minimumInitialDatagram)
            send(Array(buffer[..<end]))
            await sim.run(for: ms(5))
        }
        await sim.run(for: ms(100))
        #expect(server.stats.droppedMalformed >= 200)
        // The same, padded to 1,200 bytes: read, but only the ClientHello itself, whole, brings the
        // flight again. (The server's own retransmission timer resends it about once a second,
        // backing off; these 100 ms fall between two of them.)
        let beforePadded = sim.serverBytesTo[victim, default: 0]
        for _ in 0..<20 {
            attacker.initialSpace.flightSent = 0
            let end = buffer.withUnsafeMutableBytes {
                attacker.writeHandshakePacket(.initial, into: UnsafeMutableRawBufferPointer(rebasing: $0[..<220]), at: 0, padTo: 0)
            }
            send(Array(buffer[..<end]) + [UInt8](repeating: 0, count: PacketHeader.minimumInitialDatagram - end))
            await sim.run(for: ms(5))
        }
        await sim.run(for: ms(30))
        #expect(sim.serverBytesTo[victim, default: 0] == beforePadded)
        attacker.initialSpace.flightSent = 0
        let whole = try #require(buffer.withUnsafeMutableBytes { attacker.poll(into: $0, now: sim.network.now) })
        #expect(whole.count >= PacketHeader.minimumInitialDatagram)
        send(Array(buffer[..<whole.count]))
        await sim.run(for: ms(50))
        let reflected = sim.serverBytesTo[victim, default: 0]
        #expect(reflected >= beforePadded + flight, "a real ClientHello retransmission must bring the flight again")
        #expect(reflected <= 3 * sentAsVictim, "sent \(reflected) bytes to the victim for \(sentAsVictim) received")

        // The token has been used: presented again (from yet another port) it counts for nothing,
        // and the client gets a Retry like one without a token.
        let again = Connection(client: pki.client(), remote: sim.serverAddress, now: sim.network.now, token: token,
                               random: SplitMix64(seed: 6))
        let accepted = sim.endpoint.stats.accepted
        let second = try #require(buffer.withUnsafeMutableBytes { again.poll(into: $0, now: sim.network.now) })
        sim.network.send(Array(buffer[..<second.count]), from: PathAddress.v4(192, 168, 1, 10, port: 40_001), to: sim.serverAddress)
        await sim.run(for: ms(100))
        #expect(sim.endpoint.stats.tokensRefused == 1)
        #expect(sim.endpoint.stats.retriesSent == retries + 1)
        #expect(sim.endpoint.stats.accepted == accepted)
    }

    /// The spent-token set is bounded: full of tokens still valid, it remembers no more, and a token
    /// it can't remember is refused (its client pays a Retry) rather than left reusable.
    @Test func theSpentTokenSetIsBoundedAndSweepsExpiredTokens() {
        var spent = SpentTokens(capacity: 2)
        let now = WireInstant(nanoseconds: seconds(100))
        func spend(_ n: UInt8, expiresIn: UInt64, at time: WireInstant = now) -> Bool {
            spent.spend([n] + [UInt8](repeating: 7, count: 11), expires: now + seconds(expiresIn), now: time)
        }
        #expect(spend(1, expiresIn: 10))
        #expect(!spend(1, expiresIn: 10))
        #expect(spend(2, expiresIn: 20))
        #expect(!spend(3, expiresIn: 20))
        // Once the first has expired, a sweep makes room.
        #expect(spend(3, expiresIn: 30, at: now + seconds(11)))
        #expect(spent.expiries.count == 2)
        let short = spent.spend([1, 2, 3], expires: now + seconds(30), now: now)
        #expect(!short)
    }
}
