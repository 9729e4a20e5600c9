import Crypto
import Foundation
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

    /// The home, on a path with a fixed 20 ms each way, answering each entered payload reversed.
    func home(audience: String = "node-b", clock: @escaping @Sendable () -> UInt64 = { UInt64(Date().timeIntervalSince1970 * 1_000) }) throws -> Simulation {
        let secrets = ServerSecrets(identity: try pki.identity(), resetKey: SymmetricKey(size: .bits256),
                                    entryPasses: EntryPasses(sharedKey: shared, audience: audience, clock: clock))
        let sim = Simulation(seed: 9, conditions: .init(jitter: 0), pki: pki, secrets: secrets)
        // Sent at once, as squelchd's driver flushes after each event (the simulation would
        // otherwise poll only at the next arrival).
        sim.onServerEvent = { [unowned sim] handle, event in
            guard case .entered(let payload) = event else { return }
            try? sim.endpoint.sendControl(Array(payload.reversed()), to: handle, now: sim.network.now)
            sim.flush()
        }
        return sim
    }

    func entered(_ sim: Simulation) -> [[UInt8]] {
        sim.serverEvents.compactMap { if case .entered(let p) = $0.1 { return p } else { return nil } }
    }

    @Test func theHomeAnswersWhatThePassCarriesWithItsFirstFlight() async throws {
        let sim = try home()
        let pass = try #require(issuer.issue(payload: Array("join".utf8), for: "node-b"))
        let client = sim.addClient(entryPass: pass)
        let start = sim.network.now
        #expect(await sim.run(for: seconds(2)) { !sim.controlMessages(client: client).isEmpty })
        #expect(sim.controlMessages(client: client) == [Array("nioj".utf8)])
        #expect(entered(sim) == [Array("join".utf8)])
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
        var pass = try #require(issuer.issue(payload: Array("join".utf8), for: `case` == "other node" ? "node-c" : "node-b"))
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

    @Test func ticketContentsRoundTripAndRefuseWhatIsNotLaidOutSo() throws {
        let contents = EntryTicketContents(expiresMilliseconds: 1_765_000_000_123, key: Array(repeating: 7, count: 32),
                                           audience: Array("node-b".utf8), payload: Array("join".utf8))
        let bytes = try #require(contents.encoded())
        #expect(EntryTicketContents(parsing: bytes) == contents)
        #expect(EntryTicketContents(parsing: Array(bytes.prefix(41))) == nil)
        var other = bytes
        other[0] = 2
        #expect(EntryTicketContents(parsing: other) == nil)
        var long = bytes
        long[41] = 65
        #expect(EntryTicketContents(parsing: long) == nil)
        #expect(EntryTicketContents(expiresMilliseconds: 0, key: [1], audience: [], payload: []).encoded() == nil)
    }
}
