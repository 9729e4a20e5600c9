import ArgumentParser
import ChannelProtocol
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
import WireNIO

/// One talker, N listeners, a real squelchd in its own process on loopback. Measures what the relay
/// costs: the server's CPU per forwarded packet (from /proc, so everything the process did counts:
/// receiving, sealing, sending, the listeners' ACKs), the server's own fan-out time per talker packet
/// (its `squelch_relay_fanout_seconds` histogram), the time until the last listener has the packet
/// as this process sees it, and the floor grant time.
struct Fanout: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Relay fan-out: server CPU per forwarded packet, time to the last listener, floor grant time.")

    @Option(help: "Listener counts to run, comma-separated.") var listeners = "20,50,100,200,1000"
    @Option(help: "Seconds of talking per run (50 packets/s).") var seconds = 10.0
    @Option(help: "Floor request/release cycles for the grant time, with the channel idle, and as many again back to back.") var grants = 100
    @Option(help: "Directory with ca.pem, server-chain.pem and server.key (make certs).") var certs = "certs"
    @Option(help: "squelchd executable (default: next to this one).") var squelchd: String?
    @Flag(help: "After each squelchd run, Mumble's server with the same load (bench/mumble_load.py; make deps installs mumble-server).")
    var versusMumble = false
    @Option(help: "The bench's Python, with its packages (make bench-tools).") var python = "bench/.venv/bin/python3"
    @OptionGroup var results: ResultsOptions

    func run() async throws {
        let counts = listeners.split(separator: ",").compactMap { Int($0.trimmingCharacters(in: .whitespaces)) }
        guard !counts.isEmpty, counts.allSatisfy({ $0 > 0 }) else { throw ValidationError("--listeners must be positive numbers, e.g. 20,200") }
        let server = try squelchdExecutable(squelchd)
        let client = try benchClient(certs: certs)
        print("fan-out: 1 talker, 80-byte payloads at 50 packets/s for \(seconds.formatted()) s, squelchd in its own process")
        print("listeners  server CPU/fwd pkt  relay p50/p99 (server)  last listener p50/p99 (client)  lost        grant p50/p95     back to back")
        var rows: [[String: Any]] = []
        for count in counts {
            let result = try await FanoutRun(listeners: count, seconds: seconds, grants: grants, squelchd: server,
                                             certs: certs, client: client).run()
            print(result.row)
            print("           squelchd idle (everyone connected, nobody talking): \(fixed(result.idleCPUPerSecond * 1e3)) ms of CPU per second")
            rows.append(["listeners": count, "cpu_us_per_packet": result.cpuMicrosecondsPerForward,
                         "idle_cpu_ms_per_s": result.idleCPUPerSecond * 1e3,
                         "relay_p50_ms": result.relayP50 * 1e3, "relay_p99_ms": result.relayP99 * 1e3,
                         "last_listener_p50_ms": result.lastP50 / 1e6, "last_listener_p99_ms": result.lastP99 / 1e6,
                         "lost": result.lost, "expected": result.expected,
                         "grant_p50_ms": result.grantP50 / 1e6, "grant_p95_ms": result.grantP95 / 1e6,
                         "grant_back_to_back_p50_ms": result.backToBackP50 / 1e6,
                         "grant_back_to_back_p95_ms": result.backToBackP95 / 1e6])
            // Mumble right after, on the same machine in the same minute: the comparison is only
            // fair between neighbouring runs (this VM's speed varies by the hour).
            if versusMumble {
                let mumble = try MumbleRun(listeners: count, seconds: seconds, python: python).run()
                print("           murmurd \(fixed(mumble.cpuMicrosecondsPerForward)) µs per forwarded packet "
                      + "(\(fixed(result.cpuMicrosecondsPerForward / mumble.cpuMicrosecondsPerForward))x), lost \(mumble.expected - mumble.received)/\(mumble.expected), "
                      + "idle \(fixed(mumble.idleCPUPerSecond * 1e3)) ms of CPU per second")
                rows[rows.count - 1]["mumble_cpu_us_per_packet"] = mumble.cpuMicrosecondsPerForward
                rows[rows.count - 1]["mumble_idle_cpu_ms_per_s"] = mumble.idleCPUPerSecond * 1e3
                rows[rows.count - 1]["mumble_lost"] = mumble.expected - mumble.received
            }
        }
        print("kernel floor: \(KernelFloor.datagramSize)-byte datagrams already built, one thread's sendmmsg to N loopback sockets, a reader thread waiting on them")
        print("listeners  CPU/datagram  burst p50/p99")
        for (index, count) in counts.enumerated() {
            let floor = try KernelFloor(destinations: count, bursts: 250).run()
            print(floor.row(destinations: count))
            rows[index]["floor_cpu_us_per_datagram"] = floor.cpuMicroseconds
            rows[index]["floor_burst_p50_ms"] = floor.burstP50 * 1e3
            rows[index]["floor_burst_p99_ms"] = floor.burstP99 * 1e3
        }
        try results.record("fanout", rows)
    }
}

