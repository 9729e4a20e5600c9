import ChannelStore
import ClusterPlacement
import Foundation
import Logging
import PostgresNIO

/// A node of the cluster as its `node` row has it.
public struct ClusterNodeRecord: Sendable, Equatable {
    public var row: NodeRow
    public var voiceHost: String
    public var voicePort: Int
    /// Where its admin API is, for operators (`GET /v1/cluster`).
    public var adminURL: String?

    public var id: NodeID { row.id }
}

/// What `claim` decided, with what it was decided on.
public struct ClaimOutcome: Sendable {
    public var decision: ClaimDecision<UUID>
    public var nodes: [ClusterNodeRecord]
    public var dbNow: DatabaseInstant

    public func node(_ id: NodeID) -> ClusterNodeRecord? { nodes.first { $0.id == id } }
}

/// The whole cluster as the database has it: `GET /v1/cluster`.
public struct ClusterView: Sendable {
    public var dbNow: DatabaseInstant
    public var nodes: [ClusterNodeRecord]
    public var placements: [PlacementRow<UUID>]
}

// The placement core's decisions (ClusterPlacement), each run inside one transaction: the rows it
// decides on are read FOR UPDATE, the database's `now()` is its clock, and what it returns is written
// before the commit. The row lock serialises deciders, so concurrent first joins agree on one home.
extension PostgresChannelStore {

    static let nodeColumns = "id, voice_host, voice_port, admin_url, state, load, heartbeat_us"
    static let placementColumns = "channel_id, home, epoch, lease_expires_us"
    static let databaseNow: PostgresQuery = "SELECT (extract(epoch FROM now()) * 1000000)::bigint"

    static func nodeRecord(_ row: PostgresRow) throws -> ClusterNodeRecord {
        let (id, host, port, admin, state, load, heartbeat) = try row.decode((String, String, Int32, String?, String, Int64, Int64).self)
        let node = NodeRow(id: NodeID(id), voiceAddress: "\(host):\(port)", state: NodeState(rawValue: state) ?? .draining,
                           load: Int(load), heartbeat: DatabaseInstant(microseconds: heartbeat))
        return ClusterNodeRecord(row: node, voiceHost: host, voicePort: Int(port), adminURL: admin)
    }

    /// A placement row; nil for the placeholder of a channel never placed (epoch 0).
    static func placement(_ row: PostgresRow) throws -> PlacementRow<UUID>? {
        let (channel, home, epoch, expiry) = try row.decode((UUID, String, Int64, Int64).self)
        guard epoch > 0 else { return nil }
        return PlacementRow(channel: channel, home: NodeID(home), epoch: Epoch(epoch), leaseExpiry: DatabaseInstant(microseconds: expiry))
    }

    static func now(on connection: PostgresConnection, logger: Logger) async throws -> DatabaseInstant {
        DatabaseInstant(microseconds: try await connection.rows(databaseNow, logger: logger) { try $0.decode(Int64.self) }.first ?? 0)
    }

    static func write(_ row: PlacementRow<UUID>, on connection: PostgresConnection, logger: Logger) async throws {
        try await connection.execute("""
            INSERT INTO placement (channel_id, home, epoch, lease_expires_us)
            VALUES (\(row.channel), \(row.home.rawValue), \(row.epoch.rawValue), \(row.leaseExpiry.microseconds))
            ON CONFLICT (channel_id) DO UPDATE SET home = excluded.home, epoch = excluded.epoch,
                lease_expires_us = excluded.lease_expires_us
            """, logger: logger)
    }

    static func nodes(on connection: PostgresConnection, logger: Logger) async throws -> [ClusterNodeRecord] {
        try await connection.rows("SELECT \(unescaped: nodeColumns) FROM node ORDER BY id", logger: logger, nodeRecord)
    }

    /// Records this node as serving (or serving again, after a restart under the same id), with a
    /// heartbeat now.
    public func registerNode(_ id: NodeID, voiceHost: String, voicePort: Int, adminURL: String?) async throws(StoreError) {
        let logger = logger
        try await withConnection("register node \(id)") { connection in
            try await connection.execute("""
                INSERT INTO node (id, voice_host, voice_port, admin_url, state, load, heartbeat_us, started_us)
                VALUES (\(id.rawValue), \(voiceHost), \(Int32(voicePort)), \(adminURL), 'serving', 0,
                        (extract(epoch FROM now()) * 1000000)::bigint, (extract(epoch FROM now()) * 1000000)::bigint)
                ON CONFLICT (id) DO UPDATE SET voice_host = excluded.voice_host, voice_port = excluded.voice_port,
                    admin_url = excluded.admin_url, state = 'serving', heartbeat_us = excluded.heartbeat_us,
                    started_us = excluded.started_us
                """, logger: logger)
        }
    }

