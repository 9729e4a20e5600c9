import Audio
import ChannelProtocol
import Foundation
import JitterBuffer
import MediaFrames
import NIOConcurrencyHelpers
import Opus
import WireNIO

/// Capture → Opus → audio datagrams, on a thread of its own because sources block until each 10 ms
/// period is due (ALSA reads, paced WAV files).
final class Transmitter: Sendable {
    struct State {
        var framesSent = 0
        var level = 0.0
        var peak = 0.0
        /// The worst loss among this talker's listeners, as the server last said (`receptionLoss`).
        var listenerLoss = 0
        /// The settings of the encoder sending now, set by the capture thread; nil between bursts.
        var encoder: OpusConfiguration?
        /// This member's own bursts' keys, newest last (the server sends one with each grant, and
        /// another whenever a listener stops hearing).
        var keys: [MediaKey] = []
        /// The SFrame counter of the next sealed frame, carried from burst to burst so that no key
        /// ever sees a nonce twice, whatever the server sends again.
        var sealCounter: UInt64 = 0
    }

    let state = NIOLockedValueBox(State())
    let thread = MediaThread(name: "squelch-capture")
    let configuration: AudioConfiguration
    let onEvent: @Sendable (TransmitterEvent) -> Void

    enum TransmitterEvent: Sendable {
        /// The source ran out (a WAV file ended) while feeding this burst.
        case inputEnded(burst: UInt16)
        case inputFailed(String)
        case inputDevice(AudioDeviceStatus)
    }

    init(configuration: AudioConfiguration, onEvent: @escaping @Sendable (TransmitterEvent) -> Void) {
        self.configuration = configuration
        self.onEvent = onEvent
    }

    var framesSent: Int { state.withLockedValue { $0.framesSent } }
    /// The settings of the encoder sending now (nil while not transmitting).
    var encoderConfiguration: OpusConfiguration? { state.withLockedValue { $0.encoder } }
    /// Takes effect at the next frame, also in the middle of a burst.
    func setListenerLoss(_ percent: Int) { state.withLockedValue { $0.listenerLoss = percent } }
    var level: Double { state.withLockedValue { $0.level } }

    /// A key for one of this member's bursts; the next frame of that burst is sealed with it.
    func addKey(_ key: MediaKey) {
        state.withLockedValue { state in
            state.keys.append(key)
            if state.keys.count > 16 { state.keys.removeFirst() }
        }
    }

    /// A new session: its keys are numbered afresh.
    func forgetKeys() { state.withLockedValue { $0.keys.removeAll() } }

    private func key(for burst: UInt16) -> MediaKey? {
        state.withLockedValue { state in state.keys.last { $0.burst == burst } }
    }
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
        // Each frame is sealed once, for every listener (docs/protocol.md §16.4.5).
        let sealer = MediaSealer(counter: state.withLockedValue { $0.sealCounter })
        var packet = [UInt8](repeating: 0, count: AudioHeader.size + AudioHeader.maxPayload)
        defer {
            // The end marker goes three times: a single lost packet must not leave listeners waiting
            // a whole second for the end-of-burst timeout. Sealed once: the copies are the same frame.
            let header = AudioHeader(flags: .endOfBurst, burst: burst, sequence: sequence)
            if let key = key(for: burst),
               let length = packet.withUnsafeMutableBytes({ sealer.seal(header, payload: UnsafeRawBufferPointer(start: nil, count: 0), key: key, into: $0) }) {
                let end = Array(packet[..<length])
                client.eventLoop.execute {
                    for _ in 0..<3 { end.withUnsafeBytes { _ = client.sendDatagram($0) } }
                }
            }
            state.withLockedValue { $0.level = 0; $0.peak = 0; $0.encoder = nil; $0.sealCounter = sealer.counter }
        }
        let encoder: OpusEncoder
        var listenerLoss = state.withLockedValue { $0.listenerLoss }
        do {
            encoder = try OpusEncoder(configuration: opus.adapted(toListenerLoss: listenerLoss))
            state.withLockedValue { $0.encoder = encoder.configuration }
        } catch {
            onEvent(.inputFailed("could not start the audio encoder: \(error)"))
            return
        }
        // A microphone that is gone (or fails during the burst) is opened again every second while
        // the transmission lasts; nothing is sent meanwhile. A file that fails ends it.
        var device: (any AudioSource)?
        var retry = AudioDeviceRetry()
        func lose(_ error: any Error) {
            onEvent(.inputDevice(.lost("\(error)")))
            retry.lost(at: monotonicNanoseconds())
        }
        do {
            device = try makeInput()
        } catch where AudioDeviceRetry.isDevice(error) {
            lose(error)
        } catch {
            onEvent(.inputFailed("could not open the audio input: \(error); check --input, or use --input-file"))
            return
        }
        defer { device?.close() }
        let period = PipelineAudio.periodFrames
        var pcm = [Int16](repeating: 0, count: period * 2)
        var opusPacket = [UInt8](repeating: 0, count: MediaSealer.maxOpusPayload)
        while !thread.stopRequested {
            guard let source = device else {
                if let reopened = retry.reopen(at: monotonicNanoseconds(), makeInput) {
                    device = reopened
                    onEvent(.inputDevice(.restored))
                } else {
                    usleep(20_000)
                }
                continue
            }
            do {
                let first = try pcm.withUnsafeMutableBufferPointer { try source.read(into: UnsafeMutableBufferPointer(rebasing: $0[0..<period])) }
                let second = first == nil ? nil : try pcm.withUnsafeMutableBufferPointer { try source.read(into: UnsafeMutableBufferPointer(rebasing: $0[period...])) }
                guard first != nil else { onEvent(.inputEnded(burst: burst)); return }
                if second == nil { for i in period..<(2 * period) { pcm[i] = 0 } }
                let count = try pcm.withUnsafeBufferPointer { samples in
                    try opusPacket.withUnsafeMutableBytes { try encoder.encode(samples, into: $0) }
                }
                let header = AudioHeader(burst: burst, sequence: sequence)
                if let key = key(for: burst), let length = packet.withUnsafeMutableBytes({ bytes in
                    opusPacket.withUnsafeBytes { sealer.seal(header, payload: UnsafeRawBufferPointer(rebasing: $0[..<count]), key: key, into: bytes) }
                }) {
                    let datagram = Array(packet[..<length])
                    client.eventLoop.execute { datagram.withUnsafeBytes { _ = client.sendDatagram($0) } }
                }
                sequence &+= 1
                let (level, peak) = Self.levels(pcm)
                let loss = state.withLockedValue { state in
                    state.framesSent += 1
                    state.level = level
                    state.peak = peak
                    return state.listenerLoss
                }
                if loss != listenerLoss {
                    // Bitrate and FEC can change between any two frames; the decoder needs nothing. The
                    // settings are valid by construction: should libopus still refuse, the old ones stay.
                    listenerLoss = loss
                    let adapted = opus.adapted(toListenerLoss: loss)
                    if adapted != encoder.configuration, (try? encoder.reconfigure(adapted)) != nil {
                        state.withLockedValue { $0.encoder = encoder.configuration }
                    }
                }
                if second == nil { onEvent(.inputEnded(burst: burst)); return }
            } catch where AudioDeviceRetry.isDevice(error) {
                source.close()
                device = nil
                lose(error)
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
