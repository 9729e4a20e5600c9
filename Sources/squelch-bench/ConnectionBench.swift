import ArgumentParser
import ChannelProtocol
import Foundation
import SquelchTesting
import Wire
import WireNIO

/// What a connection costs the server: full handshakes per second, the time from a client's fast
/// resume (a new address, no handshake) to its audio reaching a listener, and resident memory per
/// idle member.
struct Connections: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "connections",
        abstract: "Handshakes per second, resume to first audio, and server memory per idle connection.")

    @Option(help: "Connections for the handshake rate and the memory figure.") var count = 1_000
    @Option(help: "Resumes to time.") var resumes = 50
    @Option(help: "Directory with ca.pem, server-chain.pem and server.key (make certs).") var certs = "certs"
    @Option(help: "squelchd executable (default: next to this one).") var squelchd: String?
    @OptionGroup var results: ResultsOptions

    func run() async throws {
        let executable = try squelchdExecutable(squelchd)
        let client = try benchClient(certs: certs)
        let server = try await ServerProcess.start(squelchd: executable, certs: certs,
                                                   extra: ["--handshakes-per-second-per-address", "1000000", "--max-connections", "\(count + 100)",
                                                           "--max-connections-per-address", "\(count + 100)"])
        defer { server.stop() }
        // A few members join and leave first: the first handshake and join page in code and tables
        // of squelchd and its libraries (3 MB of file-backed pages here), which is not what each
        // connection costs. Five idle members' freed memory, which malloc may hand the next ones,
        // is about 0.1 KiB per connection of the figure.
        for index in 0 ..< 5 {
            let member = try TestMember(port: server.voicePort, configuration: client)
            try await member.connect()
            guard case .joined? = try await member.join(token: try await server.token("warm-up-\(index)", [.listen]), channel: server.channel, seconds: 30)
            else { throw ValidationError("warm-up member \(index) could not join") }
            await member.close()
        }
        try await Task.sleep(for: .seconds(1))
        let idleKB = server.residentKilobytes, idleAnonKB = server.anonymousKilobytes

        // Handshakes: everyone connects at once (in waves of 100, as a crowd would); each wave joins
        // right after its handshakes (one member at a time), since squelchd closes a connection that has not joined within
        // 10 s. Only the handshakes are timed.
        var members: [TestMember] = []
        var handshakeTime = Duration.zero
        for start in stride(from: 0, to: count, by: 100) {
            let waveStarted = ContinuousClock.now
            let wave = try await withThrowingTaskGroup(of: TestMember.self) { group in
                for _ in start ..< min(count, start + 100) {
                    group.addTask {
                        let member = try TestMember(port: server.voicePort, configuration: client)
                        try await member.connect()
                        return member
                    }
                }
                return try await group.reduce(into: [TestMember]()) { $0.append($1) }
            }
            handshakeTime += ContinuousClock.now - waveStarted
            // One at a time, as before: joins all at once would measure the roster storm's peak
            // (malloc keeps what it freed), not what idle members cost.
            for (offset, member) in wave.enumerated() {
                let answer = try await member.join(token: try await server.token("idle-\(start + offset)", [.listen]), channel: server.channel, seconds: 30)
                guard case .joined? = answer else {
                    throw ValidationError("member \(start + offset) could not join: \(answer.map { "\($0)" } ?? "no answer")")
                }
            }
            members += wave
        }
        let handshakeSeconds = handshakeTime / .seconds(1)
        try await Task.sleep(for: .seconds(2))
        let busyKB = server.residentKilobytes, busyAnonKB = server.anonymousKilobytes
        let perConnection = (busyKB - idleKB) / Double(count)
        let anonymousPerConnection = (busyAnonKB - idleAnonKB) / Double(count)
        print("connections: \(count) full handshakes in \(String(format: "%.2f", handshakeSeconds)) s = \(Int(Double(count) / handshakeSeconds))/s")
        print(String(format: "memory: squelchd RSS %.1f MB idle, %.1f MB with %d joined members: %.1f KB per connection (%.1f KB of it anonymous: heap and stacks)",
                     idleKB / 1024, busyKB / 1024, count, perConnection, anonymousPerConnection))
        for member in members { await member.close() }

        // Resume: a talker holding the floor moves to a new local port and sends audio at once; a
        // listener times its arrival.
        let talker = try TestMember(port: server.voicePort, configuration: client)
        try await talker.connect()
        _ = try await talker.join(token: try await server.token("talker"), channel: server.channel)
        let listener = try TestMember(port: server.voicePort, configuration: client)
        try await listener.connect()
        _ = try await listener.join(token: try await server.token("listener", [.listen]), channel: server.channel)
        try await talker.send(.floorRequest())
        guard let burst = await talker.waitForFloor(.granted)?.burst else { throw ValidationError("no floor grant") }
        var times: [Double] = []
        for sequence in 0 ..< resumes {
            let before = listener.audio.count
            let start = WireNIO.now().nanoseconds
            try await talker.client.rebind()
            await talker.sendAudio(burst: burst, sequence: UInt16(sequence), payload: [UInt8](repeating: 0x33, count: 80))
            let arrived = await listener.waitForAudio(count: before + 1, seconds: 5)
            guard arrived.count > before, let at = listener.timedAudio.last?.at else { continue }
            times.append(Double(at - start) / 1e6)
        }
        times.sort()
        print(String(format: "resume to first audio at a listener: p50 %.2f ms, p99 %.2f ms (%d of %d)",
                     percentile(times, 0.5), percentile(times, 0.99), times.count, resumes))
        await talker.close()
        await listener.close()
        try results.record("handshakes", ["per_second": Double(count) / handshakeSeconds, "connections": count,
                                          "resume_to_first_audio_ms_p50": percentile(times, 0.5),
                                          "resume_to_first_audio_ms_p99": percentile(times, 0.99)])
        try results.record("memory", ["rss_idle_mb": idleKB / 1024, "rss_1000_mb": busyKB / 1024, "connections": count,
                                      "kb_per_connection": perConnection, "anonymous_kb_per_connection": anonymousPerConnection])
    }
}
