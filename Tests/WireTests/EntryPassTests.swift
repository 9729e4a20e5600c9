import Crypto
import Foundation
import SeededRandom
import Testing
@testable import Wire

/// Entry passes (docs/protocol.md §7.8): a cluster node's redirect hands the client a pass for the
/// channel's home, and the home answers what the pass carries with its handshake flight.
@Suite struct EntryPassTests {
    let pki: TestPKI
    let shared = SymmetricKey(size: .bits256)
    /// The redirecting node: same shared key, another name.
    let issuer: EntryPasses

    init() throws {
        pki = try TestPKI()
        issuer = EntryPasses(sharedKey: shared, audience: "node-a")
    }

    /// The home, on a path with a fixed 20 ms each way, answering each entered payload reversed (or
    /// with `answer` bytes).
    func home(audience: String = "node-b", answer: Int? = nil,
              clock: @escaping @Sendable () -> UInt64 = { UInt64(Date().timeIntervalSince1970 * 1_000) }) throws -> Simulation {
        let secrets = ServerSecrets(identity: try pki.identity(), resetKey: SymmetricKey(size: .bits256),
                                    entryPasses: EntryPasses(sharedKey: shared, audience: audience, clock: clock))
        let sim = Simulation(seed: 9, conditions: .init(jitter: 0), pki: pki, secrets: secrets)
        // Sent at once, as squelchd's driver flushes after each event (the simulation would
        // otherwise poll only at the next arrival).
        sim.onServerEvent = { [unowned sim] handle, event in
            guard case .entered(let payload) = event else { return }
            let reply = answer.map { [UInt8](repeating: 0x6A, count: $0) } ?? Array(payload.reversed())
            try? sim.endpoint.sendControl(reply, to: handle, now: sim.network.now)
            sim.flush()
        }
        return sim
    }

    func entered(_ sim: Simulation) -> [[UInt8]] {
        sim.serverEvents.compactMap { if case .entered(let p) = $0.1 { return p } else { return nil } }
    }

    /// Where `Simulation.addClient` puts its first client.
    static let firstClient = PathAddress.v4(192, 168, 1, 10, port: 50_000)

    /// `join`: what the pass carries; a long one (a long token) makes a ClientHello of two Initials.
    @Test(arguments: ["join", String(repeating: "long join ", count: 300)])
    func theHomeAnswersWhatThePassCarriesWithItsFirstFlight(_ join: String) async throws {
        let sim = try home()
        let pass = try #require(issuer.issue(payload: Array(join.utf8), for: "node-b", client: Self.firstClient))
        let client = sim.addClient(entryPass: pass)
        let start = sim.network.now
        #expect(await sim.run(for: seconds(2)) { !sim.controlMessages(client: client).isEmpty })
        #expect(sim.controlMessages(client: client) == [Array(join.utf8.reversed())])
        #expect(entered(sim) == [Array(join.utf8)])
        // One round trip (40 ms) from the ClientHello, not two: the answer came with the flight.
        #expect(sim.network.now.since(start) < ms(60), "\(sim.network.now.since(start) / 1_000_000) ms: \(sim.trace)")
        #expect(sim.clients[client].connection.entryPassAccepted)
        let events = sim.clientEvents[client]
        #expect(events.firstIndex(of: .entered).map { $0 + 1 } == events.firstIndex(of: .connection(.connected)))
        // The handshake completes as usual.
        #expect(await sim.run(for: seconds(1)) { sim.serverEvents.contains { $0.1 == .connected } })
    }

