/// Encoder settings. The defaults are the push-to-talk profile from DESIGN.md: VOIP, 48 kHz mono,
/// 20 ms frames, VBR at 32 kbps, in-band FEC with 5 % expected loss, complexity 6, DTX off.
///
/// Why these: 32 kbps is the lowest rate at which libopus 1.3 still carries useful FEC (LBRR) at
/// wideband; below it FEC silently switches off. DTX is off because push-to-talk already stops
/// sending when the key is released.
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
    /// Expected packet loss, 0 to 100 %. Should follow what receivers report (1-15 %).
    public var expectedPacketLossPercent: Int = 5
    /// Discontinuous transmission: near-silent frames become packets of at most 2 bytes.
    public var dtx: Bool = false

    public init() {}

    /// The push-to-talk profile (the defaults).
    public static let pushToTalk = OpusConfiguration()

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
