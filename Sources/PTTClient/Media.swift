import Audio
import ChannelProtocol
import Foundation
import JitterBuffer
import NIOConcurrencyHelpers
import Opus
import WireNIO

/// Makes the audio devices (or files) the manager captures from and plays to. Called on the media
/// threads: `makeInput` at the start of each transmission, `makeOutput` once per joined channel.
public struct AudioConfiguration: Sendable {
    public var makeInput: (@Sendable () throws -> any AudioSource)?
    public var makeOutput: (@Sendable () throws -> any AudioSink)?
    public var opus: OpusConfiguration
    public var jitterBuffer: JitterBufferConfiguration

    public init(makeInput: (@Sendable () throws -> any AudioSource)? = nil, makeOutput: (@Sendable () throws -> any AudioSink)? = nil,
                opus: OpusConfiguration = .pushToTalk, jitterBuffer: JitterBufferConfiguration = JitterBufferConfiguration()) {
        self.makeInput = makeInput
        self.makeOutput = makeOutput
        self.opus = opus
        self.jitterBuffer = jitterBuffer
    }

    /// No audio: the channel works (floor, roster, pushes) but nothing is captured or played.
    public static var none: AudioConfiguration { AudioConfiguration() }
}

/// A dedicated thread that runs until asked to stop: the capture and playout loops block on their
/// devices, so they can't live on the cooperative pool.
final class MediaThread: Sendable {
    private struct Flags { var running = false; var stopRequested = false }
    private let flags = NIOLockedValueBox(Flags())
    let name: String

    init(name: String) { self.name = name }

    var isRunning: Bool { flags.withLockedValue { $0.running } }
    var stopRequested: Bool { flags.withLockedValue { $0.stopRequested } }

    /// Starts `body` on a new thread unless one is running; false if it was.
    @discardableResult
    func start(_ body: @escaping @Sendable () -> Void) -> Bool {
        let started = flags.withLockedValue { flags -> Bool in
            guard !flags.running else { return false }
            flags = Flags(running: true, stopRequested: false)
            return true
        }
        guard started else { return false }
        let thread = Thread { [flags] in
            body()
            flags.withLockedValue { $0.running = false }
        }
        thread.name = name
        thread.start()
        return true
    }

    /// Asks the loop to stop and returns once it has (it checks `stopRequested` once per frame).
    func stop() async {
        let running = flags.withLockedValue { flags -> Bool in
            flags.stopRequested = true
            return flags.running
        }
        guard running else { return }
        while isRunning { try? await Task.sleep(for: .milliseconds(2)) }
    }
}

/// Capture → Opus → audio datagrams, on a thread of its own because sources block until each 10 ms
/// period is due (ALSA reads, paced WAV files).
final class Transmitter: Sendable {
    struct State {
        var framesSent = 0
        var level = 0.0
        var peak = 0.0
    }

    let state = NIOLockedValueBox(State())
    let thread = MediaThread(name: "squelch-capture")
    let configuration: AudioConfiguration
    let onEvent: @Sendable (TransmitterEvent) -> Void

    enum TransmitterEvent: Sendable {
        /// The source ran out (a WAV file ended).
        case inputEnded
        case inputFailed(String)
    }

    init(configuration: AudioConfiguration, onEvent: @escaping @Sendable (TransmitterEvent) -> Void) {
        self.configuration = configuration
        self.onEvent = onEvent
    }

    var framesSent: Int { state.withLockedValue { $0.framesSent } }
    var level: Double { state.withLockedValue { $0.level } }
    var peak: Double { state.withLockedValue { $0.peak } }

    /// Starts sending `burst` through `client`, from sequence 0.
    func start(burst: UInt16, client: WireClientChannel) {
        guard let makeInput = configuration.makeInput else { return }
        let opus = configuration.opus
        thread.start { [self] in self.run(burst: burst, client: client, makeInput: makeInput, opus: opus) }
    }

    /// Stops capturing and returns once the end-of-burst marker is out (so that a floor release sent
    /// after it follows it on the wire).
    func stop() async { await thread.stop() }

