import ArgumentParser
import Audio
import ChannelProtocol
import ChannelStore
import ChannelStorePostgres
import ClusterPlacement
import Foundation
import ImpairmentKit
import NIOCore
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
    @Option(help: "One-way delay (ms) of the path the redirect's cost is also measured on, in round trips.") var oneWayDelay = 25.0
    @Option(help: "Directory with ca.pem, server-chain.pem and server.key (make certs).") var certs = "certs"
    @Option(help: "squelchd executable (default: next to this one).") var squelchd: String?
    @OptionGroup var results: ResultsOptions

    func validate() throws {
        guard kills >= 1, joins >= 1, placements >= 10, (2...60).contains(lease), (1...500).contains(oneWayDelay) else {
            throw ValidationError("--kills and --joins at least 1, --placements at least 10, --lease 2-60, --one-way-delay 1-500")
        }
    }

    func run() async throws {
        let executable = try squelchdExecutable(squelchd)
        let database = PostgresTestServer()
        let rate = try await placementRate(try await database.makeDatabase())
        print(String(format: "cluster: %.0f placement transactions/s (%d first claims of distinct channels, 8 at once, 3 nodes)", rate, placements))

        let cluster = try await ProcessCluster(squelchd: executable, certs: certs, location: try await database.makeDatabase(), lease: lease)
        defer { cluster.stopAll() }
        let loopback = try await redirectCost(cluster)
        print(String(format: "cluster: on loopback, join %.2f ms at the home, %.2f ms through a redirect with its entry pass, %.2f ms without (median of %d each)",
                     loopback.direct, loopback.redirected, loopback.withoutPass, joins))
        let rtt = 2 * oneWayDelay
        let delayed = try await redirectCost(cluster, oneWay: oneWayDelay)
        let extra = delayed.extraRoundTrips(rtt, less: loopback), extraWithout = delayed.extraRoundTripsWithoutPass(rtt, less: loopback)
        print(String(format: "cluster: on a %.0f ms round-trip path, join %.1f ms at the home, %.1f ms through a redirect with its entry pass (+%.1f round trips beyond the loopback cost), %.1f ms without (+%.1f)",
                     rtt, delayed.direct, delayed.redirected, extra, delayed.withoutPass, extraWithout))
        let failovers = try await failoverTimes(cluster)
        let sorted = failovers.sorted()
        print(String(format: "cluster: after kill -9 of the home, the next burst was heard after p50 %.1f s, max %.1f s (%d kills, lease %d s)",
                     percentile(sorted, 0.5), sorted.last ?? .nan, sorted.count, lease))
        try results.record("cluster", [
            "placements_per_second": rate, "join_direct_ms": loopback.direct, "join_redirected_ms": loopback.redirected,
            "join_redirected_without_pass_ms": loopback.withoutPass, "path_rtt_ms": rtt,
            "path_join_direct_ms": delayed.direct, "path_join_redirected_ms": delayed.redirected,
            "path_join_redirected_without_pass_ms": delayed.withoutPass,
            "redirect_extra_round_trips": extra, "redirect_extra_round_trips_without_pass": extraWithout,
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

    /// Median join times (connect, handshake, join): at the channel's home, through another node that
    /// redirects, and through it again with the redirect's entry pass left unused (as before passes).
    struct RedirectCost {
        var direct: Double, redirected: Double, withoutPass: Double
        /// The redirect's extra time on a path with round trip `rtt`, less what it costs on loopback
        /// (`cpu`: the CPU of a second handshake, which no path delay changes), in round trips, to a
        /// tenth.
        func extraRoundTrips(_ rtt: Double, less cpu: RedirectCost) -> Double {
            ((redirected - direct - (cpu.redirected - cpu.direct)) / rtt * 10).rounded() / 10
        }
        func extraRoundTripsWithoutPass(_ rtt: Double, less cpu: RedirectCost) -> Double {
            ((withoutPass - direct - (cpu.withoutPass - cpu.direct)) / rtt * 10).rounded() / 10
        }
    }

    /// `oneWay` > 0: each node behind an impairment proxy that delays every datagram by that many
    /// milliseconds each way, so a round trip costs 2 × `oneWay` and the redirect's cost shows in round
    /// trips rather than in the CPU of a loopback handshake.
    func redirectCost(_ cluster: ProcessCluster, oneWay: Double = 0) async throws -> RedirectCost {
        let home = try await cluster.placeChannel()
        let other = cluster.nodes.indices.first { $0 != home && $0 != 0 } ?? 0
        var route: [Int: Int] = [:]  // a node's voice port → where this benchmark reaches it
        var proxies: [ImpairmentProxy] = []
        defer { for proxy in proxies { Task { await proxy.stop() } } }
        for index in cluster.nodes.indices {
            let port = cluster.port(index)
            guard oneWay > 0 else { route[port] = port; continue }
            let delay = Impairment(delayMilliseconds: oneWay)
            let proxy = ImpairmentProxy(upstream: try SocketAddress(ipAddress: "127.0.0.1", port: port), clientToServer: delay, serverToClient: delay)
            route[port] = try await proxy.start()
            proxies.append(proxy)
        }
        var direct: [Double] = [], redirected: [Double] = [], withoutPass: [Double] = []
        for round in 0 ..< joins {
            let token = try cluster.token("joiner-\(round)")
            direct.append(try await timedJoin(cluster, token: token, at: cluster.port(home), route: route))
            redirected.append(try await timedJoin(cluster, token: token, at: cluster.port(other), route: route))
            withoutPass.append(try await timedJoin(cluster, token: token, at: cluster.port(other), route: route, usePass: false))
        }
        return RedirectCost(direct: percentile(direct.sorted(), 0.5), redirected: percentile(redirected.sorted(), 0.5),
                            withoutPass: percentile(withoutPass.sorted(), 0.5))
    }

    /// Milliseconds from a new connection to `joined`, following a redirect if one comes, with its
    /// entry pass unless `usePass` is false.
    func timedJoin(_ cluster: ProcessCluster, token: String, at port: Int, route: [Int: Int], usePass: Bool = true) async throws -> Double {
        let started = ContinuousClock.now
        var member = try TestMember(port: route[port] ?? port, configuration: cluster.client)
        try await member.connect()
        var answer: ServerMessage? = try await member.join(token: token, channel: cluster.channel)
        if case .redirect(let home, let pass)? = answer {
            await member.close()
            var configuration = cluster.client
            if usePass, let pass { configuration.entryPass = EntryPass(ticket: Array(pass.ticket), key: Array(pass.key)) }
            member = try TestMember(port: route[Int(home.port)] ?? Int(home.port), configuration: configuration)
            try await member.connect()
            answer = await member.entered()
            if answer == nil { answer = try await member.join(token: token, channel: cluster.channel) }
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