struct FanoutResult {
    var listeners: Int
    var cpuMicrosecondsPerForward: Double
    var idleCPUPerSecond: Double
    var relayP50: Double
    var relayP99: Double
    var lastP50: Double
    var lastP99: Double
    var lost: Int
    var expected: Int
    var grantP50: Double
    var grantP95: Double
    var backToBackP50: Double
    var backToBackP95: Double

    var row: String {
        "\(String(listeners).padding(toLength: 9, withPad: " ", startingAt: 0))  "
            + "\(fixed(cpuMicrosecondsPerForward)) µs".padding(toLength: 18, withPad: " ", startingAt: 0)
            + "  \(fixed(relayP50 * 1e6, 0))/\(fixed(relayP99 * 1e6, 0)) µs".padding(toLength: 24, withPad: " ", startingAt: 0)
            + "  \(fixed(lastP50 / 1e3, 0))/\(fixed(lastP99 / 1e3, 0)) µs".padding(toLength: 33, withPad: " ", startingAt: 0)
            + "  \(lost)/\(expected)".padding(toLength: max(12, "\(lost)/\(expected)".count + 2), withPad: " ", startingAt: 0)
            + "  \(fixed(grantP50 / 1e6))/\(fixed(grantP95 / 1e6)) ms".padding(toLength: 18, withPad: " ", startingAt: 0)
            + "  \(fixed(backToBackP50 / 1e6))/\(fixed(backToBackP95 / 1e6)) ms"
    }
}

struct FanoutRun {
    let listeners: Int
    let seconds: Double
    let grants: Int
    let squelchd: String
    let certs: String
    let client: ClientConfiguration

