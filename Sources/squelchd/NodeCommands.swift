import ArgumentParser
import ChannelStore
import ChannelStorePostgres
import ClusterPlacement
import Foundation
import PTTServer

/// `squelchd node`: a cluster's nodes, read from and marked in its database (the admin API's
/// `GET /v1/cluster` and `POST /v1/cluster/nodes/ID/drain` do the same through a running node).
struct Node: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "List a cluster's nodes, or drain one.",
        discussion: "Needs the cluster's database: --database (or SQUELCH_DATABASE, or \"database\" in --config).",
        subcommands: [List.self, Drain.self])

    struct List: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "List the nodes: state, liveness, load, heartbeat age and channels.")
        @OptionGroup var store: Channel.StoreOptions

        func run() async throws {
            let view = try await withCluster(store) { cluster throws(StoreError) in try await cluster.clusterView() }
            guard !view.nodes.isEmpty else {
                print("no nodes yet; start 'squelchd serve --database …' on each machine")
                return
            }
            let staleness = PlacementPolicy().heartbeatStaleness
            print(table(["NODE", "VOICE", "STATE", "LIVE", "LOAD", "HEARTBEAT", "CHANNELS"], view.nodes.map { node in
                let age = view.dbNow - node.row.heartbeat
                let channels = view.placements.filter { $0.home == node.id && !$0.isExpired(at: view.dbNow) }.count
                return [node.id.rawValue, "\(node.voiceHost):\(node.voicePort)", node.row.state.rawValue, age < staleness ? "yes" : "no",
                        "\(node.row.load)", "\(age.components.seconds) s ago", "\(channels)"]
            }))
        }
    }

    struct Drain: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Mark a node draining: it hands its channels to the other nodes and takes no new ones.",
            discussion: "The node keeps running; its members are told to move, and rejoin at once. To stop a node, send it SIGTERM: it drains first by itself.")
        @Argument(help: "The node's id ('squelchd node list').") var id: String
        @OptionGroup var store: Channel.StoreOptions

        func run() async throws {
            let marked = try await withCluster(store) { cluster throws(StoreError) in try await cluster.setNodeState(NodeID(id), .draining) }
            guard marked else {
                standardError("squelchd: no node '\(id)' in the cluster; 'squelchd node list' shows the nodes")
                throw ExitCode(1)
            }
            print("node \(id) is draining: it hands its channels over within its next heartbeat (a second)")
        }
    }
}

/// Runs `body` on the cluster's database; a single node's data directory is refused with the way out.
private func withCluster<T: Sendable>(_ options: Channel.StoreOptions,
                                      _ body: (PostgresChannelStore) async throws(StoreError) -> T) async throws -> T {
    guard try options.configuration().sharesDatabase else {
        standardError("squelchd: this is not a cluster: pass the cluster's database with --database postgres://… (or SQUELCH_DATABASE)")
        throw ExitCode(78)
    }
    return try await options.withStore { store throws(StoreError) in
        guard let cluster = store as? PostgresChannelStore else { throw StoreError.invalid("the database is not PostgreSQL") }
        return try await body(cluster)
    }
}
