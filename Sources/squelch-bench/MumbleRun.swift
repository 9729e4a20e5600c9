import ArgumentParser
import Foundation

/// Mumble's server (murmurd, Debian's mumble-server) relaying the same load as a fan-out run: one
/// talker, 80-byte payloads at 50 packets/s, N listeners on loopback. bench/mumble_load.py starts
/// murmurd with its own ini and speaks Mumble's protocol (TLS control, OCB2-AES128 UDP voice); this
/// runs it and reads its one line of JSON. The yardstick of issue 41: the server a user would pick
/// instead, on the same machine in the same run.
struct MumbleRun {
    let listeners: Int
    let seconds: Double
    let python: String

    struct Result {
        var cpuMicrosecondsPerForward: Double
        var idleCPUPerSecond: Double
        var received: Int
        var expected: Int
    }

    func run() throws -> Result {
        let script = URL(fileURLWithPath: python).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().appendingPathComponent("mumble_load.py").path
        guard FileManager.default.isExecutableFile(atPath: python), FileManager.default.fileExists(atPath: script) else {
            throw ValidationError("no \(python) or \(script); run 'make bench-tools' (the bench's Python) or pass --python")
        }
        let process = Process()
        process.executableURL = URL(fileURLWithPath: python)
        process.arguments = [script, "--listeners", "\(listeners)", "--seconds", "\(seconds)", "--payload", "80", "--rate", "50"]
        let out = Pipe(), errors = Pipe()
        process.standardOutput = out
        process.standardError = errors
        let log = LineCollector(errors)
        try process.run()
        let printed = String(decoding: out.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        process.waitUntilExit()
        guard process.terminationStatus == 0,
              let line = printed.split(separator: "\n").last,
              let figures = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any],
              let cpu = (figures["cpu_us_per_packet"] as? NSNumber)?.doubleValue,
              let idle = (figures["idle_cpu_per_s"] as? NSNumber)?.doubleValue,
              let received = (figures["datagrams_received"] as? NSNumber)?.intValue,
              let expected = (figures["expected"] as? NSNumber)?.intValue else {
            throw ValidationError("mumble_load.py failed (exit \(process.terminationStatus)): \(log.text.suffix(2_000))")
        }
        return Result(cpuMicrosecondsPerForward: cpu, idleCPUPerSecond: idle, received: received, expected: expected)
    }
}
