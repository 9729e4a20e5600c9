import APNs
import ArgumentParser
import Foundation

/// nghttp2's own load client (`h2load`, Debian's nghttp2-client) sending the client's exact
/// `pushtotalk` request to the same simulator: the yardstick of issue 44, the C reference for the same
/// HTTP/2 work on the same machine in the same run.
struct H2loadRun {
    let port: Int
    let pushes: Int
    let connections: Int
    let streamsPerConnection: Int
    let identity: APNsProviderIdentity
    let topic: String

    struct Result {
        var perSecond: Double
        var cpuMicrosecondsPerPush: Double
        var succeeded: Int
    }

    static let executable = "/usr/bin/h2load"

    func run(simulatorPID: Int32) async throws -> (Result, simulatorMicrosecondsPerPush: Double) {
        guard FileManager.default.isExecutableFile(atPath: Self.executable) else {
            throw ValidationError("no \(Self.executable); install Debian's nghttp2-client ('make deps' does)")
        }
        // The request APNsClient sends, byte for byte but for `apns-id`: h2load repeats one set of
        // headers, and Apple makes the id itself when it is missing.
        let sample = try APNsRequest.pushToTalk(PushToTalkNotification(deviceToken: "00000000000000ab", activeSpeaker: "Bench",
                                                                       channel: UUID()), topic: topic)
        let body = FileManager.default.temporaryDirectory.appendingPathComponent("squelch-h2load-\(UUID()).json")
        try Data(sample.body).write(to: body)
        defer { try? FileManager.default.removeItem(at: body) }
        let jwt = try await identity.providerToken()
        var arguments = ["-n", "\(pushes)", "-c", "\(connections)", "-m", "\(streamsPerConnection)", "-d", body.path,
                         "-H", "authorization: bearer \(jwt)"]
        for (name, value) in sample.headers where name != "apns-id" { arguments += ["-H", "\(name): \(value)"] }
        arguments.append("https://127.0.0.1:\(port)\(sample.path)")

        let process = Process()
        process.executableURL = URL(fileURLWithPath: Self.executable)
        process.arguments = arguments
        let out = Pipe()
        process.standardOutput = out
        process.standardError = out
        // h2load is this process's only child that ends here: its CPU is the change in the reaped
        // children's usage (the simulator, a child too, is still running and not counted).
        let before = childrenCPUSeconds()
        let simulator0 = try cpuSeconds(simulatorPID)
        let start = ContinuousClock.now
        try process.run()
        let printed = String(decoding: out.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        process.waitUntilExit()
        let elapsed = (ContinuousClock.now - start) / .seconds(1)
        let simulatorCPU = try cpuSeconds(simulatorPID) - simulator0
        let cpu = childrenCPUSeconds() - before
        guard process.terminationStatus == 0, let succeeded = Self.succeeded(in: printed), succeeded > 0 else {
            throw ValidationError("h2load failed (exit \(process.terminationStatus)): \(printed.suffix(2_000))")
        }
        // Its own "req/s" counts from its first connection; ours counts from the first push, after a
        // warm-up: both are taken over the process's whole run here, handshakes included, which
        // favours our client slightly.
        return (Result(perSecond: Double(succeeded) / elapsed, cpuMicrosecondsPerPush: cpu * 1e6 / Double(pushes), succeeded: succeeded),
                simulatorCPU * 1e6 / Double(pushes))
    }

    /// `requests: 20000 total, 20000 started, 20000 done, 20000 succeeded, 0 failed, …`
    static func succeeded(in output: String) -> Int? {
        guard let line = output.split(separator: "\n").first(where: { $0.hasPrefix("requests:") }) else { return nil }
        let fields = line.dropFirst("requests:".count).split(separator: ",")
        guard let field = fields.first(where: { $0.hasSuffix(" succeeded") }) else { return nil }
        return Int(field.split(separator: " ").first ?? "")
    }
}

/// User plus system CPU of this process's children that have ended and been waited for.
func childrenCPUSeconds() -> Double {
    var usage = rusage()
    getrusage(__rusage_who_t(RUSAGE_CHILDREN.rawValue), &usage)
    return Double(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) + Double(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6
}
