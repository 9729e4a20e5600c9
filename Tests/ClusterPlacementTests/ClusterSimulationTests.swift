import ClusterPlacement
import Foundation
import SeededRandom
import Testing

/// Seeded runs of a whole cluster (see `ClusterSimulation`): one home per channel at every instant,
/// epochs that only grow and name one node each, fenced writes only from the row's home, and every
/// channel served again soon after the last failure.
@Suite struct ClusterSimulationTests {
    /// 200 seeds by default; PLACEMENT_SEEDS=46 or PLACEMENT_SEEDS=1-5000 reruns one or explores more.
    static let seeds: [UInt64] = {
        guard let text = ProcessInfo.processInfo.environment["PLACEMENT_SEEDS"] else { return Array(1...200) }
        let bounds = text.split(separator: "-").compactMap { UInt64($0) }
        return bounds.count == 2 ? Array(bounds[0]...bounds[1]) : bounds
    }()

    @Test(arguments: seeds)
    func oneHomePerChannelAndEveryChannelServedAgain(seed: UInt64) {
        let simulation = ClusterSimulation(seed: seed)
        simulation.run()
        #expect(simulation.violations.isEmpty, "seed \(seed): \(simulation.violations.joined(separator: "\n"))\n\(simulation.stats)")
        if !simulation.violations.isEmpty {
            // The same run again, with its story: what led up to the first violations.
            var settings = ClusterSimulation.Settings()
            settings.logging = true
            let replay = ClusterSimulation(seed: seed, settings: settings)
            replay.run()
            print("seed \(seed), the end of its log:\n" + replay.log.suffix(80).joined(separator: "\n"))
        }
    }

    @Test(arguments: [UInt64(7), 42, 99])
    func aSeedReproducesItsRunExactly(seed: UInt64) {
        let first = ClusterSimulation(seed: seed), second = ClusterSimulation(seed: seed)
        first.run()
        second.run()
        #expect(first.trace == second.trace, "seed \(seed)")
        #expect(first.stats.claims == second.stats.claims, "seed \(seed)")
    }

    /// The checks have teeth: nodes that believe their leases a second longer than the database
    /// grants them are caught serving beside the next home.
    @Test func theChecksCatchANodeThatOverstaysItsLease() {
        var settings = ClusterSimulation.Settings()
        settings.keeper = LeaseKeeper.Settings(lease: .seconds(6))
        let caught = (UInt64(1)...40).first { seed in
            let simulation = ClusterSimulation(seed: seed, settings: settings)
            simulation.run()
            return simulation.violations.contains { $0.contains("served by") }
        }
        #expect(caught != nil)
    }
}