    func run() async throws -> FanoutResult {
        let server = try await ServerProcess.start(squelchd: squelchd, certs: certs, extra: [
            "--handshakes-per-second-per-address", "100000", "--max-connections", "\(listeners + 100)",
            "--max-connections-per-address", "\(listeners + 100)",
            // The grant measurement requests and releases the floor back to back, far faster than a person.
            "--control-messages-per-second", "100000"])
        defer { server.stop() }
        let (process, voicePort, adminPort, channel) = (server.process, server.voicePort, server.adminPort, server.channel)
        func token(_ user: String, _ capabilities: Set<Capability>) async throws -> String { try await server.token(user, capabilities) }

        // Members join in batches, as a crowd arriving would. All of them read on one event loop,
        // as the kernel floor's one reader thread and Mumble's load generator (one asyncio loop) do:
        // how many threads the listeners' sockets wake is part of what a sender pays per datagram
        // on loopback (each wake of a sleeping reader is an IPI and a context switch the sending
        // call does), so the three must not differ in it.
        let listenerGroup = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        defer { listenerGroup.shutdownGracefully { _ in } }
        var members: [TestMember] = []
        for start in stride(from: 0, to: listeners, by: 50) {
            let batch = try await withThrowingTaskGroup(of: TestMember.self) { group in
                for index in start ..< min(listeners, start + 50) {
                    group.addTask {
                        let member = try TestMember(port: voicePort, configuration: client, group: listenerGroup)
                        try await member.connect()
                        let answer = try await member.join(token: try await token("listener-\(index)", [.listen]), channel: channel, seconds: 30)
                        guard case .joined? = answer else {
                            throw ValidationError("listener \(index) could not join: \(answer.map { "\($0)" } ?? "no answer"); events \(member.events)")
                        }
                        return member
                    }
                }
                return try await group.reduce(into: [TestMember]()) { $0.append($1) }
            }
            members += batch
        }
        // The talker gets an event loop of its own, as its own device would. On the shared loops its
        // grant waited behind the control messages of the hundred listeners on the same loop (400
        // per grant at 200 listeners), which measured this process, not the server.
        let talkerGroup = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        defer { talkerGroup.shutdownGracefully { _ in } }
        let talker = try TestMember(port: voicePort, configuration: client, group: talkerGroup)
        try await talker.connect()
        guard case .joined? = try await talker.join(token: try await token("talker", [.talk, .listen]), channel: channel) else {
            throw ValidationError("the talker could not join")
        }

        // Floor grant time: request to grant as the talker sees it. First with the channel idle
        // (the previous release's notices to every listener, and their ACKs, have settled: a
        // talker pressing the key on a quiet channel), then back to back, each request as soon as
        // the talker sees the previous release, when the server may still be sending that
        // release's notices to the other 200.
        var grantTimes: [Double] = []
        var backToBackTimes: [Double] = []
        for cycle in 0 ..< 2 * grants {
            let idle = cycle < grants
            if idle { try await Task.sleep(for: .milliseconds(50)) }
            let before = talker.messages.count
            let sent = WireNIO.now().nanoseconds
            try await talker.send(.floorRequest())
            guard await talker.waitForFloor(.granted, after: before, seconds: 5) != nil,
                  let at = talker.timedMessages[before...].first(where: { if case .floor(let e) = $0.message { e.kind == .granted } else { false } })?.at
            else { throw ValidationError("no floor grant") }
            if idle { grantTimes.append(Double(at - sent)) } else { backToBackTimes.append(Double(at - sent)) }
            let beforeRelease = talker.messages.count
            try await talker.send(.floorRelease)
            _ = await talker.waitFor(after: beforeRelease, seconds: 5) { if case .floor(let e) = $0 { e.kind == .idle } else { false } }
        }

        // What the server spends with everyone connected and nobody talking (timers, keepalives,
        // its periodic work), as mumble_load.py measures for murmurd: at 20 listeners a talk
        // window's CPU is small enough that this share shows.
        try await Task.sleep(for: .milliseconds(500))
        let idleBefore = try cpuSeconds(process.processIdentifier)
        try await Task.sleep(for: .seconds(3))
        let idleCPUPerSecond = (try cpuSeconds(process.processIdentifier) - idleBefore) / 3

        let before = talker.messages.count
        try await talker.send(.floorRequest())
        guard let burst = await talker.waitForFloor(.granted, after: before)?.burst else { throw ValidationError("no floor for the burst") }
        let metricsBefore = try await scrape(adminPort)
        let cpuBefore = try cpuSeconds(process.processIdentifier)
        let packets = Int(seconds * 50)
        var sendTimes: [UInt64] = []
        let start = WireNIO.now().nanoseconds
        for sequence in 0 ..< packets {
            let due = start + UInt64(sequence) * 20_000_000
            let now = WireNIO.now().nanoseconds
            if due > now { try await Task.sleep(for: .nanoseconds(due - now)) }
            let sent = WireNIO.now().nanoseconds
            var payload = [UInt8](repeating: 0x5A, count: 80)
            withUnsafeBytes(of: sent.bigEndian) { payload.replaceSubrange(0..<8, with: $0) }
            sendTimes.append(sent)
            await talker.sendAudio(burst: burst, sequence: UInt16(sequence), payload: payload)
        }
        try await Task.sleep(for: .milliseconds(1_500))  // the last packets land; the server publishes its counters
        let cpuAfter = try cpuSeconds(process.processIdentifier)
        let metricsAfter = try await scrape(adminPort)
        try await talker.send(.floorRelease)

        let forwarded = (metricsAfter["squelch_packets_out_total"] ?? 0) - (metricsBefore["squelch_packets_out_total"] ?? 0)
        var lastArrival = [UInt64](repeating: 0, count: packets)
        var received = 0
        for member in members {
            for (datagram, at) in member.timedAudio {
                guard let header = datagram.withUnsafeBytes({ AudioHeader(parsing: $0) }), header.burst == burst,
                      Int(header.sequence) < packets else { continue }
                received += 1
                lastArrival[Int(header.sequence)] = max(lastArrival[Int(header.sequence)], at)
            }
        }
        let latencies = zip(lastArrival, sendTimes).compactMap { $0 > 0 ? Double($0 - $1) : nil }.sorted()
        let relay = Histogram(metrics: metricsAfter, minus: metricsBefore, name: "squelch_relay_fanout_seconds")
        for member in members { await member.close() }
        await talker.close()
        return FanoutResult(
            listeners: listeners, cpuMicrosecondsPerForward: forwarded > 0 ? (cpuAfter - cpuBefore) * 1e6 / forwarded : .nan,
            idleCPUPerSecond: idleCPUPerSecond,
            relayP50: relay.quantile(0.5), relayP99: relay.quantile(0.99),
            lastP50: percentile(latencies, 0.5), lastP99: percentile(latencies, 0.99),
            lost: packets * listeners - received, expected: packets * listeners,
            grantP50: percentile(grantTimes.sorted(), 0.5), grantP95: percentile(grantTimes.sorted(), 0.95),
            backToBackP50: percentile(backToBackTimes.sorted(), 0.5), backToBackP95: percentile(backToBackTimes.sorted(), 0.95))
    }

}

