import ArgumentParser
import Audio
import Foundation
import Opus
import SquelchInfo

@main
struct Bench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "squelch-bench",
        abstract: "Squelch benchmarks. Build in release mode (make bench) before trusting a figure.",
        version: SquelchInfo.version,
        subcommands: [All.self, Codec.self, Transport.self, Fanout.self, FanoutChannels.self, Push.self, Connections.self, EndToEnd.self, ClusterBenchmark.self, Soak.self, SoakAttack.self, WireEcho.self])
}

struct All: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Run every benchmark and record the figures (make bench); --quick is the smoke run CI does.")

    @Flag(help: "Small sizes: checks that every benchmark runs, not what it measures.") var quick = false
    @Option(help: "Directory with the dev certificates (make certs).") var certs = "certs"
    @Option(help: "squelchd executable (default: next to this one).") var squelchd: String?
    @OptionGroup var results: ResultsOptions

    func run() async throws {
        var common = ["--certs", certs, "--results", results.results]
        if let squelchd { common += ["--squelchd", squelchd] }
        if quick {
            try Codec.parse(["--seconds", "1"]).run()
            try await Transport.parse(["--handshakes", "10", "--packets", "1000", "--fanout", "20"]).run()
            try await Fanout.parse(["--listeners", "20", "--seconds", "2", "--grants", "10", "--versus-mumble"] + common).run()
            try await FanoutChannels.parse(["--channels", "5", "--listeners", "5", "--seconds", "2"] + common).run()
            try await Push.parse(["--pushes", "2000", "--in-flight", "200", "--wakes", "100", "--bursts", "2", "--storm-listeners", "20", "--versus-h2load"] + common).run()
            try await Connections.parse(["--count", "100", "--resumes", "5"] + common).run()
            try await EndToEnd.parse(["--loss", "10", "--jitter", "30", "--bursts", "2"] + common).run()
            try await ClusterBenchmark.parse(["--kills", "1", "--joins", "2", "--placements", "50"] + common).run()
            try await Soak.parse(["--minutes", "2", "--channels", "10", "--attack-sources", "4"] + common).run()
        } else {
            try Codec.parse([]).run()
            try await Transport.parse([]).run()
            try await Fanout.parse(["--versus-mumble"] + common).run()
            try await FanoutChannels.parse(common).run()
            try await Push.parse(["--versus-h2load", "--rounds", "3"] + common).run()
            try await Connections.parse(common).run()
            try await EndToEnd.parse(common).run()
            try await ClusterBenchmark.parse(common).run()
            try await Soak.parse(common).run()
        }
        try results.record("quick", quick)
    }
}

/// Per-frame cost of the codec and of file conversion: what one talker costs the client's CPU.
struct Codec: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Opus encode/decode/FEC cost per 20 ms frame, resampling and WAV parsing speed.")

    @Option(help: "Seconds of synthetic speech per measurement.")
    var seconds = 10.0

    func validate() throws {
        guard seconds >= 1, seconds <= 3_600 else { throw ValidationError("--seconds must be between 1 and 3600") }
    }

    func run() throws {
        let input = TestSignal.speechLike(seconds: seconds)
        let frameCount = input.count / 960
        print("codec: \(frameCount) frames of 20 ms, 48 kHz mono, 32 kbps VBR, FEC on, 5 % expected loss")
        print("| measurement | µs per 20 ms frame | % of one core |")
        print("|---|---|---|")
        var packets: [[UInt8]] = []
        for complexity in [5, 6, 8, 10] {
            var c = OpusConfiguration()
            c.complexity = complexity
            let encoder = try OpusEncoder(configuration: c)
            var out = [UInt8](repeating: 0, count: OpusEncoder.maximumPacketSize)
            var sizes: [[UInt8]] = []
            let t = try time {
                for f in 0..<frameCount {
                    let n = try input[f * 960..<(f + 1) * 960].withUnsafeBufferPointer { pcm in
                        try out.withUnsafeMutableBytes { try encoder.encode(pcm, into: $0) }
                    }
                    if complexity == 6 { sizes.append(Array(out[0..<n])) }
                }
            }
            if complexity == 6 { packets = sizes }
            report("encode, complexity \(complexity)", t, frameCount)
        }
        let decoder = try OpusDecoder()
        var pcm = [Int16](repeating: 0, count: 5_760)
        let tDecode = try time {
            for p in packets {
                _ = try p.withUnsafeBytes { b in try pcm.withUnsafeMutableBufferPointer { try decoder.decode(b, into: $0) } }
            }
        }
        report("decode", tDecode, packets.count)
        let tFEC = try time {
            for p in packets {
                _ = try p.withUnsafeBytes { b in try pcm.withUnsafeMutableBufferPointer { try decoder.decodeFEC(from: b, frameSamples: 960, into: $0) } }
            }
        }
        report("FEC recovery", tFEC, packets.count)
        let tPLC = try time {
            for _ in packets { _ = try pcm.withUnsafeMutableBufferPointer { try decoder.decodeMissing(frameSamples: 960, into: $0) } }
        }
        report("PLC concealment", tPLC, packets.count)
        let bytes = packets.reduce(0) { $0 + $1.count }
        print(String(format: "mean packet %.1f bytes (%.1f kbit/s)", Double(bytes) / Double(packets.count),
                     Double(bytes * 8) / seconds / 1000))

        let floats = input.map { Float($0) / 32_768 }
        let source44 = Resampler().resample(floats, from: 48_000, to: 44_100)
        let tResample = time { _ = Resampler().resample(source44, from: 44_100, to: 48_000) }
        print(String(format: "resample 44.1 → 48 kHz: %.0f× real time", seconds / tResample))
        let wav = WAVAudio(format: .pipeline, samples: .pcm16(input)).serialized()
        let tParse = try time { _ = try wav.withUnsafeBytes { try WAVAudio.parse($0) } }
        print(String(format: "WAV parse: %.0f MB/s", Double(wav.count) / tParse / 1e6))
    }

    private func report(_ name: String, _ seconds: Double, _ frames: Int) {
        let us = seconds / Double(frames) * 1e6
        print(String(format: "| %@ | %.1f | %.2f |", name, us, us / 20_000 * 100))
    }
}

func time(_ body: () throws -> Void) rethrows -> Double {
    let start = monotonicNanoseconds()
    try body()
    return Double(monotonicNanoseconds() - start) / 1e9
}
