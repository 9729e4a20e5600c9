import ClusterPlacement
import SeededRandom
import Testing

@Suite struct PlacementPolicyTests {
    let policy = PlacementPolicy()
    let now = DatabaseInstant(microseconds: 1_000_000_000)

    func node(_ id: NodeID, _ state: NodeState = .serving, load: Int = 0, age: Duration = .zero) -> NodeRow {
        NodeRow(id: id, voiceAddress: "\(id):7000", state: state, load: load, heartbeat: now - age)
    }

    func row(_ home: NodeID, _ epoch: Int64, expiresIn: Duration = .seconds(3)) -> PlacementRow<String> {
        PlacementRow(channel: "ops", home: home, epoch: Epoch(epoch), leaseExpiry: now + expiresIn)
    }

    func claim(_ current: PlacementRow<String>?, _ nodes: [NodeRow], by requester: NodeID, seed: UInt64 = 1) -> ClaimDecision<String> {
        var random = SplitMix64(seed: seed)
        return policy.claim("ops", current: current, nodes: nodes, requester: requester, dbNow: now, random: &random)
    }

    @Test func aFirstClaimPlacesTheChannelUnderEpochOneWithAFullLease() {
        let decision = claim(nil, [node("a")], by: "a")
        #expect(decision == .moved(PlacementRow(channel: "ops", home: "a", epoch: .first, leaseExpiry: now + .seconds(5)), previous: nil))
    }

    @Test func noLiveServingNodeMeansNoNodeAvailable() {
        #expect(claim(nil, [], by: "a") == .noNodeAvailable)
        #expect(claim(nil, [node("a", .draining), node("b", age: .seconds(10))], by: "a") == .noNodeAvailable)
        #expect(claim(row("b", 4, expiresIn: .zero), [node("a", .draining)], by: "a") == .noNodeAvailable)
    }

    /// The database's row lock serialises two first joins: the second sees the first one's row.
    @Test func concurrentFirstClaimsEndWithOneHome() {
        let nodes = [node("a"), node("b", load: 3), node("c", load: 1)]
        for seed in UInt64(1)...50 {
            for (first, second) in [("a", "b"), ("b", "c"), ("c", "a"), ("a", "a")] as [(NodeID, NodeID)] {
                guard case .moved(let placed, nil) = claim(nil, nodes, by: first, seed: seed) else {
                    Issue.record("first claim didn't place the channel")
                    continue
                }
                switch claim(placed, nodes, by: second, seed: seed &+ 1) {
                case .existing(let row):
                    #expect(row == placed && row.home != second)
                case .moved(let row, let previous):
                    // Only the home itself, not knowing yet, takes it up: same node, next epoch.
                    #expect(placed.home == second && row.home == second && row.epoch == placed.epoch.next && previous == placed)
                default:
                    Issue.record("second claim by \(second) after \(placed.home): unexpected")
                }
            }
        }
    }

    @Test func aDrainingNodeIsNeverChosenEvenWhenItAsks() {
        let nodes = [node("a", .draining), node("b", load: 100), node("c", .draining)]
        for seed in UInt64(1)...50 {
            guard case .moved(let placed, _) = claim(nil, nodes, by: "a", seed: seed) else {
                Issue.record("not placed")
                continue
            }
            #expect(placed.home == "b")
        }
    }

    @Test func aStaleHeartbeatExcludesANode() {
        let stale = node("a", age: .seconds(3)), fresh = node("b", load: 50, age: .milliseconds(2_999))
        #expect(!policy.isLive(stale, at: now) && policy.isLive(fresh, at: now))
        for seed in UInt64(1)...20 {
            guard case .moved(let placed, _) = claim(nil, [stale, fresh], by: "a", seed: seed) else {
                Issue.record("not placed")
                continue
            }
            #expect(placed.home == "b")
        }
    }

    @Test func everyMoveTakesTheNextEpoch() {
        let expired = row("a", 7, expiresIn: .zero)
        guard case .moved(let placed, let previous) = claim(expired, [node("a"), node("b")], by: "b") else {
            Issue.record("an expired lease wasn't taken")
            return
        }
        #expect(placed.epoch == Epoch(8) && previous == expired && placed.leaseExpiry == now + .seconds(5))
    }

    @Test func aLiveHomeKeepsItsChannelEvenWhileDraining() {
        let current = row("a", 3)
        #expect(claim(current, [node("a"), node("b")], by: "b") == .existing(current))
        #expect(claim(current, [node("a", .draining), node("b")], by: "b") == .existing(current))
    }

    /// A home that stopped heartbeating may only be paused, and may resume believing its lease.
    @Test func aSilentHomeKeepsItsChannelUntilTheLeaseExpires() {
        let current = row("a", 3, expiresIn: .milliseconds(1))
        let nodes = [node("a", age: .seconds(4)), node("b")]
        #expect(claim(current, nodes, by: "b") == .awaitingExpiry(current))
        #expect(claim(current, nodes.filter { $0.id == "b" }, by: "b") == .awaitingExpiry(current))
        guard case .moved(let placed, _) = claim(row("a", 3, expiresIn: .zero), nodes, by: "b") else {
            Issue.record("an expired lease wasn't taken")
            return
        }
        #expect(placed.home == "b" && placed.epoch == Epoch(4))
    }

