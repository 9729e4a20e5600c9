import APNsDevice
import APNs
import APNsSimulator
import ArgumentParser
import ChannelProtocol
import ChannelStore
import ChannelStoreSQLite
import Foundation
import NIOConcurrencyHelpers
import NIOPosix
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import ParticipantClaims
import ParticipantTokens
import SquelchTesting
import Wire

/// APNs push throughput and the wake time, against the APNs simulator in its own process
/// (`squelchd apns-sim`) on loopback: how many pushes per second one APNs client gets through, and how
/// long after a floor grant the last of N sleeping members' wake pushes reaches APNs.
struct Push: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "APNs: pushes per second to the simulator, and time from a floor grant to the last of N wake pushes.")

    @Option(help: "Pushes for the throughput run.") var pushes = 20_000
    @Option(help: "Pushes in flight at once in the throughput run.") var inFlight = 2_000
    @Option(help: "HTTP/2 connections in the client's pool.") var pool = 2
    @Option(help: "Pushes per call in the throughput run: a batch as a burst's wakes go (1: one push per call).")
    var batch = 250
    @Option(help: "Sleeping members woken per burst in the wake run (issue 44: 10,000 within 250 ms).") var wakes = 10_000
    @Option(help: "Bursts in the wake run.") var bursts = 5
    @Option(help: "Awake listeners in the wake run's channel, whose relayed audio is timed during the wakes and after.")
    var stormListeners = 200
    @Option(help: "Directory with the dev certificates and APNs key (make certs).") var certs = "certs"
    @Option(help: "squelchd executable (default: next to this one).") var squelchd: String?
    @Flag(help: "Also run nghttp2's h2load with the same request against the same simulator, alternating with ours.")
    var versusH2load = false
    @Option(help: "Rounds of the throughput run (each ours, then h2load's with --versus-h2load); medians are recorded.")
    var rounds = 1
    @OptionGroup var results: ResultsOptions

    func run() async throws {
        let server = try squelchdExecutable(squelchd)
        for file in ["ca.pem", "apns-sim.pem", "apns-sim.key", "AuthKey_DEVKEY0001.p8", "server-chain.pem", "server.key"] {
            guard FileManager.default.fileExists(atPath: "\(certs)/\(file)") else {
                throw ValidationError("no \(certs)/\(file); run 'make certs' or pass --certs")
            }
        }
        let simulator = try await SimulatorProcess.start(squelchd: server, certs: certs)
        defer { simulator.stop() }
        print("push: APNs simulator in its own process (squelchd apns-sim), TLS + HTTP/2 on loopback")
        var ours: [Throughput] = [], theirs: [Throughput] = []
        print("| client | pushes | in flight | connections | delivered | pushes/s | client CPU µs/push | simulator CPU µs/push |")
        print("|---|---|---|---|---|---|---|---|")
        for _ in 0..<max(rounds, 1) {
            ours.append(try await throughput(simulator))
            print(ours.last!.row("APNsClient", pushes: pushes, inFlight: inFlight, connections: pool))
            if versusH2load {
                theirs.append(try await h2load(simulator))
                print(theirs.last!.row("h2load", pushes: pushes, inFlight: inFlight, connections: pool))
            }
        }
        let wake = try await wakeTime(simulator, squelchd: server)
        var figures: [String: Any] = ["last_wake_ms": wake.worst * 1e3, "median_of_bursts_ms": wake.median * 1e3, "wakes_per_burst": wakes]
        if let storm = wake.storm, let quiet = wake.quiet {
            figures["storm"] = ["listeners": stormListeners, "relay_p50_ms": storm.relayP50 * 1e3, "relay_p99_ms": storm.relayP99 * 1e3,
                                "quiet_relay_p50_ms": quiet.relayP50 * 1e3, "quiet_relay_p99_ms": quiet.relayP99 * 1e3,
                                "p99_vs_quiet": storm.relayP99 / quiet.relayP99]
        }
        figures.merge(Throughput.median(ours).figures) { $1 }
        if !theirs.isEmpty {
            let (a, b) = (Throughput.median(ours), Throughput.median(theirs))
            figures["h2load"] = b.figures
            figures["cpu_vs_h2load"] = a.clientCPU / b.clientCPU
            figures["rate_vs_h2load"] = a.perSecond / b.perSecond
            print(String(format: "APNsClient against h2load (medians of %d rounds): CPU per push %.2fx, pushes/s %.2fx",
                         ours.count, a.clientCPU / b.clientCPU, a.perSecond / b.perSecond))
        }
        try results.record("push", figures)
    }

    /// One throughput run's figures: pushes/s, and CPU per push of the client and of the simulator.
    struct Throughput {
        var perSecond: Double
        var clientCPU: Double
        var simulatorCPU: Double
        var delivered: Int

        var figures: [String: Any] {
            ["per_second": perSecond, "client_cpu_us_per_push": clientCPU, "simulator_cpu_us_per_push": simulatorCPU]
        }

        func row(_ client: String, pushes: Int, inFlight: Int, connections: Int) -> String {
            "| \(client) | \(pushes) | \(inFlight) | \(connections) | \(delivered) | \(Int(perSecond)) | "
                + String(format: "%.1f | %.1f |", clientCPU, simulatorCPU)
        }

        /// Each figure's median over the runs, on its own.
        static func median(_ runs: [Throughput]) -> Throughput {
            func mid(_ values: [Double]) -> Double { percentile(values.sorted(), 0.5) }
            return Throughput(perSecond: mid(runs.map(\.perSecond)), clientCPU: mid(runs.map(\.clientCPU)),
                              simulatorCPU: mid(runs.map(\.simulatorCPU)), delivered: runs.map(\.delivered).min() ?? 0)
        }
    }

    var identity: APNsProviderIdentity {
        get throws { try APNsProviderIdentity.load(p8Path: "\(certs)/AuthKey_DEVKEY0001.p8", keyID: "DEVKEY0001", teamID: "DEVTEAM001") }
    }

    /// h2load's run: as many pushes, as many connections and streams in flight (`-c`, `-m`).
    func h2load(_ simulator: SimulatorProcess) async throws -> Throughput {
        let run = H2loadRun(port: simulator.port, pushes: pushes, connections: pool, streamsPerConnection: max(inFlight / pool, 1),
                            identity: try identity, topic: SimulatorProcess.topic)
        let (result, simulatorCPU) = try await run.run(simulatorPID: simulator.pid)
        return Throughput(perSecond: result.perSecond, clientCPU: result.cpuMicrosecondsPerPush, simulatorCPU: simulatorCPU,
                          delivered: result.succeeded)
    }

    /// Pushes per second delivered, and the CPU each side spent per push.
    func throughput(_ simulator: SimulatorProcess) async throws -> Throughput {
        let identity = try identity
        let client = try await APNsClient(configuration: APNsConfiguration(
            environment: .custom(host: "127.0.0.1", port: simulator.port, caPath: "\(certs)/ca.pem"), identity: identity,
            topic: SimulatorProcess.topic, poolSize: pool, requestTimeout: .seconds(10), retry: APNsRetryPolicy(budget: .seconds(10))))
        await client.preconnect()
        let channel = UUID()
        let failures = NIOLockedValueBox<[String: Int]>([:])
        @Sendable func push(_ indices: Range<Int>) async -> Int {
            let notifications = PushToTalkNotification.batch(indices.map { (hexToken($0), "Bench", channel) })
            let results = batch > 1 ? await client.send(notifications) : [await client.send(notifications[0])]
            var delivered = 0
            for result in results {
                switch result {
                case .success: delivered += 1
                case .failure(let failure): failures.withLockedValue { $0[failure.reason.label, default: 0] += 1 }
                }
            }
            return delivered
        }
        // Long-lived senders, each sending one batch (or push) after another, `inFlight` pushes out in
        // all, as h2load's streams are: a task per push would add the task's own cost to the client's.
        func blast(_ count: Int) async -> Int {
            let size = max(batch, 1)
            let senders = max(min(inFlight / size, (count + size - 1) / size), 1)
            return await withTaskGroup(of: Int.self) { group in
                for sender in 0..<senders {
                    group.addTask {
                        var delivered = 0
                        for start in stride(from: sender * size, to: count, by: senders * size) {
                            delivered += await push(start..<min(start + size, count))
                        }
                        return delivered
                    }
                }
                return await group.reduce(0, +)
            }
        }
        _ = await blast(2_000)  // warm-up: connections, HPACK tables, allocator
        let simCPU0 = try cpuSeconds(simulator.pid), ownCPU0 = try cpuSeconds(getpid())
        let start = ContinuousClock.now
        let delivered = await blast(pushes)
        let elapsed = (ContinuousClock.now - start) / .seconds(1)
        let simCPU = try cpuSeconds(simulator.pid) - simCPU0, ownCPU = try cpuSeconds(getpid()) - ownCPU0
        await client.shutdown()
        let failed = failures.withLockedValue { $0 }
        if !failed.isEmpty { print("failed pushes by reason: \(failed)") }
        return Throughput(perSecond: Double(delivered) / elapsed, clientCPU: ownCPU * 1e6 / Double(pushes),
                          simulatorCPU: simCPU * 1e6 / Double(pushes), delivered: delivered)
    }

    /// The relay's fan-out time (the server's own histogram) over a window of the wake run.
    struct RelayWindow {
        var relayP50: Double
        var relayP99: Double
    }

    /// The first-audio-to-last-push time over the bursts (median and worst, in seconds), and with
    /// listeners awake in the channel, the relay's fan-out time while the wakes go out (the first
    /// 400 ms of each burst) and after (the next 800 ms): issue 44 asks that pushes not starve the relay.
    func wakeTime(_ simulator: SimulatorProcess, squelchd: String) async throws
        -> (median: Double, worst: Double, storm: RelayWindow?, quiet: RelayWindow?) {
        let data = FileManager.default.temporaryDirectory.appendingPathComponent("squelch-push-\(UUID())").path
        try FileManager.default.createDirectory(atPath: data, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: data) }
        // The sleeping members go straight into the store: joining 1,000 clients only to disconnect them
        // would measure the handshake rate instead.
        let channel = ChannelRecord(name: "Wake bench", mode: .halfDuplex, maxBurstSeconds: 60)
        let store = try SQLiteChannelStore(directory: data)
        try await store.createChannel(channel)
        for index in 0..<wakes {
            let user = "sleeper-\(index)"
            try await store.upsertMember(MemberRecord(channelID: channel.id, userID: user, displayName: user))
            try await store.setPushToken(channel: channel.id, user: user, token: String(format: "%016x", index),
                                         environment: .production, registeredAt: Date())
        }
        try await store.close()

        let process = Process()
        process.executableURL = URL(fileURLWithPath: squelchd)
        process.arguments = ["serve", "--data-dir", data, "--port", "0", "--admin-port", "0", "--cert", "\(certs)/server-chain.pem",
                             "--key", "\(certs)/server.key", "--apns", "https://127.0.0.1:\(simulator.port)",
                             "--apns-ca", "\(certs)/ca.pem", "--apns-key", "\(certs)/AuthKey_DEVKEY0001.p8",
                             "--apns-topic", SimulatorProcess.topic, "--log-level", "notice",
                             "--floor-grants-per-minute", "1000000",  // bursts back to back: see ServeProcess
                             "--handshakes-per-second-per-address", "100000", "--max-connections", "\(stormListeners + 100)",
                             "--max-connections-per-address", "\(stormListeners + 100)"]
        let errors = Pipe()
        process.standardError = errors
        let log = LineCollector(errors)
        try process.run()
        defer { if process.isRunning { process.terminate(); process.waitUntilExit() } }
        guard let voiceLine = await log.wait(for: "voice transport listening", seconds: 30),
              let voicePort = lastPort(in: voiceLine),
              let adminLine = await log.wait(for: "admin API listening on", seconds: 30), let adminPort = lastPort(in: adminLine) else {
            throw ValidationError("squelchd did not start: \(log.text)")
        }
        let authority = try await TokenAuthority.loadOrCreate(in: data)
        let token = try await authority.issue(ParticipantClaims(userID: "talker", name: "Talker", channel: channel.id,
                                                                capabilities: [.talk, .listen], expiresAt: Date().addingTimeInterval(3600)))
        let ca = try String(contentsOfFile: "\(certs)/ca.pem", encoding: .utf8)
        let talker = try TestMember(port: voicePort, configuration: ClientConfiguration(serverName: "localhost", validator: try CertificateValidator(caPEM: ca)))
        try await talker.connect()
        guard case .joined? = try await talker.join(token: token, channel: channel.id, seconds: 30) else {
            throw ValidationError("the talker could not join: \(talker.messages)")
        }
        // Awake listeners, on one event loop of their own (as in the fan-out run): the relay's work
        // during the wakes.
        let listenerGroup = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        defer { listenerGroup.shutdownGracefully { _ in } }
        var listeners: [TestMember] = []
        for index in 0..<stormListeners {
            let member = try TestMember(port: voicePort, configuration: ClientConfiguration(serverName: "localhost", validator: try CertificateValidator(caPEM: ca)),
                                        group: listenerGroup)
            try await member.connect()
            let listenToken = try await authority.issue(ParticipantClaims(userID: "listener-\(index)", name: "Listener \(index)", channel: channel.id,
                                                                          capabilities: [.listen], expiresAt: Date().addingTimeInterval(3600)))
            guard case .joined? = try await member.join(token: listenToken, channel: channel.id, seconds: 30) else {
                throw ValidationError("listener \(index) could not join")
            }
            listeners.append(member)
        }
        var storm: [String: Double] = [:], quiet: [String: Double] = [:]
        func add(_ after: [String: Double], minus before: [String: Double], to total: inout [String: Double]) {
            for (key, value) in after where key.hasPrefix("squelch_relay_fanout_seconds") { total[key, default: 0] += value - (before[key] ?? 0) }
        }
        // The first burst also opens squelchd's APNs connections; it is not counted.
        var times: [Double] = []
        for burst in 0...bursts {
            try await simulator.clearLog()
            let mark = talker.messages.count
            try await talker.send(.floorRequest())
            guard let number = await talker.waitForFloor(.granted, after: mark)?.burst else { throw ValidationError("no floor grant") }
            // Wakes go with a burst's first audio, not its grant: the time runs from it. With listeners
            // awake, the talker goes on talking (50 packets/s) for 1.2 s: the wakes' window, then a quiet one.
            let metrics0 = stormListeners > 0 ? try await scrape(adminPort) : [:]
            let granted = Date()
            var metrics1: [String: Double] = [:]
            for sequence in 0..<(stormListeners > 0 ? 60 : 1) {
                let due = granted.addingTimeInterval(Double(sequence) * 0.02).timeIntervalSinceNow
                if due > 0 { try await Task.sleep(for: .milliseconds(Int(due * 1e3))) }
                _ = await talker.sendAudio(burst: number, sequence: UInt16(sequence), payload: [UInt8](repeating: 0x5A, count: 80))
                if sequence == 19 { metrics1 = try await scrape(adminPort) }
            }
            if stormListeners > 0, burst > 0 {
                try await Task.sleep(for: .milliseconds(100))  // the last packets relayed
                let metrics2 = try await scrape(adminPort)
                add(metrics1, minus: metrics0, to: &storm)
                add(metrics2, minus: metrics1, to: &quiet)
            }
            let pushes = try await simulator.waitForPushes(wakes, seconds: 30)
            guard pushes.count >= wakes, let last = pushes.map(\.receivedAt).max() else {
                throw ValidationError("only \(pushes.count) of \(wakes) wake pushes arrived")
            }
            if burst > 0 { times.append(last.timeIntervalSince(granted)) }
            try await talker.send(.floorRelease)
            guard await talker.waitForFloor(.idle, after: mark) != nil else { throw ValidationError("the floor was not released") }
            // squelchd wakes one member at most once a second (PushSchedule), and at most 3 times in
            // a row, then 10 a minute (the hub's wakesPerMinute): a burst sooner would measure that
            // hold, or no wake at all, not the wake path.
            try await Task.sleep(for: .milliseconds(burst < 2 ? 1_100 : 6_100))
        }
        let sorted = times.sorted()
        print("| sleeping members | bursts | first audio → last push accepted, median | max |")
        print("|---|---|---|---|")
        print("| \(wakes) | \(bursts) | " + String(format: "%.1f ms | %.1f ms |", percentile(sorted, 0.5) * 1e3, (sorted.last ?? .nan) * 1e3))
        await talker.close()
        for listener in listeners { await listener.close() }
        guard stormListeners > 0 else { return (percentile(sorted, 0.5), sorted.last ?? .nan, nil, nil) }
        let stormHistogram = Histogram(metrics: storm, minus: [:], name: "squelch_relay_fanout_seconds")
        let quietHistogram = Histogram(metrics: quiet, minus: [:], name: "squelch_relay_fanout_seconds")
        let during = RelayWindow(relayP50: stormHistogram.quantile(0.5), relayP99: stormHistogram.quantile(0.99))
        let after = RelayWindow(relayP50: quietHistogram.quantile(0.5), relayP99: quietHistogram.quantile(0.99))
        print("| \(stormListeners) listeners | relay p50 / p99 during the wakes | after |")
        print("|---|---|---|")
        print(String(format: "| fan-out | %.3f / %.3f ms | %.3f / %.3f ms |", during.relayP50 * 1e3, during.relayP99 * 1e3,
                     after.relayP50 * 1e3, after.relayP99 * 1e3))
        return (percentile(sorted, 0.5), sorted.last ?? .nan, during, after)
    }
}