    /// Anything the home does not honour is ignored, never refused: the handshake completes, nothing
    /// enters, and the client (told nothing was accepted) sends its join itself.
    @Test(arguments: ["replayed", "other node", "expired", "stolen", "forged"])
    func aPassTheHomeDoesNotHonourIsIgnored(_ case: String) async throws {
        let now = UInt64(Date().timeIntervalSince1970 * 1_000)
        let sim = try home(clock: { `case` == "expired" ? now + 31_000 : now })
        var pass = try #require(issuer.issue(payload: Array("join".utf8), for: `case` == "other node" ? "node-c" : "node-b", client: Self.firstClient))
        if `case` == "stolen" { pass.key = Array(SymmetricKey(size: .bits256).withUnsafeBytes { Array($0) }) }
        if `case` == "forged" { pass.ticket[pass.ticket.count / 2] ^= 1 }
        if `case` == "replayed" {
            let first = sim.addClient(entryPass: pass)
            #expect(await sim.run(for: seconds(1)) { sim.connected(first) })
            #expect(entered(sim).count == 1)
        }
        let client = sim.addClient(entryPass: pass)
        #expect(await sim.run(for: seconds(1)) { sim.connected(client) })
        #expect(!sim.clients[client].connection.entryPassAccepted)
        #expect(!sim.clientEvents[client].contains(.entered))
        #expect(entered(sim).count == (`case` == "replayed" ? 1 : 0))
    }

    /// A pass is for one connection: the client's own reconnection (here after the home restarted,
    /// forgetting which passes entered) handshakes without it, and the application joins again.
    @Test func aClientsReconnectionPresentsNoPass() async throws {
        let sim = try home()
        let pass = try #require(issuer.issue(payload: Array("join".utf8), for: "node-b", client: Self.firstClient))
        let client = sim.addClient(entryPass: pass)
        #expect(await sim.run(for: seconds(1)) { sim.connected(client) && !sim.controlMessages(client: client).isEmpty })
        let secrets = sim.endpoint.secrets
        sim.endpoint = Endpoint(secrets: secrets, random: SplitMix64(seed: 5), forkRandom: { SplitMix64(seed: $0.next()) })
        let before = sim.serverEvents.count
        try sim.clients[client].sendControl(Array("anyone there?".utf8))
        #expect(await sim.run(for: seconds(5)) { sim.connected(client) && sim.clients[client].reconnects == 1 })
        #expect(sim.clients[client].configuration.entryPass == nil)
        #expect(!sim.clients[client].connection.entryPassAccepted)
        #expect(!sim.serverEvents[before...].contains { if case .entered = $0.1 { true } else { false } })
    }

    /// The pass names the client's host as the redirecting node saw it: from that host the home
    /// sends a large answer (a big channel's roster) with its flight; from another, the 3x limit
    /// holds it back until the client's Finished has validated the address, a round trip later.
    @Test(arguments: [true, false]) func fromTheHostThePassNamesTheAnswerIsNotHeldToThreeTimes(_ sameHost: Bool) async throws {
        let sim = try home(answer: 6_000)
        let named = sameHost ? Self.firstClient : PathAddress.v4(10, 7, 7, 7, port: 50_000)
        let pass = try #require(issuer.issue(payload: Array("join".utf8), for: "node-b", client: named))
        let client = sim.addClient(entryPass: pass)
        let start = sim.network.now
        #expect(await sim.run(for: seconds(2)) { !sim.controlMessages(client: client).isEmpty })
        #expect(sim.controlMessages(client: client).first?.count == 6_000)
        let rounds = Double(sim.network.now.since(start)) / Double(ms(40))
        if sameHost { #expect(rounds < 1.5, "\(rounds) round trips") } else { #expect(rounds >= 1.5, "\(rounds) round trips") }
    }

    @Test func ticketContentsRoundTripAndRefuseWhatIsNotLaidOutSo() throws {
        let contents = EntryTicketContents(expiresMilliseconds: 1_765_000_000_123, key: Array(repeating: 7, count: 32),
                                           host: EntryPasses.host(Self.firstClient), audience: Array("node-b".utf8), payload: Array("join".utf8))
        let bytes = try #require(contents.encoded())
        #expect(EntryTicketContents(parsing: bytes) == contents)
        #expect(EntryTicketContents(parsing: Array(bytes.prefix(EntryTicketContents.fixedLength - 1))) == nil)
        var other = bytes
        other[0] = 2
        #expect(EntryTicketContents(parsing: other) == nil)
        var long = bytes
        long[EntryTicketContents.fixedLength - 1] = 65
        #expect(EntryTicketContents(parsing: long) == nil)
        #expect(EntryTicketContents(expiresMilliseconds: 0, key: [1], host: [], audience: [], payload: []).encoded() == nil)
    }
}
