import Testing

@testable import ImpairmentKit

private let millisecond: UInt64 = 1_000_000

/// Feeds `count` datagrams into one direction, `spacing` apart, and returns (arrival, decision) pairs.
private func run(
    _ model: inout ImpairmentModel, count: Int, direction: Direction = .clientToServer,
    spacing: UInt64 = millisecond, start: UInt64 = 1_000 * millisecond
) -> [(now: UInt64, decision: Decision)] {
    (0..<count).map { index in
        let now = start + UInt64(index) * spacing
        return (now, model.process(byteCount: 100, direction: direction, now: now))
    }
}

/// Lengths of the runs of consecutive drops.
private func dropRuns(_ decisions: [Decision]) -> [Int] {
    var runs: [Int] = []
    var current = 0
    for decision in decisions {
        if decision.isDropped {
            current += 1
        } else if current > 0 {
            runs.append(current)
            current = 0
        }
    }
    if current > 0 { runs.append(current) }
    return runs
}

@Suite("ImpairmentModel")
struct ImpairmentModelTests {
    @Test("a transparent model delivers every datagram once, immediately", arguments: Direction.allCases)
    func transparent(direction: Direction) {
        var model = ImpairmentModel()
        for (now, decision) in run(&model, count: 1_000, direction: direction) {
            #expect(decision == .deliver([Delivery(deliverAt: now)]))
        }
        let counters = model.stats[direction]
        #expect(counters.received == 1_000 && counters.forwarded == 1_000 && counters.dropped == 0)
        #expect(counters.bytesReceived == 100_000 && counters.bytesForwarded == 100_000)
    }

    @Test("10 % loss over 10,000 datagrams is 10 % ± 1 %", arguments: [0, 1, 42, 0xDEAD_BEEF] as [UInt64])
    func lossRate(seed: UInt64) {
        for direction in Direction.allCases {
            var model = ImpairmentModel(
                clientToServer: Impairment(lossPercent: 10, seed: seed),
                serverToClient: Impairment(lossPercent: 10, seed: seed))
            let dropped = run(&model, count: 10_000, direction: direction).filter { $0.decision.isDropped }.count
            #expect((900...1_100).contains(dropped), "\(direction) seed \(seed): \(dropped) dropped")
            let counters = model.stats[direction]
            #expect(counters.dropped == UInt64(dropped))
            #expect(counters.received == counters.forwarded + counters.dropped)
        }
    }

    @Test("0 % and 100 % loss are exact")
    func lossExtremes() {
        var none = ImpairmentModel(clientToServer: Impairment(lossPercent: 0, seed: 7))
        #expect(run(&none, count: 5_000).allSatisfy { !$0.decision.isDropped })
        var all = ImpairmentModel(clientToServer: Impairment(lossPercent: 100, seed: 7))
        #expect(run(&all, count: 5_000).allSatisfy { $0.decision == .dropped(.loss) })
        // Out-of-range values clamp rather than trap.
        var clamped = ImpairmentModel(clientToServer: Impairment(lossPercent: 250, delayMilliseconds: -5))
        #expect(run(&clamped, count: 10).allSatisfy { $0.decision.isDropped })
    }

    @Test("identical seeds give identical decisions; another seed gives others")
    func determinism() {
        let impairment = Impairment(
            lossPercent: 3, burstLoss: BurstLoss(enterProbability: 0.02, stayProbability: 0.6),
            delayMilliseconds: 20, jitterMilliseconds: 30, jitterDistribution: .normal,
            reorderPercent: 2, duplicatePercent: 2, seed: 42)
        func decisions(seed: UInt64) -> [Decision] {
            var config = impairment
            config.seed = seed
            var model = ImpairmentModel(clientToServer: config, serverToClient: config)
            var out: [Decision] = []
            for index in 0..<5_000 {
                let now = UInt64(index) * 3 * millisecond
                out.append(model.process(byteCount: index % 1_400, direction: .clientToServer, now: now))
                out.append(model.process(byteCount: 80, direction: .serverToClient, now: now + millisecond))
            }
            return out
        }
        #expect(decisions(seed: 42) == decisions(seed: 42))
        #expect(decisions(seed: 42) != decisions(seed: 43))
    }