/// A 16-digit hex device token for `index`, without `String(format:)`, whose cost per push would count
/// as the client's.
func hexToken(_ index: Int) -> String {
    let digits = String(index, radix: 16)
    return String(repeating: "0", count: max(16 - digits.count, 0)) + digits
}

/// `squelchd apns-sim` running in its own process, and its control API.
struct SimulatorProcess {
    static let topic = "org.squelch.bench.voip-ptt"
    let process: Process
    let port: Int
    let controlPort: Int
    var pid: Int32 { process.processIdentifier }

    static func start(squelchd: String, certs: String) async throws -> SimulatorProcess {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: squelchd)
        process.arguments = ["apns-sim", "--port", "0", "--control-port", "0", "--cert", "\(certs)/apns-sim.pem",
                             "--key", "\(certs)/apns-sim.key", "--provider-key", "\(certs)/AuthKey_DEVKEY0001.p8",
                             "--key-id", "DEVKEY0001", "--team-id", "DEVTEAM001", "--topic", topic]
        let output = Pipe()
        process.standardOutput = output
        process.standardError = output
        let log = LineCollector(output)
        try process.run()
        // The lines `squelchd apns-sim` prints for scripts (its log line names both ports).
        guard let apnsLine = await log.wait(for: "APNs simulator: https://", seconds: 20),
              let controlLine = await log.wait(for: "control API: http://", seconds: 20),
              let port = lastPort(in: apnsLine), let controlPort = lastPort(in: controlLine) else {
            process.terminate()
            throw ValidationError("squelchd apns-sim did not start: \(log.text)")
        }
        return SimulatorProcess(process: process, port: port, controlPort: controlPort)
    }

    func stop() {
        if process.isRunning { process.terminate(); process.waitUntilExit() }
    }

    func clearLog() async throws {
        var request = URLRequest(url: URL(string: "http://127.0.0.1:\(controlPort)/v1/pushes")!)
        request.httpMethod = "DELETE"
        _ = try await URLSession.shared.data(for: request)
    }

    func waitForPushes(_ count: Int, seconds: Double) async throws -> [APNsAcceptedPush] {
        struct Log: Decodable { var pushes: [APNsAcceptedPush] }
        let deadline = ContinuousClock.now + .seconds(seconds)
        var pushes: [APNsAcceptedPush] = []
        // The counter until they are all in (the whole log, fetched every 25 ms, would cost the simulator
        // and this process more than the pushes), then the log once.
        repeat {
            let (data, _) = try await URLSession.shared.data(from: URL(string: "http://127.0.0.1:\(controlPort)/v1/stats")!)
            if try APNsSimulatorJSON.decoder().decode(APNsSimulatorStats.self, from: data).accepted >= count { break }
            try await Task.sleep(for: .milliseconds(25))
        } while ContinuousClock.now < deadline
        let (data, _) = try await URLSession.shared.data(from: URL(string: "http://127.0.0.1:\(controlPort)/v1/pushes")!)
        pushes = try APNsSimulatorJSON.decoder().decode(Log.self, from: data).pushes
        return pushes
    }
}
