import ArgumentParser
import ChannelProtocol
import Foundation
import NIOPosix
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import SquelchTesting
import Wire
import WireNIO

/// Many channels talking at once (issue 41 item 4): C channels of L listeners, one talker each, all
/// at 50 packets a second, with squelchd's relay on one thread and then on each count given. The
/// figure is what the relay's extra threads change: the time from a talker's send to a listener's
/// socket (one listener per channel keeps its audio with arrival times), the server's own fan-out
/// time per talker packet (its histogram, which starts when the server takes the packet up, so it
/// leaves out a packet's wait behind others read with it, and counts a worker's), its CPU per
/// forwarded packet, and what arrived.
struct FanoutChannels: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "fanout-channels",
        abstract: "Many channels at once: the relay on one thread and on more (--relay-threads).")

    @Option(help: "Channels talking at once.") var channels = 50
    @Option(help: "Listeners per channel.") var listeners = 20
    @Option(help: "Relay thread counts to run, comma-separated (squelchd --relay-threads).") var relayThreads = "1,2"
    @Option(help: "Seconds of talking per run (50 packets/s per talker).") var seconds = 10.0
    @Option(help: "Directory with ca.pem, server-chain.pem and server.key (make certs).") var certs = "certs"
    @Option(help: "squelchd executable (default: next to this one).") var squelchd: String?
    @OptionGroup var results: ResultsOptions

    func run() async throws {
        let threads = relayThreads.split(separator: ",").compactMap { Int($0.trimmingCharacters(in: .whitespaces)) }
        guard !threads.isEmpty, threads.allSatisfy({ $0 > 0 }), channels > 0, listeners > 0 else {
            throw ValidationError("--channels, --listeners and --relay-threads must be positive, e.g. --relay-threads 1,2")
        }
        let server = try squelchdExecutable(squelchd)
        let client = try benchClient(certs: certs)
        print("fan-out, many channels: \(channels) channels x \(listeners) listeners, a talker each at 50 packets/s for \(seconds.formatted()) s")
        print("relay threads  server CPU/fwd pkt  server CPU (cores)  relay p50/p99 (server)  send to listener p50/p99  lost")
        var rows: [[String: Any]] = []
        for count in threads {
            let run = FanoutChannelsRun(channels: channels, listeners: listeners, relayThreads: count, seconds: seconds,
                                        squelchd: server, certs: certs, client: client)
            let row = try await run.run()
            print("\(String(count).padding(toLength: 13, withPad: " ", startingAt: 0))  "
                  + "\(fixed(row.cpuPerForward)) µs".padding(toLength: 18, withPad: " ", startingAt: 0)
                  + "  \(fixed(row.cores))".padding(toLength: 20, withPad: " ", startingAt: 0)
                  + "  \(fixed(row.relayP50 * 1e6, 0))/\(fixed(row.relayP99 * 1e6, 0)) µs".padding(toLength: 24, withPad: " ", startingAt: 0)
                  + "  \(fixed(row.deliveryP50 / 1e3, 0))/\(fixed(row.deliveryP99 / 1e3, 0)) µs".padding(toLength: 26, withPad: " ", startingAt: 0)
                  + "  \(row.expected - row.received)/\(row.expected)")
            rows.append(["relay_threads": count, "channels": channels, "listeners": listeners,
                         "cpu_us_per_packet": row.cpuPerForward, "server_cores": row.cores,
                         "relay_p50_ms": row.relayP50 * 1e3, "relay_p99_ms": row.relayP99 * 1e3,
                         "delivery_p50_ms": row.deliveryP50 / 1e6, "delivery_p99_ms": row.deliveryP99 / 1e6,
                         "lost": row.expected - row.received, "expected": row.expected])
        }
        try results.record("fanout_channels", rows)
    }
}

struct FanoutChannelsRun {
    let channels: Int
    let listeners: Int
    let relayThreads: Int
    let seconds: Double
    let squelchd: String
    let certs: String
    let client: ClientConfiguration

    struct Row {
        var cpuPerForward: Double
        var cores: Double
        var relayP50: Double
        var relayP99: Double
        /// Talker send to a listener's socket, nanoseconds.
        var deliveryP50: Double
        var deliveryP99: Double
        var received: Int
        var expected: Int
    }