    private func run(burst: UInt16, client: WireClientChannel, makeInput: @Sendable () throws -> any AudioSource, opus: OpusConfiguration) {
        var sequence: UInt16 = 0
        defer {
            // The end marker goes three times: a single lost packet must not leave listeners waiting
            // a whole second for the timeout (reference/audio.md §3.2).
            let end = AudioHeader(flags: .endOfBurst, burst: burst, sequence: sequence).datagram(payload: [])
            client.eventLoop.execute {
                for _ in 0..<3 { end.withUnsafeBytes { _ = client.sendDatagram($0) } }
            }
            state.withLockedValue { $0.level = 0; $0.peak = 0 }
        }
        let source: any AudioSource
        let encoder: OpusEncoder
        do {
            source = try makeInput()
            encoder = try OpusEncoder(configuration: opus)
        } catch {
            onEvent(.inputFailed("could not open the audio input: \(error); check --input, or use --input-file"))
            return
        }
        defer { source.close() }
        let period = PipelineAudio.periodFrames
        var pcm = [Int16](repeating: 0, count: period * 2)
        var packet = [UInt8](repeating: 0, count: AudioHeader.size + AudioHeader.maxPayload)
        while !thread.stopRequested {
            do {
                let first = try pcm.withUnsafeMutableBufferPointer { try source.read(into: UnsafeMutableBufferPointer(rebasing: $0[0..<period])) }
                let second = first == nil ? nil : try pcm.withUnsafeMutableBufferPointer { try source.read(into: UnsafeMutableBufferPointer(rebasing: $0[period...])) }
                guard first != nil else { onEvent(.inputEnded); return }
                if second == nil { for i in period..<(2 * period) { pcm[i] = 0 } }
                let count = try pcm.withUnsafeBufferPointer { samples in
                    try packet.withUnsafeMutableBytes { bytes in
                        try encoder.encode(samples, into: UnsafeMutableRawBufferPointer(rebasing: bytes[AudioHeader.size...]))
                    }
                }
                packet.withUnsafeMutableBytes { AudioHeader(burst: burst, sequence: sequence).write(to: $0) }
                let datagram = Array(packet[0 ..< AudioHeader.size + count])
                client.eventLoop.execute { datagram.withUnsafeBytes { _ = client.sendDatagram($0) } }
                sequence &+= 1
                let (level, peak) = Self.levels(pcm)
                state.withLockedValue { $0.framesSent += 1; $0.level = level; $0.peak = peak }
                if second == nil { onEvent(.inputEnded); return }
            } catch {
                onEvent(.inputFailed("the audio input failed: \(error)"))
                return
            }
        }
    }

    /// RMS and peak of a frame, for the input meter.
    static func levels(_ samples: [Int16]) -> (rms: Double, peak: Double) {
        var sum = 0.0
        var peak = 0.0
        for s in samples {
            let v = Double(s) / 32768
            sum += v * v
            peak = max(peak, abs(v))
        }
        return ((sum / Double(max(1, samples.count))).squareRoot(), peak)
    }
}

/// Audio datagrams → jitter buffer → Opus (FEC, then concealment) → the output, paced by the output:
/// its blocking writes are the playout clock, so the buffer is asked for one frame per 20 ms of audio
/// actually played.
final class Receiver: Sendable {
    struct State {
        var buffer: JitterBuffer
        var muted = false
        var flush = false
        var lastStatistics: BurstStatistics?
        var finished: [BurstStatistics] = []
        var malformed = 0
    }

    let state: NIOLockedValueBox<State>
    let thread = MediaThread(name: "squelch-playout")
    let configuration: AudioConfiguration
    let onEvent: @Sendable (ReceiverEvent) -> Void

    enum ReceiverEvent: Sendable {
        case burstFinished(BurstStatistics)
        case outputFailed(String)
    }

    init(configuration: AudioConfiguration, onEvent: @escaping @Sendable (ReceiverEvent) -> Void) {
        self.configuration = configuration
        self.onEvent = onEvent
        state = NIOLockedValueBox(State(buffer: JitterBuffer(configuration: configuration.jitterBuffer)))
    }

    var isPlaying: Bool { configuration.makeOutput != nil && thread.isRunning }

