import ChannelStore
@testable import ChannelStorePostgres
import ClusterPlacement
import Foundation
import PostgresTesting
import Testing

/// The placement core's decisions run as transactions on a real PostgreSQL: concurrent first claims
/// agree on one home, renewals keep it, and writes of a node that lost a channel are refused.
@Suite struct PostgresPlacementTests {
    let policy = PlacementPolicy(lease: .seconds(5), heartbeatStaleness: .seconds(3))

    func cluster(_ names: [String]) async throws -> (PostgresChannelStore, [NodeID]) {
        let store = try await PostgresChannelStore.open(try await PostgresTestServer.shared.makeDatabase())
        let ids = names.map { NodeID($0) }
        for (index, id) in ids.enumerated() {
            try await store.registerNode(id, voiceHost: "127.0.0.1", voicePort: 7700 + index, adminURL: nil)
        }
        return (store, ids)
    }

    func home(_ decision: ClaimDecision<UUID>) -> (NodeID, Epoch)? {
        switch decision {
        case .existing(let row), .moved(let row, _): (row.home, row.epoch)
        case .awaitingExpiry, .noNodeAvailable: nil
        }
    }

    @Test func fiftyConcurrentFirstClaimsOnThreeNodesAgreeOnOneHome() async throws {
        let (store, nodes) = try await cluster(["a", "b", "c"])
        let channel = UUID()
        let outcomes = try await withThrowingTaskGroup(of: ClaimOutcome.self) { group in
            for index in 0 ..< 50 {
                group.addTask { try await store.claim(channel, requester: nodes[index % 3], policy: self.policy) }
            }
            return try await group.reduce(into: []) { $0.append($1) }
        }
        let homes = outcomes.compactMap { home($0.decision) }
        #expect(homes.count == 50)
        // One home; every claim after the first either saw it (`existing`) or was the home itself
        // taking it up (a new epoch, same node).
        #expect(Set(homes.map(\.0)).count == 1, "\(homes)")
        let view = try await store.clusterView()
        #expect(view.placements.count == 1 && view.placements[0].home == homes[0].0)
        #expect(homes.map(\.1).max() == view.placements[0].epoch, "the row holds the latest epoch")
        try await store.close()
    }

    @Test func aHeldLeaseIsRenewedAndAnotherNodesIsNot() async throws {
        let (store, nodes) = try await cluster(["a", "b"])
        let channel = UUID()
        let first = try await store.claim(channel, requester: nodes[0], policy: policy)
        let (owner, epoch) = try #require(home(first.decision))
        let other = nodes.first { $0 != owner }!
        let renewed = try await store.heartbeat(owner, load: 1, state: .serving, renewing: [HeldLease(channel: channel, epoch: epoch)], policy: policy).renewal
        #expect(renewed.renewed.map(\.channel) == [channel] && renewed.lost.isEmpty)
        #expect(renewed.renewed[0].leaseExpiry >= first.dbNow + .seconds(5))
        let stolen = try await store.heartbeat(other, load: 0, state: .serving, renewing: [HeldLease(channel: channel, epoch: epoch)], policy: policy).renewal
        #expect(stolen.renewed.isEmpty && stolen.lost.map(\.channel) == [channel])
        // An operator's drain sticks through the node's own heartbeats, which report it back.
        #expect(try await store.setNodeState(owner, .draining))
        #expect(try await store.heartbeat(owner, load: 1, state: .serving, renewing: [], policy: policy).state == .draining)
        try await store.close()
    }

    @Test func aNodeThatLostAChannelCannotWriteForIt() async throws {
        let (store, nodes) = try await cluster(["a"])
        let channel = ChannelRecord(name: "Ops", maxBurstSeconds: 60)
        try await store.createChannel(channel)
        guard case .moved(let row, _) = try await store.claim(channel.id, requester: nodes[0], policy: policy).decision else {
            Issue.record("not placed"); return
        }
        let held = EpochBox(row.epoch)
        store.fence(PostgresChannelStore.Fencing(node: nodes[0]) { $0 == channel.id ? held.value : nil })
        let burst = TransmissionRecord(channelID: channel.id, userID: "ann", startedAt: Date(), durationMilliseconds: 0,
                                       endReason: TransmissionRecord.inProgress)
        #expect(try await store.apply([.logTransmission(burst)]) == [nil])
        // The channel moves on (another epoch); this node still believes the old one.
        _ = try await store.claim(channel.id, requester: nodes[0], policy: policy)
        let outcome = try await store.apply([.logTransmission(burst)])
        guard case .fenced? = outcome.first ?? nil else { Issue.record("expected a fenced refusal, got \(outcome)"); return }
        #expect(try await store.transmissions(of: channel.id, limit: 10).count == 1, "the refused write left nothing")
        try await store.close()
    }

    @Test func aChannelOfADeadNodeWaitsForItsLeaseThenMoves() async throws {
        let policy = PlacementPolicy(lease: .seconds(1), heartbeatStaleness: .milliseconds(500))
        let (store, nodes) = try await cluster(["a", "b"])
        let channel = UUID()
        // Placed on "a" (the only live node now: "b"'s heartbeat goes stale first).
        try await Task.sleep(for: .milliseconds(600))
        _ = try await store.heartbeat(nodes[0], load: 0, state: .serving, renewing: [], policy: policy)
        guard case .moved(let placed, _) = try await store.claim(channel, requester: nodes[0], policy: policy).decision else {
            Issue.record("not placed"); return
        }
        #expect(placed.home == nodes[0])
        // "a" dies (no more heartbeats); "b" comes alive and is asked for the channel.
        try await Task.sleep(for: .milliseconds(600))
        _ = try await store.heartbeat(nodes[1], load: 0, state: .serving, renewing: [], policy: policy)
        guard case .awaitingExpiry = try await store.claim(channel, requester: nodes[1], policy: policy).decision else {
            Issue.record("took the channel before the lease ran out"); return
        }
        try await Task.sleep(for: .milliseconds(500))
        _ = try await store.heartbeat(nodes[1], load: 0, state: .serving, renewing: [], policy: policy)
        let moved = try await store.claim(channel, requester: nodes[1], policy: policy).decision
        guard case .moved(let row, let previous) = moved else { Issue.record("\(moved)"); return }
        #expect(row.home == nodes[1] && row.epoch > placed.epoch && previous?.home == nodes[0])
        try await store.close()
    }
}

/// An epoch the test moves while the fencing closure reads it.
final class EpochBox: Sendable {
    let value: Epoch
    init(_ value: Epoch) { self.value = value }
}