    @Test("the two directions draw independent streams")
    func directionsAreIndependent() {
        let impairment = Impairment(lossPercent: 20, jitterMilliseconds: 10, duplicatePercent: 5, seed: 9)
        var alone = ImpairmentModel(clientToServer: impairment, serverToClient: impairment)
        var busy = alone
        var aloneDecisions: [Decision] = []
        var busyDecisions: [Decision] = []
        for index in 0..<2_000 {
            let now = UInt64(index) * millisecond
            aloneDecisions.append(alone.process(byteCount: 10, direction: .clientToServer, now: now))
            // Traffic in the other direction must not shift this direction's decisions.
            for _ in 0..<(index % 3) { _ = busy.process(byteCount: 10, direction: .serverToClient, now: now) }
            busyDecisions.append(busy.process(byteCount: 10, direction: .clientToServer, now: now))
        }
        #expect(aloneDecisions == busyDecisions)

        // Same seed on both directions still gives different (salted) streams.
        var both = ImpairmentModel(clientToServer: impairment, serverToClient: impairment)
        let up = run(&both, count: 500, direction: .clientToServer).map(\.decision.isDropped)
        let down = run(&both, count: 500, direction: .serverToClient).map(\.decision.isDropped)
        #expect(up != down)
    }

    @Test("delay and jitter stay inside [delay, delay + jitter]", arguments: JitterDistribution.allCases)
    func delayAndJitterBounds(distribution: JitterDistribution) {
        for preservesOrder in [true, false] {
            var model = ImpairmentModel(
                clientToServer: Impairment(
                    delayMilliseconds: 20, jitterMilliseconds: 30, jitterDistribution: distribution,
                    preservesOrder: preservesOrder, seed: 5))
            // 20 ms apart, like voice frames, so order preservation rarely has to push a datagram back.
            let results = run(&model, count: 10_000, spacing: 20 * millisecond)
            let delays = results.map { $0.decision.deliveries[0].deliverAt - $0.now }
            #expect(delays.allSatisfy { (20 * millisecond...50 * millisecond).contains($0) })
            let lowest = delays.min()!
            let highest = delays.max()!
            let mean = Double(delays.reduce(0, +)) / Double(delays.count) / Double(millisecond)
            switch distribution {
            case .uniform:
                #expect(lowest < 21 * millisecond && highest > 49 * millisecond)
                #expect(abs(mean - 35) < 1, "mean \(mean)")
            case .normal:
                // Bell-shaped: centred on 35 ms, with most draws within one σ (5 ms).
                #expect(abs(mean - 35) < 1, "mean \(mean)")
                let withinSigma = delays.filter { (30 * millisecond...40 * millisecond).contains($0) }.count
                #expect(withinSigma > 6_000 && withinSigma < 7_500, "\(withinSigma) within 1σ")
            }
        }
    }

    @Test("preservesOrder keeps jitter from reordering; without it jitter alone reorders")
    func orderPreservation() {
        func inversions(preservesOrder: Bool) -> Int {
            var model = ImpairmentModel(
                clientToServer: Impairment(jitterMilliseconds: 100, preservesOrder: preservesOrder, seed: 3))
            let times = run(&model, count: 2_000).map { $0.decision.deliveries[0].deliverAt }
            return zip(times, times.dropFirst()).filter { $0 > $1 }.count
        }
        #expect(inversions(preservesOrder: true) == 0)
        #expect(inversions(preservesOrder: false) > 100)
    }