/// The squelchd a benchmark starts: `given`, or the one next to squelch-bench.
func squelchdExecutable(_ given: String?) throws -> String {
    let server = given ?? URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent().appendingPathComponent("squelchd").path
    guard FileManager.default.isExecutableFile(atPath: server) else {
        throw ValidationError("no squelchd at \(server); build it (swift build -c release) or pass --squelchd")
    }
    return server
}

/// A benchmark member's transport settings, trusting the dev CA in `certs`.
func benchClient(certs: String) throws -> ClientConfiguration {
    guard let ca = try? String(contentsOfFile: certs + "/ca.pem", encoding: .utf8) else {
        throw ValidationError("no \(certs)/ca.pem; run 'make certs' or pass --certs")
    }
    return ClientConfiguration(serverName: "localhost", validator: try CertificateValidator(caPEM: ca))
}

/// A server's /metrics (admin port) as name{labels} → value.
func scrape(_ port: Int) async throws -> [String: Double] {
    let (data, _) = try await URLSession.shared.data(from: URL(string: "http://127.0.0.1:\(port)/metrics")!)
    var values: [String: Double] = [:]
    for line in String(decoding: data, as: UTF8.self).split(separator: "\n") where !line.hasPrefix("#") {
        guard let space = line.lastIndex(of: " "), let value = Double(line[line.index(after: space)...]) else { continue }
        values[String(line[..<space])] = value
    }
    return values
}

/// `value` with `digits` decimals, for the benchmark's tables.
func fixed(_ value: Double, _ digits: Int = 2) -> String { String(format: "%.\(digits)f", value) }

