import ArgumentParser
import Audio
import ChannelProtocol
import Foundation
import JitterBuffer
import NIOConcurrencyHelpers
import ParticipantClaims
import ParticipantTokens
import PTTClient
import ImpairmentKit
import NIOCore

/// Mouth to ear, as a user hears it: a talker's speech file, paced in real time like a microphone,
/// through PTTClient, squelchd (its own process) and an impairment proxy in front of the listener, into
/// a listener's WAV file paced like a sound card. The recording is compared with the speech by
/// bench/audio_metrics.py: the delay of each burst (GCC-PHAT) and its quality (PESQ-WB, STOI).
/// Also measured here: floor access time (request to grant as the app sees it) and late entry (a
/// listener resuming mid-burst until it plays the burst's first frame).
struct EndToEnd: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "end-to-end",
        abstract: "Mouth-to-ear latency and speech quality under loss and jitter; floor access time; late entry.")

    @Option(help: "Loss percentages on the listener's link, comma-separated.") var loss = "0,5,10,20"
    @Option(help: "Jitter (ms) on the listener's link, comma-separated.") var jitter = "0,30"
    @Option(help: "Bursts per condition.") var bursts = 5
    @Option(help: "The talker's speech, a WAV file (bench/make_speech.sh makes one with espeak-ng).") var speech = "bench/speech.wav"
    @Option(help: "Python with bench/requirements.txt installed.") var python = "bench/.venv/bin/python3"
    @Option(help: "Directory with ca.pem, server-chain.pem and server.key (make certs).") var certs = "certs"
    @Option(help: "squelchd executable (default: next to this one).") var squelchd: String?
    @OptionGroup var results: ResultsOptions

    func run() async throws {
        let executable = try squelchdExecutable(squelchd)
        let samples: [Int16]
        do { samples = try WAVAudio.read(path: speech).pipelineSamples(resampler: Resampler()) } catch {
            throw ValidationError("can't read the speech file \(speech): \(error); run bench/make_speech.sh")
        }
        guard FileManager.default.isExecutableFile(atPath: python) else {
            throw ValidationError("no \(python); run bench/setup-venv.sh (make bench does)")
        }
        let losses = loss.split(separator: ",").compactMap { Double($0) }, jitters = jitter.split(separator: ",").compactMap { Double($0) }
        let server = try await ServerProcess.start(squelchd: executable, certs: certs)
        defer { server.stop() }
        let work = FileManager.default.temporaryDirectory.appendingPathComponent("squelch-e2e-\(UUID())").path
        try FileManager.default.createDirectory(atPath: work, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: work) }
        let reference = work + "/reference.wav"
        try writeWAV(samples, to: reference)

        var rows: [[String: Any]] = []
        var access: [Double] = []
        print("end to end: \(String(format: "%.1f", Double(samples.count) / 48_000)) s of speech × \(bursts) bursts per condition, impairments on the listener's link")
        print("loss  jitter  mouth-to-ear p50/p95  PESQ-WB  STOI")
        for lossPercent in losses {
            for jitterMs in jitters {
                let run = try await condition(server: server, samples: samples, reference: reference, work: work,
                                              loss: lossPercent, jitter: jitterMs)
                access += run.access
                rows.append(run.row)
                print(String(format: "%3.0f %%  %4.0f ms  %6.1f / %6.1f ms   %.2f    %.3f", lossPercent, jitterMs,
                             run.row["p50_ms"] as? Double ?? .nan, run.row["p95_ms"] as? Double ?? .nan,
                             run.row["pesq_wb"] as? Double ?? .nan, run.row["stoi"] as? Double ?? .nan))
            }
        }
        try results.record("mouth_to_ear", rows)
        let late = try await lateEntry(server: server, samples: samples, work: work)
        access.sort()
        print(String(format: "floor access (request → didBeginTransmitting): p50 %.2f ms, p95 %.2f ms over %d requests",
                     percentile(access, 0.5), percentile(access, 0.95), access.count))
        print(String(format: "late entry (resume mid-burst → first frame played): %.0f ms; first word lost: %@",
                     late.milliseconds, late.firstWordLost ? "yes" : "no"))
        try results.record("floor", ["access_p50_ms": percentile(access, 0.5), "access_p95_ms": percentile(access, 0.95),
                                     "requests": access.count, "late_entry_ms": late.milliseconds,
                                     "late_entry_first_word_lost": late.firstWordLost])
    }

    /// One device: a channel manager with its own state directory, and what its delegate saw.
    final class Device: ChannelManagerDelegate, ChannelRestorationDelegate {
        let began = NIOLockedValueBox<[UInt64]>([])
        let joined = NIOLockedValueBox(false)
        func channelManager(_ m: ChannelManager, didJoinChannel id: UUID, reason: ChannelJoinReason) { joined.withLockedValue { $0 = true } }
        func channelManager(_ m: ChannelManager, didLeaveChannel id: UUID, reason: ChannelLeaveReason) {}
        func channelManager(_ m: ChannelManager, channelUUID: UUID, didBeginTransmittingFrom source: ChannelTransmitRequestSource) {
            began.withLockedValue { $0.append(monotonicNanoseconds()) }
        }
        func channelManager(_ m: ChannelManager, channelUUID: UUID, didEndTransmittingFrom source: ChannelTransmitRequestSource) {}
        func channelManager(_ m: ChannelManager, receivedEphemeralPushToken token: Data) {}
        func incomingPushResult(channelManager: ChannelManager, channelUUID: UUID, pushPayload: [String: PushValue]) -> PushResult { .leaveChannel }
        func channelManager(_ m: ChannelManager, didActivate audioSession: AudioSession) {}
        func channelManager(_ m: ChannelManager, didDeactivate audioSession: AudioSession) {}
        func channelDescriptor(restoredChannelUUID id: UUID) -> ChannelDescriptor { ChannelDescriptor(name: "Bench") }

        func waitJoined() async throws {
            for _ in 0 ..< 1_000 where !joined.withLockedValue({ $0 }) { try await Task.sleep(for: .milliseconds(10)) }
            guard joined.withLockedValue({ $0 }) else { throw ValidationError("a device could not join") }
        }
    }

    func manager(_ name: String, _ device: Device, audio: AudioConfiguration, work: String) async throws -> ChannelManager {
        try await ChannelManager.channelManager(
            delegate: device, restorationDelegate: device,
            configuration: ChannelManagerConfiguration(stateDirectory: work + "/state-\(name)-\(UUID())", audio: audio))
    }

    func credentials(_ server: ServerProcess, _ user: String, port: Int? = nil, _ capabilities: Set<Capability> = [.talk, .listen]) async throws -> ChannelCredentials {
        ChannelCredentials(host: "127.0.0.1", port: port ?? server.voicePort, serverName: "localhost", caPath: certs + "/ca.pem",
                           token: try await server.token(user, capabilities))
    }

    struct ConditionRun {
        var row: [String: Any]
        var access: [Double]
    }

    /// The talker's microphone: the speech, from a pacer that hands over each 10 ms period at its end
    /// (as a sound card does), recording when each burst's first sample was "spoken".
    final class Mouth: Sendable {
        let spoken = NIOLockedValueBox<[UInt64]>([])
        func source(_ samples: [Int16]) -> any AudioSource {
            let now = monotonicNanoseconds()
            spoken.withLockedValue { $0.append(now) }
            return WAVFileSource(pipelineSamples: samples, pacer: RealTimePacer(origin: now + 10_000_000))
        }
    }

    /// The listener's speaker: a WAV file on a real-time pacer; sample k plays at origin + k/48 kHz.
    final class Ear: Sendable {
        let origin = NIOLockedValueBox<UInt64?>(nil)
        func sink(_ path: String) throws -> any AudioSink {
            let pacer = RealTimePacer()
            origin.withLockedValue { $0 = pacer.origin }
            return try WAVFileSink(path: path, pacer: pacer)
        }
    }

    func condition(server: ServerProcess, samples: [Int16], reference: String, work: String,
                   loss: Double, jitter: Double) async throws -> ConditionRun {
        let proxy = try await ImpairedLink.start(upstreamPort: server.voicePort, loss: loss, jitter: jitter, seed: UInt64(loss * 100 + jitter))
        do {
            return try await measure(through: proxy, server: server, samples: samples, reference: reference, work: work, loss: loss, jitter: jitter)
        } catch {
            await proxy.stop()
            throw error
        }
    }

    func measure(through proxy: ImpairedLink, server: ServerProcess, samples: [Int16], reference: String, work: String,
                 loss: Double, jitter: Double) async throws -> ConditionRun {
        let mouth = Mouth(), ear = Ear()
        let recording = work + "/heard-\(Int(loss))-\(Int(jitter)).wav"
        let talkerDevice = Device(), listenerDevice = Device()
        let talker = try await manager("talker", talkerDevice, audio: AudioConfiguration(makeInput: { mouth.source(samples) }), work: work)
        let listener = try await manager("listener", listenerDevice, audio: AudioConfiguration(makeOutput: { try ear.sink(recording) }), work: work)
        let channel = server.channel
        talker.requestJoinChannel(channelUUID: channel, descriptor: ChannelDescriptor(name: "Bench"), credentials: try await credentials(server, "talker"))
        listener.requestJoinChannel(channelUUID: channel, descriptor: ChannelDescriptor(name: "Bench"),
                                    credentials: try await credentials(server, "listener", port: proxy.port, [.listen]))
        try await talkerDevice.waitJoined()
        try await listenerDevice.waitJoined()
        try await Task.sleep(for: .milliseconds(500))
        var requested: [UInt64] = []
        let seconds = Double(samples.count) / 48_000
        for _ in 0 ..< bursts {
            requested.append(monotonicNanoseconds())
            talker.requestBeginTransmitting(channelUUID: channel)
            try await Task.sleep(for: .seconds(seconds + 0.15))
            talker.stopTransmitting(channelUUID: channel)
            try await Task.sleep(for: .seconds(1))
        }
        await listener.invalidate()
        await talker.invalidate()
        await proxy.stop()
        let began = talkerDevice.began.withLockedValue { $0 }
        let access = zip(began, requested).map { Double($0 - $1) / 1e6 }
        guard let origin = ear.origin.withLockedValue({ $0 }) else { throw ValidationError("the listener never played anything") }
        // Each burst's first sample was spoken one period before the source's pacer origin.
        let sendTimes = mouth.spoken.withLockedValue { $0 }.map { (Double($0) - Double(origin)) / 1e6 }
        let metrics = try analyze(reference: reference, recording: recording, sendTimes: sendTimes)
        var row: [String: Any] = ["loss_percent": loss, "jitter_ms": jitter, "bursts": sendTimes.count]
        for (key, value) in metrics { row[key] = value }
        return ConditionRun(row: row, access: access)
    }

    /// Runs bench/audio_metrics.py on the recording: each burst found near its send time (GCC-PHAT),
    /// its delay, and its PESQ-WB and STOI; summarised as the report wants them. A condition where no
    /// burst could be found is recorded with the reason rather than ending the whole run.
    func analyze(reference: String, recording: String, sendTimes: [Double]) throws -> [String: Any] {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: python)
        process.arguments = ["bench/audio_metrics.py", "bursts", reference, recording, "--quality", "--send-times-ms",
                             sendTimes.map { String(format: "%.3f", $0) }.joined(separator: ",")]
        let out = Pipe(), err = Pipe()
        process.standardOutput = out
        process.standardError = err
        try process.run()
        let data = out.fileHandleForReading.readDataToEndOfFile()
        let errors = String(decoding: err.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        process.waitUntilExit()
        guard let json = try? JSONSerialization.jsonObject(with: data) as? [String: Any] else {
            throw ValidationError("bench/audio_metrics.py failed: \(errors)")
        }
        let latency = json["latency_ms"] as? [String: Any] ?? [:]
        var row: [String: Any] = [:]
        row["p50_ms"] = latency["p50"]
        row["p95_ms"] = latency["p95"]
        row["bursts_found"] = latency["count"]
        row["bursts_missing"] = latency["missing"]
        row["pesq_wb"] = (json["pesq_wb"] as? [String: Any])?["mean"]
        row["stoi"] = (json["stoi"] as? [String: Any])?["mean"]
        if process.terminationStatus != 0 { row["error"] = errors.trimmingCharacters(in: .whitespacesAndNewlines) }
        return row.compactMapValues { $0 is NSNull ? nil : $0 }
    }

    /// A listener suspended while a burst starts, resumed one second in: how long until it plays the
    /// burst's first frame, and whether every frame from the first was played.
    func lateEntry(server: ServerProcess, samples: [Int16], work: String) async throws -> (milliseconds: Double, firstWordLost: Bool) {
        let mouth = Mouth(), ear = Ear()
        let recording = work + "/late.wav"
        let talkerDevice = Device(), listenerDevice = Device()
        let talker = try await manager("late-talker", talkerDevice, audio: AudioConfiguration(makeInput: { mouth.source(samples) }), work: work)
        let listener = try await manager("late-listener", listenerDevice, audio: AudioConfiguration(makeOutput: { try ear.sink(recording) }), work: work)
        let listenerEvents = listener.events
        let finished = Task { () -> BurstStatistics? in
            for await event in listenerEvents { if case .burstFinished(let s) = event { return s } }
            return nil
        }
        let channel = server.channel
        talker.requestJoinChannel(channelUUID: channel, descriptor: ChannelDescriptor(name: "Bench"), credentials: try await credentials(server, "late-talker"))
        listener.requestJoinChannel(channelUUID: channel, descriptor: ChannelDescriptor(name: "Bench"),
                                    credentials: try await credentials(server, "late-listener", [.listen]))
        try await talkerDevice.waitJoined()
        try await listenerDevice.waitJoined()
        listener.suspend()
        try await Task.sleep(for: .milliseconds(500))
        talker.requestBeginTransmitting(channelUUID: channel)
        try await Task.sleep(for: .seconds(1))
        let resumed = monotonicNanoseconds()
        listener.resume()
        let seconds = Double(samples.count) / 48_000
        try await Task.sleep(for: .seconds(max(0.5, seconds - 1) + 0.15))
        talker.stopTransmitting(channelUUID: channel)
        try await Task.sleep(for: .seconds(2))
        let sent = await talker.statistics().framesSent
        await listener.invalidate()
        await talker.invalidate()
        let statistics = await finished.value
        guard let origin = ear.origin.withLockedValue({ $0 }) else { throw ValidationError("the late listener never played anything") }
        // The first loud 10 ms in the recording after the resume is the speech's first loud 10 ms. The
        // burst is played from its first frame at real speed, so the first frame was played as long
        // before that as the speech's own lead-in of silence lasts (bench/make_speech.sh pads 0.3 s).
        // Before 2026-11-23 that lead-in was counted as waiting, which put 300-odd ms into the figure.
        func firstLoud(_ audio: [Int16], from: Int) -> Int? {
            for start in stride(from: max(0, from), to: audio.count - 480, by: 480) {
                var sum = 0.0
                for s in audio[start ..< start + 480] { let v = Double(s) / 32768; sum += v * v }
                if (sum / 480).squareRoot() > 0.003 { return start }
            }
            return nil
        }
        let heard = try WAVAudio.read(path: recording).pipelineSamples(resampler: Resampler())
        let resumedAt = Int((Double(resumed) - Double(origin)) / 1e9 * 48_000)
        guard let first = firstLoud(heard, from: resumedAt) else { throw ValidationError("the late listener's recording is silent after the resume") }
        guard let leadIn = firstLoud(samples, from: 0) else { throw ValidationError("the speech file is silent") }
        let milliseconds = Double(first - resumedAt - leadIn) / 48.0
        print(String(format: "late entry: first speech heard %.0f ms after the resume; the speech starts %.0f ms into the burst",
                     Double(first - resumedAt) / 48.0, Double(leadIn) / 48.0))
        let lost = statistics.map { $0.lost > 0 || $0.played + $0.fecRecovered < sent } ?? true
        return (milliseconds, lost)
    }

    func writeWAV(_ samples: [Int16], to path: String) throws {
        let sink = try WAVFileSink(path: path, pacer: VirtualPacer())
        let period = PipelineAudio.periodFrames
        var padded = samples
        padded += [Int16](repeating: 0, count: (period - samples.count % period) % period)
        try padded.withUnsafeBufferPointer { all in
            for start in stride(from: 0, to: padded.count, by: period) { try sink.write(UnsafeBufferPointer(rebasing: all[start ..< start + period])) }
        }
        try sink.finish()
    }
}

/// The listener's link in the end-to-end benchmark: an impairment proxy between it and squelchd, with
/// loss and jitter in both directions (the listener's ACKs cross it too), seeded per condition.
struct ImpairedLink {
    let proxy: ImpairmentProxy
    let port: Int

    static func start(upstreamPort: Int, loss: Double, jitter: Double, seed: UInt64) async throws -> ImpairedLink {
        // Jitter as a one-way delay that varies around its own size, so that packets overtake each other
        // the way they do on a congested radio link.
        func link(_ seed: UInt64) -> Impairment {
            Impairment(lossPercent: loss, delayMilliseconds: jitter, jitterMilliseconds: jitter, jitterDistribution: .uniform,
                       preservesOrder: false, seed: seed)
        }
        let proxy = ImpairmentProxy(upstream: try SocketAddress(ipAddress: "127.0.0.1", port: upstreamPort),
                                    clientToServer: link(seed), serverToClient: link(seed &+ 1))
        return ImpairedLink(proxy: proxy, port: try await proxy.start())
    }

    func stop() async { await proxy.stop() }
}
