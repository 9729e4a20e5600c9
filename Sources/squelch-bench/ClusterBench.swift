import ArgumentParser
import Audio
import ChannelProtocol
import ChannelStore
import ChannelStorePostgres
import ClusterPlacement
import Foundation
import PostgresTesting
import PTTClient
import PTTClientTesting
import SquelchTesting
import Wire

/// A cluster of three `squelchd serve` processes on a private PostgreSQL: how long a channel is silent
/// after `kill -9` of its home, what a redirect adds to a join, and how many placement transactions
/// the database takes a second.
struct ClusterBenchmark: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "cluster",
        abstract: "Failover time after kill -9 of a channel's home, the cost of a redirect on a join, placement transactions per second.")

    @Option(help: "Homes killed (one failover measured each).") var kills = 10
    @Option(help: "Joins timed, direct and through a redirect.") var joins = 20
    @Option(help: "Placement transactions for the rate.") var placements = 2_000
    @Option(help: "Lease length (seconds) the nodes run with.") var lease = 5
    @Option(help: "Directory with ca.pem, server-chain.pem and server.key (make certs).") var certs = "certs"
    @Option(help: "squelchd executable (default: next to this one).") var squelchd: String?
    @OptionGroup var results: ResultsOptions

    func validate() throws {
        guard kills >= 1, joins >= 1, placements >= 10, (2...60).contains(lease) else {
            throw ValidationError("--kills and --joins at least 1, --placements at least 10, --lease 2-60")
        }
    }

    func run() async throws {
        let executable = try squelchdExecutable(squelchd)
        let database = PostgresTestServer()
        let rate = try await placementRate(try await database.makeDatabase())
        print(String(format: "cluster: %.0f placement transactions/s (%d first claims of distinct channels, 8 at once, 3 nodes)", rate, placements))

        let cluster = try await ProcessCluster(squelchd: executable, certs: certs, location: try await database.makeDatabase(), lease: lease)
        defer { cluster.stopAll() }
        let (direct, redirected) = try await redirectCost(cluster)
        print(String(format: "cluster: join %.2f ms at the home, %.2f ms through a redirect (median of %d each): +%.2f ms, a join and a handshake more",
                     direct, redirected, joins, redirected - direct))
        let failovers = try await failoverTimes(cluster)
        let sorted = failovers.sorted()
        print(String(format: "cluster: after kill -9 of the home, the next burst was heard after p50 %.1f s, max %.1f s (%d kills, lease %d s)",
                     percentile(sorted, 0.5), sorted.last ?? .nan, sorted.count, lease))
        try results.record("cluster", [
            "placements_per_second": rate, "join_direct_ms": direct, "join_redirected_ms": redirected,
            "failover_p50_s": percentile(sorted, 0.5), "failover_max_s": sorted.last ?? 0, "failover_s": sorted,
            "kills": sorted.count, "lease_s": lease,
        ] as [String: Any])
    }

    /// First claims of distinct channels, 8 transactions at once, on a cluster of three nodes.
    func placementRate(_ location: PostgresLocation) async throws -> Double {
        let store = try await PostgresChannelStore.open(location)
        defer { Task { try? await store.close() } }
        let nodes = (1...3).map { NodeID("bench-\($0)") }
        for (index, node) in nodes.enumerated() { try await store.registerNode(node, voiceHost: "127.0.0.1", voicePort: 7700 + index, adminURL: nil) }
        let policy = PlacementPolicy()
        let channels = (0 ..< placements).map { _ in UUID() }
        let started = ContinuousClock.now
        try await withThrowingTaskGroup(of: Void.self) { group in
            for lane in 0 ..< 8 {
                group.addTask {
                    for index in stride(from: lane, to: channels.count, by: 8) {
                        _ = try await store.claim(channels[index], requester: nodes[index % 3], policy: policy)
                    }
                }
            }
            try await group.waitForAll()
        }
        return Double(placements) / ((ContinuousClock.now - started) / .seconds(1))
    }

    /// Median join time (connect, handshake, join) at the channel's home, and through another node.
    func redirectCost(_ cluster: ProcessCluster) async throws -> (direct: Double, redirected: Double) {
        let home = try await cluster.placeChannel()
        let other = cluster.nodes.indices.first { $0 != home && $0 != 0 } ?? 0
        var direct: [Double] = [], redirected: [Double] = []
        for round in 0 ..< joins {
            let token = try cluster.token("joiner-\(round)")
            direct.append(try await timedJoin(cluster, token: token, at: cluster.port(home)))
            redirected.append(try await timedJoin(cluster, token: token, at: cluster.port(other)))
        }
        return (percentile(direct.sorted(), 0.5), percentile(redirected.sorted(), 0.5))
    }

    /// Milliseconds from a new connection to `joined`, following a redirect if one comes.
    func timedJoin(_ cluster: ProcessCluster, token: String, at port: Int) async throws -> Double {
        let started = ContinuousClock.now
        var member = try TestMember(port: port, configuration: cluster.client)
        try await member.connect()
        var answer: ServerMessage? = try await member.join(token: token, channel: cluster.channel)
        if case .redirect(let home, _)? = answer {
            await member.close()
            member = try TestMember(port: Int(home.port), configuration: cluster.client)
            try await member.connect()
            answer = try await member.join(token: token, channel: cluster.channel)
        }
        let milliseconds = (ContinuousClock.now - started) / .milliseconds(1)
        await member.close()
        guard case .joined? = answer else { throw ValidationError("a join failed: \(String(describing: answer))") }
        return milliseconds
    }

    /// Kills the home `kills` times; each time, the seconds until a listener hears the next burst.
    /// The members enter through node 0, kept draining so that it is never a home itself (killing
    /// the entry point would leave them nowhere to go).
    func failoverTimes(_ cluster: ProcessCluster) async throws -> [Double] {
        try cluster.squelchd(["node", "drain", "node-0"])
        let talker = try await RecordingMember("talker", in: cluster.root, talkSeconds: 0.5)
        let listener = try await RecordingMember("listener", in: cluster.root)
        defer { Task { await talker.invalidate(); await listener.invalidate() } }
        try await talker.join(cluster.channel, credentials: cluster.credentials(try cluster.token("talker")))
        try await listener.join(cluster.channel, credentials: cluster.credentials(try cluster.token("listener")))
        guard await talker.talk(cluster.channel, within: 15), await eventually(seconds: 10, { listener.bursts >= 1 }) else {
            throw ValidationError("the first burst was not heard")
        }
        var times: [Double] = []
        for _ in 0 ..< kills {
            guard let home = try await cluster.home(), home != 0 else { throw ValidationError("the channel has no home to kill") }
            let heard = listener.bursts
            let killed = Date()
            cluster.kill(home)
            // The talker keys up again and again, as a user would, until the listener hears a burst:
            // one spoken while the listener was still finding the new home is not heard.
            let deadline = ContinuousClock.now + .seconds(40)
            var talked = false
            while ContinuousClock.now < deadline, listener.bursts <= heard {
                talked = await talker.talk(cluster.channel, within: 10) || talked
                _ = await eventually(seconds: 1.5) { listener.bursts > heard }
            }
            guard talked, listener.bursts > heard else {
                let logs = cluster.nodes.indices.map { "node-\($0): " + (cluster.nodes[$0]?.log.text.suffix(1200) ?? "killed") }
                throw ValidationError("no burst was heard after killing node-\(home) (kill \(times.count + 1); talker \(talked ? "talked" : "could not talk"), \(talker.client.serviceStatus), listener \(listener.client.serviceStatus), home now \(String(describing: try? await cluster.home())))\nlistener: \(listener.recentEvents.joined(separator: "\n  "))\n\(logs.joined(separator: "\n"))")
            }
            times.append((listener.lastHeard ?? Date()).timeIntervalSince(killed))
            try await cluster.restart(home)
        }
        return times
    }
}