func lastPort(in line: String) -> Int? {
    guard let range = line.range(of: #"127\.0\.0\.1:(\d+)"#, options: [.regularExpression, .backwards]) else { return nil }
    return Int(line[range].split(separator: ":").last ?? "")
}

/// CPU time of a process, all its threads, those that exited included: the kernel's process CPU
/// clock (`clock_getcpuclockid`), in nanoseconds. /proc/<pid>/stat, the fallback, counts 10 ms clock
/// ticks, too coarse for short runs (100,000 forwards at 4 µs are only 40 ticks).
func cpuSeconds(_ pid: Int32) throws -> Double {
    var clock = clockid_t()
    var time = timespec()
    if clock_getcpuclockid(pid, &clock) == 0, clock_gettime(clock, &time) == 0 {
        return Double(time.tv_sec) + Double(time.tv_nsec) / 1e9
    }
    return try cpuTicksSeconds(pid)
}

/// User plus system CPU time of a process, from /proc/<pid>/stat (clock ticks).
func cpuTicksSeconds(_ pid: Int32) throws -> Double {
    let stat = try String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8)
    // Fields after the command name (which may contain spaces) start after the last ')'.
    guard let close = stat.lastIndex(of: ")") else { throw ValidationError("unreadable /proc/\(pid)/stat") }
    let fields = stat[stat.index(after: close)...].split(separator: " ")
    // fields[0] is the state (field 3); utime and stime are fields 14 and 15.
    guard fields.count > 13, let user = Double(fields[11]), let system = Double(fields[12]) else {
        throw ValidationError("unreadable /proc/\(pid)/stat")
    }
    return (user + system) / Double(sysconf(Int32(_SC_CLK_TCK)))
}

/// Quantiles from a Prometheus histogram's buckets, interpolated within a bucket.
struct Histogram {
    var buckets: [(le: Double, count: Double)]

    init(metrics: [String: Double], minus before: [String: Double], name: String) {
        buckets = metrics.compactMap { key, value in
            guard key.hasPrefix(name + "_bucket{le=\""), let end = key.lastIndex(of: "\"") else { return nil }
            let text = key[key.index(key.startIndex, offsetBy: name.count + 12) ..< end]
            let le = text == "+Inf" ? Double.infinity : Double(text) ?? .nan
            return (le, value - (before[key] ?? 0))
        }.sorted { $0.le < $1.le }
    }

    func quantile(_ q: Double) -> Double {
        guard let total = buckets.last?.count, total > 0 else { return .nan }
        let target = q * total
        var lower = (le: 0.0, count: 0.0)
        for bucket in buckets {
            if bucket.count >= target {
                guard bucket.le.isFinite else { return lower.le }
                let share = bucket.count > lower.count ? (target - lower.count) / (bucket.count - lower.count) : 1
                return lower.le + share * (bucket.le - lower.le)
            }
            lower = bucket
        }
        return lower.le
    }
}

func percentile(_ sorted: [Double], _ q: Double) -> Double {
    guard !sorted.isEmpty else { return .nan }
    return sorted[min(sorted.count - 1, Int((Double(sorted.count - 1) * q).rounded()))]
}

/// Collects a process's output lines so a caller can wait for one.
final class LineCollector: Sendable {
    let lines = NIOLockedLines()

    init(_ pipe: Pipe) {
        let lines = self.lines
        pipe.fileHandleForReading.readabilityHandler = { handle in
            let data = handle.availableData
            if data.isEmpty { handle.readabilityHandler = nil; return }
            lines.append(String(decoding: data, as: UTF8.self))
        }
    }

    var text: String { lines.text }

    func wait(for needle: String, seconds: Double) async -> String? {
        let deadline = Date().addingTimeInterval(seconds)
        while Date() < deadline {
            if let line = lines.text.split(separator: "\n").first(where: { $0.contains(needle) }) { return String(line) }
            try? await Task.sleep(for: .milliseconds(20))
        }
        return nil
    }
}


/// Text appended from a pipe's handler thread and read from tasks.
final class NIOLockedLines: Sendable {
    private let box = NIOLockedValueBox("")
    func append(_ text: String) { box.withLockedValue { $0 += text } }
    var text: String { box.withLockedValue { $0 } }
}