    func run() async throws -> Row {
        let members = channels * (listeners + 1)
        let server = try await ServerProcess.start(squelchd: squelchd, certs: certs, extra: [
            "--handshakes-per-second-per-address", "100000", "--max-connections", "\(members + 100)",
            "--max-connections-per-address", "\(members + 100)", "--relay-threads", "\(relayThreads)",
            "--control-messages-per-second", "100000"], channels: channels)
        defer { server.stop() }
        // Listeners read on one loop, talkers send from another, as in `fanout`.
        let listenerGroup = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let talkerGroup = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        defer {
            listenerGroup.shutdownGracefully { _ in }
            talkerGroup.shutdownGracefully { _ in }
        }
        var heard: [TestMember] = []
        var samples: [TestMember] = []
        var talkers: [(TestMember, UInt16)] = []
        for (index, channel) in server.channels.enumerated() {
            let joined = try await withThrowingTaskGroup(of: TestMember.self) { group in
                for listener in 0 ..< listeners {
                    group.addTask {
                        // The first of each channel keeps its audio, with arrival times.
                        let member = try TestMember(port: server.voicePort, configuration: client, group: listenerGroup,
                                                    keepsAudio: listener == 0)
                        try await member.connect()
                        let token = try await server.token("listener-\(index)-\(listener)", [.listen], channel: channel)
                        guard case .joined? = try await member.join(token: token, channel: channel, seconds: 30) else {
                            throw ValidationError("listener \(listener) of channel \(index) could not join")
                        }
                        return member
                    }
                }
                return try await group.reduce(into: [TestMember]()) { $0.append($1) }
            }
            heard += joined
            samples.append(joined.first { $0.keepsAudio }!)
            let talker = try TestMember(port: server.voicePort, configuration: client, group: talkerGroup)
            try await talker.connect()
            guard case .joined? = try await talker.join(token: try await server.token("talker-\(index)", [.talk, .listen], channel: channel),
                                                        channel: channel, seconds: 30) else {
                throw ValidationError("the talker of channel \(index) could not join")
            }
            talkers.append((talker, 0))
        }
        // The floor once everyone is in: a talker granted early would lose it to the silence limit
        // (5 s) while the other channels' members join.
        for index in talkers.indices {
            try await talkers[index].0.send(.floorRequest())
            guard let burst = await talkers[index].0.waitForFloor(.granted)?.burst else { throw ValidationError("channel \(index): no grant") }
            talkers[index].1 = burst
        }

        let metricsBefore = try await scrape(server.adminPort)
        let cpuBefore = try cpuSeconds(server.process.processIdentifier)
        let wallBefore = Date()
        let countBefore = heard.reduce(0) { $0 + $1.audioCount }
        let packets = Int(seconds * 50)
        let start = WireNIO.now().nanoseconds
        let payload = [UInt8](repeating: 0x5A, count: 80)
        var sendTimes: [UInt64] = []
        for sequence in 0 ..< packets {
            let due = start + UInt64(sequence) * 20_000_000
            let now = WireNIO.now().nanoseconds
            if due > now { try await Task.sleep(for: .nanoseconds(due - now)) }
            sendTimes.append(WireNIO.now().nanoseconds)
            await withTaskGroup(of: Void.self) { group in
                for (talker, burst) in talkers {
                    group.addTask { _ = await talker.sendAudio(burst: burst, sequence: UInt16(sequence), payload: payload) }
                }
            }
        }
        try await Task.sleep(for: .milliseconds(1_500))
        let cpuAfter = try cpuSeconds(server.process.processIdentifier)
        let wall = Date().timeIntervalSince(wallBefore)
        let metricsAfter = try await scrape(server.adminPort)
        let received = heard.reduce(0) { $0 + $1.audioCount } - countBefore

        let forwarded = (metricsAfter["squelch_packets_out_total"] ?? 0) - (metricsBefore["squelch_packets_out_total"] ?? 0)
        let relay = Histogram(metrics: metricsAfter, minus: metricsBefore, name: "squelch_relay_fanout_seconds")
        var delivery: [Double] = []
        for (index, sample) in samples.enumerated() {
            for (datagram, at) in sample.timedAudio {
                guard let header = datagram.withUnsafeBytes({ AudioHeader(parsing: $0) }), header.burst == talkers[index].1,
                      Int(header.sequence) < packets, at > sendTimes[Int(header.sequence)] else { continue }
                delivery.append(Double(at - sendTimes[Int(header.sequence)]))
            }
        }
        delivery.sort()
        for member in heard { await member.close() }
        for (talker, _) in talkers { await talker.close() }
        return Row(cpuPerForward: forwarded > 0 ? (cpuAfter - cpuBefore) * 1e6 / forwarded : .nan,
                   cores: (cpuAfter - cpuBefore) / wall, relayP50: relay.quantile(0.5), relayP99: relay.quantile(0.99),
                   deliveryP50: percentile(delivery, 0.5), deliveryP99: percentile(delivery, 0.99),
                   received: received, expected: packets * channels * listeners)
    }
}