    /// One audio datagram from the server. Called on the connection's event loop; `bytes` is valid
    /// only during the call.
    func receive(_ bytes: UnsafeRawBufferPointer, now: UInt64 = monotonicNanoseconds()) {
        guard configuration.makeOutput != nil, thread.isRunning else { return }
        guard let header = AudioHeader(parsing: bytes) else {
            state.withLockedValue { $0.malformed += 1 }
            return
        }
        let payload = UnsafeRawBufferPointer(rebasing: bytes[AudioHeader.size...])
        state.withLockedValue { state in
            _ = state.buffer.insert(slot: header.slot, burst: header.burst, sequence: header.sequence,
                                    endOfBurst: header.flags.contains(.endOfBurst), catchUp: header.flags.contains(.catchUp),
                                    payload: payload, now: now)
        }
    }

    var statistics: (current: BurstStatistics?, target: Int) {
        state.withLockedValue { ($0.buffer.current ?? $0.lastStatistics, $0.buffer.currentTargetMilliseconds) }
    }

    func setMuted(_ muted: Bool) { state.withLockedValue { $0.muted = muted } }
    func flush() { state.withLockedValue { $0.flush = true } }

    func start() {
        guard let makeOutput = configuration.makeOutput else { return }
        thread.start { [self] in self.run(makeOutput: makeOutput) }
    }

    /// Stops playout and completes the output (a WAV file gets its header).
    func stop() async { await thread.stop() }

    private func run(makeOutput: @Sendable () throws -> any AudioSink) {
        let sink: any AudioSink
        let decoder: OpusDecoder
        do {
            sink = try makeOutput()
            decoder = try OpusDecoder()
        } catch {
            onEvent(.outputFailed("could not open the audio output: \(error); check --output, or use --output-file"))
            return
        }
        let period = PipelineAudio.periodFrames
        let frame = 2 * period
        var pcm = [Int16](repeating: 0, count: decoder.maximumFrameSamples)
        var payload = [UInt8](repeating: 0, count: AudioHeader.maxPayload)
        var payloadCount = 0
        enum Step { case decode, fec, conceal, silence }
        while !thread.stopRequested {
            let now = monotonicNanoseconds()
            var ended: BurstStatistics?
            let (step, muted) = state.withLockedValue { state -> (Step, Bool) in
                if state.flush {
                    state.flush = false
                    state.buffer.reset()
                }
                let decision = state.buffer.nextFrame(now: now)
                switch decision {
                case .play(let ref), .recoverWithFEC(next: let ref):
                    payloadCount = state.buffer.withPayload(of: ref) { bytes in
                        payload.withUnsafeMutableBytes { $0.copyMemory(from: bytes) }
                        return bytes.count
                    }
                    if case .play = decision { return (.decode, state.muted) }
                    return (.fec, state.muted)
                case .conceal: return (.conceal, state.muted)
                case .silence, .idle, .waiting: return (.silence, state.muted)
                case .ended(let statistics, _):
                    state.lastStatistics = statistics
                    ended = statistics
                    return (.silence, state.muted)
                }
            }
            if let ended {
                decoder.reset()
                onEvent(.burstFinished(ended))
            }
            var produced = 0
            pcm.withUnsafeMutableBufferPointer { out in
                let target = UnsafeMutableBufferPointer(rebasing: out[0..<frame])
                switch step {
                case .decode where payloadCount > 0:
                    produced = (try? payload.withUnsafeBytes { try decoder.decode(UnsafeRawBufferPointer(rebasing: $0[0..<payloadCount]), into: target) }) ?? 0
                case .fec where payloadCount > 0:
                    produced = (try? payload.withUnsafeBytes {
                        try decoder.decodeFEC(from: UnsafeRawBufferPointer(rebasing: $0[0..<payloadCount]), frameSamples: frame, into: target)
                    }) ?? 0
                case .conceal, .decode, .fec:
                    produced = (try? decoder.decodeMissing(frameSamples: frame, into: target)) ?? 0
                case .silence:
                    produced = 0
                }
                if produced < frame || muted { for i in (muted ? 0 : produced)..<frame { out[i] = 0 } }
            }
            do {
                try pcm.withUnsafeBufferPointer { all in
                    try sink.write(UnsafeBufferPointer(rebasing: all[0..<period]))
                    try sink.write(UnsafeBufferPointer(rebasing: all[period..<frame]))
                }
            } catch {
                onEvent(.outputFailed("the audio output failed: \(error)"))
                return
            }
        }
        do { try sink.finish() } catch { onEvent(.outputFailed("could not finish the audio output: \(error)")) }
    }
}