    @Test("reorder holds datagrams back so the next ones overtake them")
    func reorderOvertakes() {
        var model = ImpairmentModel(
            clientToServer: Impairment(
                delayMilliseconds: 10, reorderPercent: 10, reorderDelayMilliseconds: 40, seed: 11))
        let results = run(&model, count: 10_000, spacing: 20 * millisecond)
        let times = results.map { $0.decision.deliveries[0].deliverAt }
        let heldBack = results.indices.filter { results[$0].decision.deliveries[0].isHeldBack }
        #expect((800...1_200).contains(heldBack.count), "\(heldBack.count) held back")
        #expect(model.stats.clientToServer.reordered == UInt64(heldBack.count))
        // A held-back datagram is overtaken by the next one unless that one is held back too (40 ms hold > 20 ms
        // spacing). Two in a row are each overtaken only by a later one, or tie with it.
        for index in heldBack where index + 1 < times.count && !heldBack.contains(index + 1) {
            #expect(times[index + 1] < times[index])
        }
        // Delivering in deliverAt order really differs from the send order: count datagrams that something sent
        // later overtakes.
        var earliestLater = UInt64.max
        var overtaken = 0
        for index in times.indices.reversed() {
            if earliestLater < times[index] { overtaken += 1 }
            earliestLater = min(earliestLater, times[index])
        }
        #expect(Double(overtaken) > 0.85 * Double(heldBack.count), "\(overtaken) of \(heldBack.count) overtaken")
        #expect(overtaken <= heldBack.count)
    }

    @Test("duplicate produces a second copy")
    func duplication() {
        var model = ImpairmentModel(
            clientToServer: Impairment(delayMilliseconds: 5, jitterMilliseconds: 10, duplicatePercent: 5, seed: 21))
        let results = run(&model, count: 10_000)
        let doubled = results.filter { $0.decision.deliveries.count == 2 }
        #expect((400...600).contains(doubled.count), "\(doubled.count) duplicated")
        #expect(results.allSatisfy { (1...2).contains($0.decision.deliveries.count) })
        for (now, decision) in doubled {
            let copies = decision.deliveries
            #expect(copies.filter(\.isDuplicate).count == 1)
            #expect(copies[0].deliverAt <= copies[1].deliverAt)
            #expect(copies.allSatisfy { (now + 5 * millisecond...now + 15 * millisecond).contains($0.deliverAt) })
        }
        let counters = model.stats.clientToServer
        #expect(counters.duplicated == UInt64(doubled.count))
        #expect(counters.bytesForwarded == 100 * UInt64(10_000 + doubled.count))
    }

    @Test("Gilbert-Elliott loss comes in bursts; independent loss at the same rate does not")
    func burstLoss() {
        let burst = BurstLoss(enterProbability: 0.05, stayProbability: 0.75)
        #expect(burst.meanBurstLength == 4)
        var bursty = ImpairmentModel(clientToServer: Impairment(burstLoss: burst, seed: 8))
        let burstyDecisions = run(&bursty, count: 20_000).map(\.decision)
        let burstyRuns = dropRuns(burstyDecisions)
        let burstyMean = Double(burstyRuns.reduce(0, +)) / Double(burstyRuns.count)
        let lossRate = Double(burstyRuns.reduce(0, +)) / 20_000
        #expect(burstyMean > 3 && burstyMean < 5, "mean burst \(burstyMean)")
        #expect(abs(lossRate - burst.badStateFraction) < 0.03, "loss \(lossRate)")
        #expect(burstyDecisions.allSatisfy { $0 != .dropped(.loss) })

        var independent = ImpairmentModel(clientToServer: Impairment(lossPercent: lossRate * 100, seed: 8))
        let independentRuns = dropRuns(run(&independent, count: 20_000).map(\.decision))
        let independentMean = Double(independentRuns.reduce(0, +)) / Double(independentRuns.count)
        #expect(independentMean < 1.5 && burstyMean > 2 * independentMean)
    }

    @Test("good-state loss and partial bad-state loss combine")
    func burstWithGoodStateLoss() {
        let burst = BurstLoss(enterProbability: 0.1, stayProbability: 0.5, lossProbabilityInBadState: 0.5)
        var model = ImpairmentModel(clientToServer: Impairment(lossPercent: 2, burstLoss: burst, seed: 4))
        let decisions = run(&model, count: 20_000).map(\.decision)
        let random = decisions.filter { $0 == .dropped(.loss) }.count
        let bursty = decisions.filter { $0 == .dropped(.burstLoss) }.count
        // Bad state 1/6 of the time: ≈ 1,667 burst losses and ≈ 333 good-state losses.
        #expect((1_450...1_900).contains(bursty), "\(bursty)")
        #expect((230...450).contains(random), "\(random)")
    }

