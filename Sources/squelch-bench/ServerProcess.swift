import ArgumentParser
import Foundation
import ParticipantClaims
import ParticipantTokens

/// `squelchd serve` in its own process with one channel, for the end-to-end benchmarks: the server's
/// CPU and memory are then its own, as in production.
struct ServerProcess {
    let process: Process
    let log: LineCollector
    let data: String
    let channels: [UUID]
    var channel: UUID { channels[0] }
    let voicePort: Int
    let adminPort: Int
    let authority: TokenAuthority

    /// `channels`: how many to create ("Bench", "Bench 2", …). `benchFloor`: see `ServeProcess.launch`.
    static func start(squelchd: String, certs: String, extra: [String] = [], channels: Int = 1,
                      benchFloor: Bool = true) async throws -> ServerProcess {
        let data = FileManager.default.temporaryDirectory.appendingPathComponent("squelch-bench-\(UUID())").path
        try FileManager.default.createDirectory(atPath: data, withIntermediateDirectories: true)
        var created: [UUID] = []
        for index in 0 ..< channels {
            let printed = try squelchdCommand(squelchd, ["channel", "create", "--name", index == 0 ? "Bench" : "Bench \(index + 1)",
                                                         "--data-dir", data])
            guard let channel = UUID(uuidString: printed.trimmingCharacters(in: .whitespacesAndNewlines)) else {
                throw ValidationError("squelchd channel create printed '\(printed)', not a channel id")
            }
            created.append(channel)
        }
        let serving = try await ServeProcess.launch(squelchd: squelchd, certs: certs, data: data, extra: extra, benchFloor: benchFloor)
        return ServerProcess(process: serving.process, log: serving.log, data: data, channels: created, voicePort: serving.voicePort,
                             adminPort: serving.adminPort, authority: try await TokenAuthority.loadOrCreate(in: data))
    }

    func token(_ user: String, _ capabilities: Set<Capability> = [.talk, .listen], channel: UUID? = nil) async throws -> String {
        try await authority.issue(ParticipantClaims(userID: user, name: user.capitalized, channel: channel ?? self.channel,
                                                    capabilities: capabilities, expiresAt: Date().addingTimeInterval(3_600)))
    }

    /// The whole resident set (VmRSS): what an operator sees.
    var residentKilobytes: Double { statusKilobytes("VmRSS:") }
    /// Its anonymous part (RssAnon): heap and stacks, without the binary's and libraries' pages.
    var anonymousKilobytes: Double { statusKilobytes("RssAnon:") }

    private func statusKilobytes(_ field: String) -> Double {
        let status = (try? String(contentsOfFile: "/proc/\(process.processIdentifier)/status", encoding: .utf8)) ?? ""
        let line = status.split(separator: "\n").first { $0.hasPrefix(field) } ?? ""
        return Double(line.split(separator: " ").dropFirst().first ?? "") ?? .nan
    }

    func stop() {
        if process.isRunning { process.terminate(); process.waitUntilExit() }
        try? FileManager.default.removeItem(atPath: data)
    }
}

/// `squelchd serve` running, and the ports it logged.
struct ServeProcess {
    let process: Process
    let log: LineCollector
    let voicePort: Int
    let adminPort: Int

    /// `benchFloor`: lift the per-member grant allowance. The benchmarks time grants back to back,
    /// many more a minute than a person's share (15): the allowance defends a channel, it isn't
    /// measured. The soak keeps it: it runs the defaults.
    static func launch(squelchd: String, certs: String, data: String, extra: [String], benchFloor: Bool = true) async throws -> ServeProcess {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: squelchd)
        process.arguments = ["serve", "--data-dir", data, "--port", "0", "--admin-port", "0", "--cert", certs + "/server-chain.pem",
                             "--key", certs + "/server.key", "--log-level", "notice", "--apns", "off"]
            + (benchFloor ? ["--floor-grants-per-minute", "1000000"] : []) + extra
        let errors = Pipe()
        process.standardError = errors
        let log = LineCollector(errors)
        try process.run()
        guard let voiceLine = await log.wait(for: "voice transport listening", seconds: 30), let voicePort = lastPort(in: voiceLine),
              let adminLine = await log.wait(for: "admin API listening on", seconds: 30), let adminPort = lastPort(in: adminLine) else {
            process.terminate()
            throw ValidationError("squelchd did not start: \(log.text)")
        }
        return ServeProcess(process: process, log: log, voicePort: voicePort, adminPort: adminPort)
    }

    func stop() {
        if process.isRunning { process.terminate(); process.waitUntilExit() }
    }
}

/// Runs a squelchd command (`channel create`, `node drain`, …) to its end: its standard output.
func squelchdCommand(_ executable: String, _ arguments: [String]) throws -> String {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: executable)
    process.arguments = arguments
    let out = Pipe()
    process.standardOutput = out
    process.standardError = FileHandle.nullDevice
    try process.run()
    let text = String(decoding: out.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
    process.waitUntilExit()
    guard process.terminationStatus == 0 else { throw ValidationError("squelchd \(arguments.prefix(2).joined(separator: " ")) failed") }
    return text
}