/// Three `squelchd serve` processes sharing one database, for the cluster benchmark.
final class ProcessCluster {
    let executable: String
    let certs: String
    let location: PostgresLocation
    let root: String
    let client: ClientConfiguration
    let channel: UUID
    let lease: Int
    var nodes: [ServeProcess?] = [nil, nil, nil]

    init(squelchd: String, certs: String, location: PostgresLocation, lease: Int) async throws {
        executable = squelchd
        self.certs = certs
        self.location = location
        self.lease = lease
        root = FileManager.default.temporaryDirectory.appendingPathComponent("squelch-cluster-\(UUID())").path
        client = try benchClient(certs: certs)
        guard let id = UUID(uuidString: try squelchdCommand(squelchd, ["channel", "create", "--name", "Bench", "--database", location.url])
            .trimmingCharacters(in: .whitespacesAndNewlines)) else { throw ValidationError("squelchd channel create printed no id") }
        channel = id
        for index in nodes.indices { try await restart(index) }
    }

    func restart(_ index: Int) async throws {
        nodes[index] = try await ServeProcess.launch(
            squelchd: executable, certs: certs, data: root + "/node-\(index)",
            extra: ["--database", location.url, "--node-id", "node-\(index)", "--lease-seconds", "\(lease)"])
    }

    func kill(_ index: Int) {
        guard let node = nodes[index] else { return }
        Glibc.kill(node.process.processIdentifier, SIGKILL)
        node.process.waitUntilExit()
        nodes[index] = nil
    }

    func stopAll() {
        for index in nodes.indices { nodes[index]?.stop() }
        try? FileManager.default.removeItem(atPath: root)
    }

    func port(_ index: Int) -> Int { nodes[index]?.voicePort ?? 0 }

    /// What a member needs to join through node 0 (the entry point).
    func credentials(_ token: String) -> ChannelCredentials {
        ChannelCredentials(host: "127.0.0.1", port: port(0), serverName: "localhost", caPath: certs + "/ca.pem", token: token)
    }

    @discardableResult
    func squelchd(_ arguments: [String]) throws -> String { try squelchdCommand(executable, arguments + ["--database", location.url]) }

    func token(_ user: String) throws -> String {
        try squelchd(["token", "issue", "--channel", channel.uuidString, "--user", user, "--name", user.capitalized])
            .trimmingCharacters(in: .whitespacesAndNewlines)
    }

    /// Places the channel (a join through node 0) and returns its home.
    func placeChannel() async throws -> Int {
        let member = try TestMember(port: port(0), configuration: client)
        try await member.connect()
        _ = try await member.join(token: try token("placer"), channel: channel)
        await member.close()
        guard let home = try await home() else { throw ValidationError("the channel was not placed") }
        return home
    }

    /// The node whose live lease holds the channel.
    func home() async throws -> Int? {
        let store = try await PostgresChannelStore.open(location)
        defer { Task { try? await store.close() } }
        let view = try await store.clusterView()
        guard let row = view.placements.first(where: { $0.channel == channel }), !row.isExpired(at: view.dbNow) else { return nil }
        return Int(row.home.rawValue.dropFirst("node-".count))
    }

}
