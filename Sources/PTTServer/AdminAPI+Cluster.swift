import ChannelStore
import ChannelStorePostgres
import ClusterPlacement
import Foundation
import Hummingbird

extension AdminAPI {
    /// The cluster as the shared database has it, from any node: its nodes, their state, load,
    /// heartbeat age and channels; and an operator's drain of a node.
    struct ClusterController {
        let admin: AdminContext

        /// One node in `GET /v1/cluster`.
        struct Node: Codable {
            var id: String
            var voice: String
            var admin: String?
            var state: String
            /// Live: its heartbeat is recent enough to be given channels (the database's clock).
            var live: Bool
            var load: Int
            var heartbeatAgeSeconds: Double
            var channels: [UUID]
        }

        struct Cluster: Codable {
            var nodes: [Node]
        }

        func addRoutes(to group: RouterGroup<BasicRequestContext>) {
            let admin = self.admin
            group.get("cluster") { _, _ in
                let view = try await Self.shared(admin.store).clusterView()
                let staleness = PlacementPolicy().heartbeatStaleness
                let nodes = view.nodes.map { node in
                    Node(id: node.id.rawValue, voice: "\(node.voiceHost):\(node.voicePort)", admin: node.adminURL,
                         state: node.row.state.rawValue, live: view.dbNow - node.row.heartbeat < staleness, load: node.row.load,
                         heartbeatAgeSeconds: Double((view.dbNow - node.row.heartbeat).components.seconds)
                            + Double((view.dbNow - node.row.heartbeat).components.attoseconds) / 1e18,
                         channels: view.placements.filter { $0.home == node.id && !$0.isExpired(at: view.dbNow) }.map(\.channel))
                }
                return try json(Cluster(nodes: nodes))
            }

            group.post("cluster/nodes/:node/drain") { _, context in
                let node = try context.parameters.require("node")
                guard try await Self.shared(admin.store).setNodeState(NodeID(node), .draining) else {
                    throw AdminError(.notFound, "no node '\(node)' in the cluster; GET /v1/cluster lists the nodes")
                }
                await admin.audit("node drained", channel: nil, ["node": node])
                return try json(["node": node, "state": "draining"], status: .accepted)
            }
        }

        static func shared(_ store: any ChannelStore) throws -> PostgresChannelStore {
            guard let shared = store as? PostgresChannelStore else {
                throw AdminError(.notFound, "this squelchd is not a node of a cluster (it keeps its data in SQLite); start the nodes with --database postgres://… to run a cluster")
            }
            return shared
        }
    }
}
