import Foundation
import SeededRandom
import Testing
@testable import Wire

/// Seeded runs over a hostile network: each seed picks loss (0–30 %), duplication, reordering,
/// delay and NAT rebinding. Control messages must arrive exactly once and in order, both ways, and
/// the connections must survive (no reconnects).
@Suite struct SimulationTests {
    /// 120 seeds by default; WIRE_SEEDS=46 or WIRE_SEEDS=1-2000 reruns one or explores more.
    static let seeds: [UInt64] = {
        guard let text = ProcessInfo.processInfo.environment["WIRE_SEEDS"] else { return Array(1...120) }
        let bounds = text.split(separator: "-").compactMap { UInt64($0) }
        return bounds.count == 2 ? Array(bounds[0]...bounds[1]) : bounds
    }()

    struct Outcome: Equatable {
        var trace: [String]
        var sent: Int
        var dropped: Int
    }

    /// One full run. Returns its trace so determinism can be checked.
    static func run(seed: UInt64, pki: TestPKI, secrets: ServerSecrets) async throws -> Outcome {
        var pick = SplitMix64(seed: seed ^ 0xA5A5)
        var conditions = SimulatedNetwork.Conditions()
        conditions.loss = Double(pick.next() % 31) / 100
        conditions.duplicate = Double(pick.next() % 11) / 100
        conditions.reorder = Double(pick.next() % 51) / 100
        conditions.delay = ms(5 + pick.next() % 100)
        conditions.jitter = ms(1 + pick.next() % 80)
        let rebind = pick.next() % 2 == 0
        let sim = Simulation(seed: seed, conditions: conditions, pki: pki, secrets: secrets)
        let clientCount = 3
        for _ in 0..<clientCount { sim.addClient() }
        // The server echoes every control message back with an "ack:" prefix.
        sim.onServerEvent = { handle, event in
            if case .control(let message) = event {
                try? sim.endpoint.sendControl(Array("ack:".utf8) + message, to: handle, now: sim.network.now)
            }
        }
        let everyoneConnected = await sim.run(for: seconds(60)) { (0..<clientCount).allSatisfy { sim.connected($0) } }
        try #require(everyoneConnected, "seed \(seed) \(conditions): \((0..<clientCount).map { sim.clientError($0).map { "\($0)" } ?? "-" })")
        let messages = 20
        for round in 0..<messages {
            for client in 0..<clientCount {
                try sim.clients[client].sendControl(Array("c\(client) m\(round)".utf8))
                sim.sendDatagram(client: client, [UInt8(round)])
            }
            await sim.run(for: ms(40))
            if rebind, round == messages / 2 {
                // Every client's NAT mapping changes mid-stream.
                for client in 0..<clientCount { sim.clientAddresses[client].port &+= 1000 }
            }
        }
        let allEchoed = await sim.run(for: seconds(120)) {
            (0..<clientCount).allSatisfy { sim.controlMessages(client: $0).count == messages }
        }
        for client in 0..<clientCount {
            let expected = (0..<messages).map { Array("ack:c\(client) m\($0)".utf8) }
            #expect(sim.controlMessages(client: client) == expected, "seed \(seed) \(conditions) client \(client)")
            let handle = try #require(sim.serverHandle(of: client))
            #expect(sim.serverControlMessages(handle) == (0..<messages).map { Array("c\(client) m\($0)".utf8) }, "seed \(seed)")
            #expect(sim.clients[client].reconnects == 0, "seed \(seed): the connection survives")
        }
        #expect(allEchoed, "seed \(seed) \(conditions)")
        #expect(sim.endpoint.connectionCount == clientCount)
        // Audio is unreliable: some may be lost, none is duplicated.
        #expect(sim.serverDatagrams.count <= clientCount * messages)
        return Outcome(trace: sim.trace, sent: sim.network.sent, dropped: sim.network.dropped)
    }

    @Test(arguments: seeds)
    func controlMessagesArriveExactlyOnceInOrder(seed: UInt64) async throws {
        let pki = try TestPKI()
        _ = try await Self.run(seed: seed, pki: pki, secrets: try pki.secrets())
    }

    @Test(arguments: [UInt64(7), 42, 99])
    func aSeedReproducesItsRunExactly(seed: UInt64) async throws {
        let pki = try TestPKI()
        let secrets = try pki.secrets()
        let first = try await Self.run(seed: seed, pki: pki, secrets: secrets)
        let second = try await Self.run(seed: seed, pki: pki, secrets: secrets)
        #expect(first == second)
        #expect(first.trace.count > 10)
    }
}