    @Test("a blackhole drops everything in both directions for its window, then traffic flows")
    func blackhole() {
        var model = ImpairmentModel(clientToServer: Impairment(delayMilliseconds: 1), serverToClient: .none)
        model.blackhole(until: 2_000 * millisecond)
        for direction in Direction.allCases {
            let results = run(&model, count: 2_000, direction: direction, start: 1_000 * millisecond)
            for (now, decision) in results {
                if now < 2_000 * millisecond {
                    #expect(decision == .dropped(.blackhole))
                } else {
                    #expect(!decision.isDropped)
                }
            }
            let counters = model.stats[direction]
            #expect(counters.blackholed == 1_000 && counters.dropped == 1_000 && counters.forwarded == 1_000)
        }
        model.blackhole(until: 10_000 * millisecond)
        #expect(model.process(byteCount: 1, direction: .clientToServer, now: 5_000 * millisecond).isDropped)
        model.blackhole(until: 0)
        #expect(!model.process(byteCount: 1, direction: .clientToServer, now: 5_000 * millisecond).isDropped)
    }

    @Test("setImpairment restarts the stream only when the seed changes")
    func runtimeReconfiguration() {
        let first = Impairment(lossPercent: 30, seed: 1)
        var reference = ImpairmentModel(clientToServer: first)
        var model = ImpairmentModel(clientToServer: first)
        _ = run(&reference, count: 100)
        _ = run(&model, count: 100)

        // Same seed, same config: the stream continues exactly as if nothing had been set.
        model.setImpairment(first, for: .clientToServer)
        let next: UInt64 = 2_000 * millisecond
        #expect(
            run(&model, count: 100, start: next).map(\.decision)
                == run(&reference, count: 100, start: next).map(\.decision))

        // New seed: identical to a fresh model with that seed (later arrivals, as time must not go backwards).
        let second = Impairment(lossPercent: 30, seed: 2)
        model.setImpairment(second, for: .clientToServer)
        var fresh = ImpairmentModel(clientToServer: second)
        let later: UInt64 = 5_000 * millisecond
        #expect(
            run(&model, count: 500, start: later).map(\.decision)
                == run(&fresh, count: 500, start: later).map(\.decision))
        #expect(model.impairment(for: .clientToServer) == second)
        #expect(model.impairment(for: .serverToClient) == .none)
    }

    @Test("the generator is reproducible and its unit draws stay in [0, 1)")
    func generator() {
        var a = SeededGenerator(seed: 42)
        var b = SeededGenerator(seed: 42)
        var c = SeededGenerator(seed: 43)
        let first = (0..<1_000).map { _ in a.next() }
        #expect(first == (0..<1_000).map { _ in b.next() })
        #expect(first != (0..<1_000).map { _ in c.next() })
        // Known first output pins the algorithm: a silent change would break every recorded seed.
        #expect(SeededGenerator(seed: 0).nextFirst() == 0x99EC_5F36_CB75_F2B4)
        var unit = SeededGenerator(seed: 7)
        let draws = (0..<100_000).map { _ in unit.nextUnit() }
        #expect(draws.allSatisfy { $0 >= 0 && $0 < 1 })
        #expect(abs(draws.reduce(0, +) / 100_000 - 0.5) < 0.01)
    }

    @Test("an impairment describes itself for logs")
    func description() {
        let text = Impairment(lossPercent: 10, delayMilliseconds: 20, jitterMilliseconds: 2.5, seed: 42).description
        #expect(text.contains("loss 10%") && text.contains("jitter 2.5ms") && text.contains("seed 42"))
        #expect(Impairment(seed: 99).isTransparent)
        #expect(!Impairment(delayMilliseconds: 1).isTransparent)
    }
}

extension SeededGenerator {
    fileprivate func nextFirst() -> UInt64 {
        var copy = self
        return copy.next()
    }
}
