/// Encoder settings. The defaults are the push-to-talk profile: VOIP, 48 kHz mono,
/// 20 ms frames, VBR at 32 kbps, in-band FEC allowed with 5 % expected loss, complexity 6, DTX off.
///
/// Why these: DTX is off because push-to-talk already stops sending when the key is released. FEC
/// (LBRR) is allowed, but at 32 kbps and 5 % expected loss libopus 1.3.1 codes none (measured:
/// recovering a frame from the next packet gives exactly what concealment gives), so a clean network
/// gets every bit for the speech itself. Real FEC is what `adapted(toListenerLoss:)` turns on once
/// listeners report loss: it takes bits from the speech, so it is worth paying only when packets are
/// really lost (docs/benchmarks.md has the PESQ-WB figures both ways).
public struct OpusConfiguration: Sendable, Hashable {
    /// Frame durations a PTT sender may use. Opus also allows 2.5 and 5 ms, but those carry no FEC.
    public enum FrameDuration: Int, Sendable, CaseIterable {
        case ms10 = 10, ms20 = 20, ms40 = 40, ms60 = 60

        /// Samples per channel in one frame at `sampleRate`.
        public func samples(atSampleRate sampleRate: Int) -> Int { sampleRate / 1000 * rawValue }
    }

    /// libopus's application modes. `.voip` is the one to use for speech.
    public enum Application: Sendable, Hashable {
        case voip, audio, restrictedLowDelay
    }

    /// Sample rate of the PCM on both sides of the codec: 8, 12, 16, 24 or 48 kHz.
    public var sampleRate: Int = 48_000
    /// 1 (mono) or 2 (stereo).
    public var channels: Int = 1
    public var application: Application = .voip
    public var frameDuration: FrameDuration = .ms20
    /// Target bitrate in bits per second, 6 000 to 510 000.
    public var bitrate: Int = 32_000
    public var variableBitrate: Bool = true
    /// 0 (fastest) to 10 (best). 5 to 8 is the useful range for speech on a PC.
    public var complexity: Int = 6
    /// In-band forward error correction: each packet also carries a coarse copy of the previous frame.
    public var inbandFEC: Bool = true
    /// Expected packet loss, 0 to 100 %. Should follow what receivers report: see
    /// `adapted(toListenerLoss:)`.
    public var expectedPacketLossPercent: Int = 5
    /// Discontinuous transmission: near-silent frames become packets of at most 2 bytes.
    public var dtx: Bool = false

    public init() {}

    /// The push-to-talk profile (the defaults).
    public static let pushToTalk = OpusConfiguration()

    /// Listener loss (percent) from which `adapted(toListenerLoss:)` turns FEC on.
    public static let fecLossThreshold = 2
    /// The lowest bitrate FEC runs at: at 32 kbps the redundant copy takes so many bits from the
    /// speech that a clean listener hears it (PESQ-WB 3.80 → 3.16 in the end-to-end benchmark); at
    /// 40 kbps 3.50, and the lossy listener gains more (10 % loss: 2.59 at 32, 2.99 at 40 kbps).
    public static let fecMinimumBitrate = 40_000

    /// The settings for a talker whose worst listener misses `percent` % of its frames (the server's
    /// `receptionLoss`). Below `fecLossThreshold` they are these settings, unchanged. From it, FEC is
    /// coded for real: expected loss `percent`, at least 10 (5 codes none with libopus 1.3.1; 10 does,
    /// measured) and at most 25 (so that a terrible link can't take all of the speech's bits), at no
    /// less than `fecMinimumBitrate`, neither ever below this configuration's own. A configuration
    /// with FEC off stays off.
    public func adapted(toListenerLoss percent: Int) -> OpusConfiguration {
        guard inbandFEC, percent >= Self.fecLossThreshold else { return self }
        var adapted = self
        adapted.expectedPacketLossPercent = max(expectedPacketLossPercent, min(max(percent, 10), 25))
        adapted.bitrate = max(bitrate, Self.fecMinimumBitrate)
        return adapted
    }

    /// Samples per channel in one frame.
    public var frameSamples: Int { frameDuration.samples(atSampleRate: sampleRate) }

    /// Checks every field, so that a bad value fails with a message instead of a libopus code.
    public func validate() throws(OpusError) {
        func bad(_ message: String) -> OpusError { .invalidConfiguration(message) }
        guard [8_000, 12_000, 16_000, 24_000, 48_000].contains(sampleRate) else {
            throw bad("sample rate \(sampleRate) Hz is not one Opus supports; use 8000, 12000, 16000, 24000 or 48000")
        }
        guard channels == 1 || channels == 2 else {
            throw bad("channel count \(channels) is not supported; use 1 (mono) or 2 (stereo)")
        }
        guard (6_000...510_000).contains(bitrate) else {
            throw bad("bitrate \(bitrate) bit/s is out of range; use 6000 to 510000 (32000 for PTT speech)")
        }
        guard (0...10).contains(complexity) else {
            throw bad("complexity \(complexity) is out of range; use 0 to 10 (5 to 8 for speech)")
        }
        guard (0...100).contains(expectedPacketLossPercent) else {
            throw bad("expected packet loss \(expectedPacketLossPercent) % is out of range; use 0 to 100")
        }
    }
}
