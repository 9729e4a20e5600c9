import ArgumentParser
import Foundation
import ImpairmentKit
import NIOCore
import Wire

/// squelchd under attack for minutes, at its default limits (issue 42 item 6): real members on many
/// channels taking turns to talk under loss, one of them leaving and joining again every second,
/// while `soak-attack` (a process of its own) floods handshakes, abuses the floor from inside,
/// replays ClientHellos, sprays garbage datagrams and sends malformed admin requests. Records the
/// real members' joins, audio lost beyond the emulated loss, the server's memory, its relay loop's
/// stalls, and whether it survived.
struct Soak: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "squelchd under attack: real members' joins, audio lost beyond the emulated loss, memory, stalls, crashes.")

    @Option(help: "How long the attack and the talking last.") var minutes = 10.0
    @Option(help: "Channels.") var channels = 50
    @Option(help: "Members on each channel.") var perChannel = 20
    @Option(help: "Loss in each direction on every member's link, percent.") var loss = 5.0
    @Option(help: "Sources the attacker's handshake flood comes from.") var attackSources = 12
    @Option(help: "Directory with ca.pem, server-chain.pem and server.key (make certs).") var certs = "certs"
    @Option(help: "squelchd executable (default: next to this one).") var squelchd: String?
    @OptionGroup var results: ResultsOptions

    func validate() throws {
        guard minutes > 0, minutes <= 120 else { throw ValidationError("--minutes must be between 0 and 120") }
        guard channels >= 1, channels <= 250, perChannel > SoakCrew.talkers, perChannel <= 200 else {
            throw ValidationError("--channels must be 1-250 and --per-channel \(SoakCrew.talkers + 1)-200")
        }
        guard loss >= 0, loss < 50 else { throw ValidationError("--loss must be a percentage below 50") }
    }

    func run() async throws {
        let serverPath = try squelchdExecutable(squelchd)
        guard let ca = try? String(contentsOfFile: certs + "/ca.pem", encoding: .utf8) else {
            throw ValidationError("no \(certs)/ca.pem; run 'make certs' or pass --certs")
        }
        let duration = Duration.seconds(minutes * 60)
        print("soak: \(channels) channels × \(perChannel) members, \(fixed(loss, 0)) % loss each way, \(fixed(minutes, 1)) min under attack, squelchd at its default limits")
        let server = try await ServerProcess.start(squelchd: serverPath, certs: certs, channels: channels, benchFloor: false)
        defer { server.stop() }
        let upstream = try SocketAddress(ipAddress: "127.0.0.1", port: server.voicePort)
        var proxies: [ImpairmentProxy] = [], ports: [Int] = [], tokens: [[String]] = []
        for (index, channel) in server.channels.enumerated() {
            let proxy = ImpairmentProxy(upstream: upstream, upstreamBindHost: "127.1.\(index / 250).\(index % 250 + 1)",
                                        clientToServer: Impairment(lossPercent: loss, seed: UInt64(2 * index + 1)),
                                        serverToClient: Impairment(lossPercent: loss, seed: UInt64(2 * index + 2)))
            ports.append(try await proxy.start())
            proxies.append(proxy)
            var crew: [String] = []
            for slot in 0 ..< perChannel {
                crew.append(try await server.token("member-\(index)-\(slot)", slot < SoakCrew.talkers ? [.talk, .listen] : [.listen], channel: channel))
            }
            tokens.append(crew)
        }
        let crew = SoakCrew(channels: server.channels, perChannel: perChannel, proxies: proxies, proxyPorts: ports,
                            client: ClientConfiguration(serverName: "localhost", validator: try CertificateValidator(caPEM: ca)), tokens: tokens)

        // The attack starts first: the real members join into it.
        let attacker = try await startAttacker(server: server, duration: duration)
        defer { if attacker.process.isRunning { attacker.process.terminate() } }
        let start = ContinuousClock.now, deadline = start + duration
        try await Task.sleep(for: .seconds(3))
        await crew.joinAll()
        let joined = crew.snapshot.joinsSucceeded
        print("soak: \(joined) of \(channels * perChannel) members joined in \(fixed((ContinuousClock.now - start - .seconds(3)) / .seconds(1), 1)) s under attack")

        let metricsBefore = try await scrape(server.adminPort)
        var memory: [(seconds: Double, kilobytes: Double)] = []
        await withTaskGroup(of: Void.self) { work in
            for channel in server.channels.indices {
                work.addTask { await crew.talk(on: channel, burst: .seconds(2), until: deadline) }
            }
            work.addTask { await crew.churn(every: .seconds(1), until: deadline) }
            while ContinuousClock.now < deadline, server.process.isRunning {
                memory.append(((ContinuousClock.now - start) / .seconds(1), server.residentKilobytes))
                try? await Task.sleep(for: .seconds(5))
            }
            await work.waitForAll()
        }
        try await Task.sleep(for: .seconds(2))  // the last frames land; the server publishes its counters
        let survived = server.process.isRunning
        memory.append(((ContinuousClock.now - start) / .seconds(1), server.residentKilobytes))
        let metricsAfter = survived ? try await scrape(server.adminPort) : metricsBefore
        let attack = await attacker.summary()
        var downstream = ImpairmentCounters()
        for proxy in proxies {
            let counters = await proxy.stats().impairment.serverToClient
            downstream.received += counters.received
            downstream.dropped += counters.dropped
        }
        await crew.closeAll()
        for proxy in proxies { await proxy.stop() }

        let figures = SoakFigures(crew: crew.snapshot, audioReceived: crew.audioReceived, members: channels * perChannel,
                                  before: metricsBefore, after: metricsAfter, downstream: downstream, memory: memory,
                                  survived: survived, log: server.log.text, attack: attack)
        print(figures.report)
        try results.record("soak", figures.record(channels: channels, perChannel: perChannel, loss: loss, minutes: minutes))
    }

    func startAttacker(server: ServerProcess, duration: Duration) async throws -> AttackerProcess {
        let tokenFile = server.data + "/attacker.token"
        let token = try await server.token("insider", [.talk], channel: server.channel)
        try token.write(toFile: tokenFile, atomically: true, encoding: .utf8)
        let process = Process()
        process.executableURL = URL(fileURLWithPath: CommandLine.arguments[0])
        process.arguments = ["soak-attack", "--port", "\(server.voicePort)", "--admin-port", "\(server.adminPort)", "--token-file", tokenFile,
                             "--channel", server.channel.uuidString, "--certs", certs, "--seconds", "\(duration / .seconds(1))",
                             "--sources", "\(attackSources)"]
        let out = Pipe()
        process.standardOutput = out
        process.standardError = FileHandle.nullDevice
        let lines = LineCollector(out)
        try process.run()
        return AttackerProcess(process: process, lines: lines)
    }
}

/// The attacker's process and its one line of results.
struct AttackerProcess {
    let process: Process
    let lines: LineCollector

    func summary() async -> [String: Int] {
        guard let line = await lines.wait(for: "soak-attack: ", seconds: 60),
              let json = line.range(of: "soak-attack: ").map({ line[$0.upperBound...] }),
              let counts = try? JSONSerialization.jsonObject(with: Data(json.utf8)) as? [String: Int] else { return [:] }
        return counts
    }
}