    /// A node that didn't know it was the home (another node chose it, or it restarted) takes the
    /// channel up under a new epoch. A draining one can't, nor give it away: it may have taken the
    /// channel back (a handover that found no other node) since it asked.
    @Test func aHomeThatAsksTakesItsChannelUpAfresh() {
        let current = row("a", 3, expiresIn: .seconds(9))
        guard case .moved(let placed, current) = claim(current, [node("a", load: 99), node("b")], by: "a") else {
            Issue.record("not taken up")
            return
        }
        #expect(placed.home == "a" && placed.epoch == Epoch(4))
        #expect(placed.leaseExpiry == now + .seconds(9), "an expiry never moves earlier")
        #expect(claim(current, [node("a", .draining), node("b")], by: "a") == .awaitingExpiry(current))
    }

    @Test func theLessLoadedOfTwoChoicesWins() {
        let nodes = [node("a", load: 9), node("b", load: 1), node("c", load: 5)]
        var homes: [NodeID: Int] = [:]
        for seed in UInt64(1)...200 {
            var random = SplitMix64(seed: seed)
            homes[policy.chooseHome(among: nodes, at: now, random: &random)!.id, default: 0] += 1
        }
        #expect(homes["a"] == nil, "the most loaded is never chosen from two")
        #expect(homes["b", default: 0] > homes["c", default: 0])
        // The order rows come back in doesn't matter, only the generator.
        var first = SplitMix64(seed: 5), second = SplitMix64(seed: 5)
        let forward = policy.chooseHome(among: nodes, at: now, random: &first)
        let backward = policy.chooseHome(among: nodes.reversed(), at: now, random: &second)
        #expect(forward == backward)
    }

    @Test func renewalExtendsOnlyLeasesStillHeld() {
        let held: [HeldLease<String>] = ["ops", "fire", "moved", "gone", "late"].map { HeldLease(channel: $0, epoch: Epoch(2)) }
        let rows = [
            PlacementRow(channel: "ops", home: "a", epoch: Epoch(2), leaseExpiry: now + .seconds(1)),
            PlacementRow(channel: "fire", home: "a", epoch: Epoch(2), leaseExpiry: now + .seconds(8)),
            PlacementRow(channel: "moved", home: "b", epoch: Epoch(3), leaseExpiry: now + .seconds(4)),
            PlacementRow(channel: "late", home: "a", epoch: Epoch(2), leaseExpiry: now),
        ]
        let decision = policy.renew(held, current: rows, node: "a", dbNow: now)
        #expect(decision.renewed == [
            PlacementRow(channel: "ops", home: "a", epoch: Epoch(2), leaseExpiry: now + .seconds(5)),
            PlacementRow(channel: "fire", home: "a", epoch: Epoch(2), leaseExpiry: now + .seconds(8)),
        ])
        #expect(decision.lost == [
            LostLease(channel: "moved", epoch: Epoch(2), current: rows[2]),
            LostLease(channel: "gone", epoch: Epoch(2), current: nil),
            LostLease(channel: "late", epoch: Epoch(2), current: rows[3]),
        ])
    }

    @Test func aHandOverGoesToAnotherNodeUnderTheNextEpoch() {
        var random = SplitMix64(seed: 3)
        let current = row("a", 5)
        let moved = policy.handOver("ops", current: current, nodes: [node("a", .draining, load: 0), node("b", load: 7)],
                                    from: "a", epoch: Epoch(5), dbNow: now, random: &random)
        #expect(moved == .moved(PlacementRow(channel: "ops", home: "b", epoch: Epoch(6), leaseExpiry: now + .seconds(5)), previous: current))
        let kept = policy.handOver("ops", current: current, nodes: [node("a", .draining)], from: "a", epoch: Epoch(5),
                                   dbNow: now, random: &random)
        #expect(kept == .noNodeAvailable(kept: PlacementRow(channel: "ops", home: "a", epoch: Epoch(6), leaseExpiry: now + .seconds(5))))
        let stale = policy.handOver("ops", current: current, nodes: [node("b")], from: "a", epoch: Epoch(4), dbNow: now, random: &random)
        #expect(stale == .notHeld(current))
        #expect(policy.handOver("ops", current: nil, nodes: [node("b")], from: "a", epoch: Epoch(4), dbNow: now, random: &random) == .notHeld(nil))
    }

    @Test func aReleasedChannelIsFreeAtOnceAndKeepsItsEpoch() {
        let current = row("a", 5)
        #expect(policy.release("ops", current: current, node: "a", epoch: Epoch(4), dbNow: now) == nil)
        #expect(policy.release("ops", current: current, node: "b", epoch: Epoch(5), dbNow: now) == nil)
        let released = policy.release("ops", current: current, node: "a", epoch: Epoch(5), dbNow: now)
        #expect(released == PlacementRow(channel: "ops", home: "a", epoch: Epoch(5), leaseExpiry: now))
        guard case .moved(let placed, _) = claim(released, [node("b")], by: "b") else {
            Issue.record("a released channel wasn't free")
            return
        }
        #expect(placed.epoch == Epoch(6))
    }

    @Test func aFencedWritePassesOnlyForTheHomeAtItsEpoch() {
        let current = row("a", 5)
        #expect(PlacementPolicy.fencedWriteAllowed(row: current, writer: "a", epoch: Epoch(5)))
        #expect(!PlacementPolicy.fencedWriteAllowed(row: current, writer: "a", epoch: Epoch(4)))
        #expect(!PlacementPolicy.fencedWriteAllowed(row: current, writer: "b", epoch: Epoch(5)))
        #expect(!PlacementPolicy.fencedWriteAllowed(row: nil as PlacementRow<String>?, writer: "a", epoch: Epoch(5)))
    }
}
