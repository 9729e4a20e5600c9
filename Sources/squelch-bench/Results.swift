import ArgumentParser
import Foundation

/// `bench/results.json`: each benchmark writes its own section (read, replace the key, write back), so
/// `make bench` can run them one by one and `bench/report.py` turns the file into docs/benchmarks.md.
/// Keys follow the report's format (bench/README.md).
struct ResultsOptions: ParsableArguments {
    @Option(help: "Where to record the figures (the section of this benchmark is replaced).")
    var results: String = "bench/results.json"

    func record(_ key: String, _ value: Any) throws {
        var document: [String: Any] = [:]
        if let data = FileManager.default.contents(atPath: results),
           let existing = try? JSONSerialization.jsonObject(with: data) as? [String: Any] {
            document = existing
        }
        document[key] = value
        document["generated"] = Date().formatted(.iso8601)
        document["machine"] = Self.machine
        document["targets"] = Self.targets
        try FileManager.default.createDirectory(atPath: (results as NSString).deletingLastPathComponent, withIntermediateDirectories: true)
        let data = try JSONSerialization.data(withJSONObject: document, options: [.prettyPrinted, .sortedKeys])
        try data.write(to: URL(fileURLWithPath: results), options: .atomic)
    }

    /// The targets of issues 4, 5, 8, 40, 41 and 44, so that the report can say met or missed.
    static var targets: [String: Any] { [
        "mouth_to_ear_p95_ms": 120, "pesq_clean": 3.6, "pesq_10_percent": 2.6, "floor_access_p95_ms": 5,
        "late_entry_ms": 150, "kb_per_connection": 16, "fanout_cpu_us_200": 5, "fanout_vs_mumble_200": 0.6, "fanout_relay_p99_ms_200": 1, "fanout_relay_vs_floor_200": 2,
        "fanout_grant_p95_ms_200": 5, "push_per_second": 10_000,
        "push_last_wake_ms": 250, "push_cpu_vs_h2load": 2, "push_rate_vs_h2load": 0.9,
        "push_storm_relay_vs_quiet": 1.2, "cluster_redirect_round_trips": 1,
    ] }

    static var machine: [String: Any] {
        let cpuInfo = (try? String(contentsOfFile: "/proc/cpuinfo", encoding: .utf8)) ?? ""
        let model = cpuInfo.split(separator: "\n").first { $0.hasPrefix("model name") }
            .map { String($0.split(separator: ":", maxSplits: 1).last ?? "").trimmingCharacters(in: .whitespaces) } ?? "unknown"
        let os = (try? String(contentsOfFile: "/etc/os-release", encoding: .utf8))?.split(separator: "\n")
            .first { $0.hasPrefix("PRETTY_NAME=") }.map { String($0.dropFirst(12)).trimmingCharacters(in: CharacterSet(charactersIn: "\"")) } ?? "Linux"
        return ["cores": ProcessInfo.processInfo.activeProcessorCount, "model": model, "os": os]
    }
}