    /// The node's heartbeat (with its load) and its lease renewals, in one transaction: one round
    /// trip a second. Call `LeaseKeeper.renewalSucceeded` with the time taken before this call.
    /// A node that is draining says so; one an operator marked draining (`setNodeState`) stays so,
    /// and learns it from `state` in the answer.
    public func heartbeat(_ id: NodeID, load: Int, state: NodeState, renewing held: [HeldLease<UUID>],
                          policy: PlacementPolicy) async throws(StoreError) -> (renewal: RenewalDecision<UUID>, state: NodeState) {
        let logger = logger
        return try await transaction("renew node \(id)'s leases") { connection in
            let recorded = try await connection.rows("""
                UPDATE node SET heartbeat_us = (extract(epoch FROM now()) * 1000000)::bigint, load = \(Int64(load)),
                    state = CASE WHEN \(state.rawValue) = 'draining' THEN 'draining' ELSE state END
                WHERE id = \(id.rawValue) RETURNING state
                """, logger: logger) { try $0.decode(String.self) }.first.flatMap(NodeState.init(rawValue:)) ?? state
            guard !held.isEmpty else { return (RenewalDecision(), recorded) }
            let dbNow = try await Self.now(on: connection, logger: logger)
            let channels = held.map(\.channel)
            let rows = try await connection.rows("""
                SELECT \(unescaped: Self.placementColumns) FROM placement WHERE channel_id = ANY(\(channels)) ORDER BY channel_id FOR UPDATE
                """, logger: logger, Self.placement).compactMap { $0 }
            let decision = policy.renew(held, current: rows, node: id, dbNow: dbNow)
            for row in decision.renewed { try await Self.write(row, on: connection, logger: logger) }
            return (decision, recorded)
        }
    }

    /// Decides where `channel` lives for a join that reached `requester`, and writes it.
    public func claim(_ channel: UUID, requester: NodeID, policy: PlacementPolicy) async throws(StoreError) -> ClaimOutcome {
        let logger = logger
        return try await transaction("place channel \(channel)") { connection in
            // A row to lock even for a channel never placed: concurrent first claims queue on it.
            try await connection.execute("""
                INSERT INTO placement (channel_id, home, epoch, lease_expires_us) VALUES (\(channel), '', 0, 0)
                ON CONFLICT (channel_id) DO NOTHING
                """, logger: logger)
            let current = try await connection.rows("""
                SELECT \(unescaped: Self.placementColumns) FROM placement WHERE channel_id = \(channel) FOR UPDATE
                """, logger: logger, Self.placement).first ?? nil
            let dbNow = try await Self.now(on: connection, logger: logger)
            let nodes = try await Self.nodes(on: connection, logger: logger)
            var random = SystemRandomNumberGenerator()
            let decision = policy.claim(channel, current: current, nodes: nodes.map(\.row), requester: requester,
                                        dbNow: dbNow, random: &random)
            if case .moved(let row, _) = decision {
                try await Self.write(row, on: connection, logger: logger)
                if row.home == requester {
                    // Taken up by this node under a new epoch: bursts still logged as going on belong
                    // to an earlier home's term, which can no longer end them (its writes are fenced).
                    try await connection.execute("""
                        UPDATE transmission SET end_reason = \(TransmissionRecord.interrupted)
                        WHERE channel_id = \(channel) AND end_reason = \(TransmissionRecord.inProgress)
                        """, logger: logger)
                }
            }
            return ClaimOutcome(decision: decision, nodes: nodes, dbNow: dbNow)
        }
    }

    /// A draining node gives `channel` (held under `epoch`) to another live node.
    public func handOver(_ channel: UUID, from: NodeID, epoch: Epoch,
                         policy: PlacementPolicy) async throws(StoreError) -> (decision: HandOverDecision<UUID>, nodes: [ClusterNodeRecord]) {
        let logger = logger
        return try await transaction("hand over channel \(channel)") { connection in
            let current = try await connection.rows("""
                SELECT \(unescaped: Self.placementColumns) FROM placement WHERE channel_id = \(channel) FOR UPDATE
                """, logger: logger, Self.placement).first ?? nil
            let dbNow = try await Self.now(on: connection, logger: logger)
            let nodes = try await Self.nodes(on: connection, logger: logger)
            var random = SystemRandomNumberGenerator()
            let decision = policy.handOver(channel, current: current, nodes: nodes.map(\.row), from: from, epoch: epoch,
                                           dbNow: dbNow, random: &random)
            switch decision {
            case .moved(let row, _), .noNodeAvailable(let row): try await Self.write(row, on: connection, logger: logger)
            case .notHeld: break
            }
            return (decision, nodes)
        }
    }

    /// Ends `node`'s lease on a channel it stopped serving, so that the next join places it at once.
    public func release(_ channel: UUID, node: NodeID, epoch: Epoch, policy: PlacementPolicy) async throws(StoreError) {
        let logger = logger
        try await transaction("release channel \(channel)") { connection in
            let current = try await connection.rows("""
                SELECT \(unescaped: Self.placementColumns) FROM placement WHERE channel_id = \(channel) FOR UPDATE
                """, logger: logger, Self.placement).first ?? nil
            let dbNow = try await Self.now(on: connection, logger: logger)
            if let row = policy.release(channel, current: current, node: node, epoch: epoch, dbNow: dbNow) {
                try await Self.write(row, on: connection, logger: logger)
            }
        }
    }

    /// Marks a node draining (it takes no new channels) or serving.
    public func setNodeState(_ id: NodeID, _ state: NodeState) async throws(StoreError) -> Bool {
        let logger = logger
        return try await withConnection("mark node \(id) \(state.rawValue)") { connection in
            try await connection.count("UPDATE node SET state = \(state.rawValue) WHERE id = \(id.rawValue) RETURNING 1", logger: logger) > 0
        }
    }

    /// Every node and every placement, by the database's clock.
    public func clusterView() async throws(StoreError) -> ClusterView {
        let logger = logger
        return try await withConnection("read the cluster") { connection in
            let dbNow = try await Self.now(on: connection, logger: logger)
            let nodes = try await Self.nodes(on: connection, logger: logger)
            let placements = try await connection.rows("""
                SELECT \(unescaped: Self.placementColumns) FROM placement WHERE epoch > 0 ORDER BY channel_id
                """, logger: logger, Self.placement).compactMap { $0 }
            return ClusterView(dbNow: dbNow, nodes: nodes, placements: placements)
        }
    }
}
