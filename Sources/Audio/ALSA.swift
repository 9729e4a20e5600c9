import CALSA
import CALSAShim
#if canImport(Glibc)
import Glibc
#endif

/// ALSA PCM capture and playback in the pipeline format: S16_LE, 48 kHz, mono, 10 ms periods, 4 periods
/// of buffer. I/O is blocking, so each stream runs on its own thread.
///
/// ALSA's "ALSA lib …" stderr messages are silenced when the first stream opens: a terminal UI must not
/// be garbled. Errors still reach us as return codes and become `AudioError`s.
public enum ALSA {
    /// One PCM device from ALSA's name hints.
    public struct Device: Sendable, Hashable {
        /// The name to pass to `--input`/`--output` (e.g. `default`, `hw:CARD=PCH,DEV=0`, `null`).
        public var name: String
        /// ALSA's description, first line only.
        public var description: String
        /// Whether it can capture, play back, or both.
        public var canCapture: Bool
        public var canPlay: Bool
    }

    /// Stream direction.
    public enum Direction: Sendable {
        case capture, playback
    }

    /// Period and buffer sizes of an opened stream, as ALSA negotiated them.
    public struct Negotiated: Sendable, Hashable {
        public var sampleRate: Int
        public var periodFrames: Int
        public var bufferFrames: Int
    }

    /// Turns ALSA's stderr chatter off for the whole process. Idempotent.
    public static func silenceErrorMessages() { calsa_silence_errors() }

    /// Lists PCM devices (`walkie devices`). An empty list means ALSA knows of no device at all.
    public static func devices() -> [Device] {
        silenceErrorMessages()
        var hints: UnsafeMutablePointer<UnsafeMutableRawPointer?>?
        guard snd_device_name_hint(-1, "pcm", &hints) == 0, let hints else { return [] }
        defer { snd_device_name_free_hint(hints) }
        var result: [Device] = []
        var i = 0
        while let hint = hints[i] {
            i += 1
            func value(_ key: String) -> String? {
                guard let p = snd_device_name_get_hint(hint, key) else { return nil }
                defer { free(p) }
                return String(cString: p)
            }
            guard let name = value("NAME") else { continue }
            let io = value("IOID")  // nil means both directions
            let description = (value("DESC") ?? "").split(separator: "\n").map { String($0) }.joined(separator: ", ")
            result.append(Device(name: name, description: description,
                                 canCapture: io == nil || io == "Input", canPlay: io == nil || io == "Output"))
        }
        return result
    }

    static func message(_ code: Int32) -> String { String(cString: snd_strerror(code)) }
}

/// An open ALSA PCM in the pipeline format. `ALSACapture` and `ALSAPlayback` wrap it as a source and a
/// sink.
final class ALSAStream {
    let pcm: OpaquePointer
    let name: String
    let direction: ALSA.Direction
    let negotiated: ALSA.Negotiated
    /// xruns (overruns on capture, underruns on playback) recovered so far.
    private(set) var xruns = 0

    init(name: String, direction: ALSA.Direction, periodFrames: Int = PipelineAudio.periodFrames, periods: Int = 4) throws(AudioError) {
        ALSA.silenceErrorMessages()
        var handle: OpaquePointer?
        let stream = direction == .capture ? SND_PCM_STREAM_CAPTURE : SND_PCM_STREAM_PLAYBACK
        let rc = snd_pcm_open(&handle, name, stream, 0)
        guard rc >= 0, let handle else {
            let reason = rc == -ENOENT || rc == -ENODEV || rc == -EINVAL
                ? "no such device (\(ALSA.message(rc)))" : ALSA.message(rc)
            throw .device(name: name, reason: reason)
        }
        do {
            negotiated = try Self.configure(handle, name: name, direction: direction, periodFrames: periodFrames, periods: periods)
        } catch {
            snd_pcm_close(handle)
            throw error
        }
        self.pcm = handle
        self.name = name
        self.direction = direction
    }

    deinit { snd_pcm_close(pcm) }

    private static func configure(_ pcm: OpaquePointer, name: String, direction: ALSA.Direction,
                                  periodFrames: Int, periods: Int) throws(AudioError) -> ALSA.Negotiated {
        func check(_ rc: Int32, _ what: String) throws(AudioError) {
            if rc < 0 { throw .device(name: name, reason: "\(what): \(ALSA.message(rc))") }
        }
        var hw: OpaquePointer?
        try check(snd_pcm_hw_params_malloc(&hw), "allocating parameters")
        defer { snd_pcm_hw_params_free(hw) }
        try check(snd_pcm_hw_params_any(pcm, hw), "reading its capabilities")
        try check(snd_pcm_hw_params_set_access(pcm, hw, SND_PCM_ACCESS_RW_INTERLEAVED), "interleaved access")
        try check(snd_pcm_hw_params_set_format(pcm, hw, SND_PCM_FORMAT_S16_LE), "16-bit little-endian format")
        try check(snd_pcm_hw_params_set_channels(pcm, hw, 1), "mono")
        try check(snd_pcm_hw_params_set_rate_resample(pcm, hw, 1), "enabling resampling")
        var rate: UInt32 = UInt32(PipelineAudio.sampleRate)
        var dir: Int32 = 0
        try check(snd_pcm_hw_params_set_rate_near(pcm, hw, &rate, &dir), "48 kHz sample rate")
        guard Int(rate) == PipelineAudio.sampleRate else {
            throw .device(name: name, reason: "it offers \(rate) Hz instead of 48000 Hz; choose the 'plug' or 'default' device, which converts")
        }
        // Period and buffer sizes are requests: sound servers' ALSA plugins (PulseAudio, PipeWire) pick
        // their own quantum. Reads and writes loop until a whole 10 ms period has moved, so any
        // negotiated size works; `negotiated` reports what we got.
        var period = snd_pcm_uframes_t(periodFrames)
        dir = 0
        try check(snd_pcm_hw_params_set_period_size_near(pcm, hw, &period, &dir), "10 ms period")
        var count = UInt32(periods)
        dir = 0
        try check(snd_pcm_hw_params_set_periods_near(pcm, hw, &count, &dir), "\(periods) periods")
        try check(snd_pcm_hw_params(pcm, hw), "applying the hardware parameters")
        var buffer: snd_pcm_uframes_t = 0
        try check(snd_pcm_hw_params_get_buffer_size(hw, &buffer), "reading the buffer size")

        var sw: OpaquePointer?
        try check(snd_pcm_sw_params_malloc(&sw), "allocating software parameters")
        defer { snd_pcm_sw_params_free(sw) }
        try check(snd_pcm_sw_params_current(pcm, sw), "reading software parameters")
        // Capture starts on the first read; playback waits for two periods so the first write doesn't underrun.
        let threshold = direction == .capture ? 1 : 2 * period
        try check(snd_pcm_sw_params_set_start_threshold(pcm, sw, threshold), "start threshold")
        try check(snd_pcm_sw_params_set_avail_min(pcm, sw, period), "wake-up threshold")
        try check(snd_pcm_sw_params(pcm, sw), "applying the software parameters")
        try check(snd_pcm_prepare(pcm), "preparing the stream")
        return ALSA.Negotiated(sampleRate: Int(rate), periodFrames: Int(period), bufferFrames: Int(buffer))
    }

    /// Recovers from an xrun (-EPIPE), a suspend (-ESTRPIPE) or a signal (-EINTR); anything else is fatal.
    func recover(_ code: Int) throws(AudioError) {
        let rc = snd_pcm_recover(pcm, Int32(code), 1)
        guard rc >= 0 else { throw .deviceFailed(name: name, reason: ALSA.message(Int32(code))) }
        if code == -Int(EPIPE) { xruns += 1 }
    }

    /// Playback: frames queued ahead of the speaker. Capture: frames captured but not yet read.
    /// 0 when ALSA can't tell.
    var delayFrames: Int {
        var frames: snd_pcm_sframes_t = 0
        return snd_pcm_delay(pcm, &frames) == 0 ? Int(frames) : 0
    }
}

/// Microphone input through ALSA.
public final class ALSACapture: AudioSource {
    private let stream: ALSAStream

    /// Opens `device` (default: ALSA's `default`) for capture.
    public init(device: String = "default") throws(AudioError) {
        stream = try ALSAStream(name: device, direction: .capture)
    }

    public var negotiated: ALSA.Negotiated { stream.negotiated }
    public var xruns: Int { stream.xruns }

    public func read(into buffer: UnsafeMutableBufferPointer<Int16>) throws(AudioError) -> UInt64? {
        guard buffer.count == PipelineAudio.periodFrames, let base = buffer.baseAddress else {
            throw .wrongBufferSize(got: buffer.count, expected: PipelineAudio.periodFrames)
        }
        var filled = 0
        while filled < buffer.count {
            let n = snd_pcm_readi(stream.pcm, base + filled, snd_pcm_uframes_t(buffer.count - filled))
            if n < 0 { try stream.recover(n); continue }
            filled += n
        }
        // The first sample we just read was captured this many frames ago: ours, plus whatever is
        // still waiting in the buffer behind them (non-zero when the reader falls behind).
        let age = UInt64(buffer.count + stream.delayFrames) * 1_000_000_000 / UInt64(PipelineAudio.sampleRate)
        return monotonicNanoseconds() - age
    }

    public func close() { snd_pcm_drop(stream.pcm) }
}

/// Speaker output through ALSA.
public final class ALSAPlayback: AudioSink {
    private let stream: ALSAStream

    /// Opens `device` (default: ALSA's `default`) for playback.
    public init(device: String = "default") throws(AudioError) {
        stream = try ALSAStream(name: device, direction: .playback)
    }

    public var negotiated: ALSA.Negotiated { stream.negotiated }
    public var xruns: Int { stream.xruns }

    @discardableResult
    public func write(_ samples: UnsafeBufferPointer<Int16>) throws(AudioError) -> UInt64 {
        guard samples.count == PipelineAudio.periodFrames, let base = samples.baseAddress else {
            throw .wrongBufferSize(got: samples.count, expected: PipelineAudio.periodFrames)
        }
        let queued = stream.delayFrames
        var written = 0
        while written < samples.count {
            let n = snd_pcm_writei(stream.pcm, base + written, snd_pcm_uframes_t(samples.count - written))
            if n < 0 { try stream.recover(n); continue }
            written += n
        }
        return monotonicNanoseconds() + UInt64(queued) * 1_000_000_000 / UInt64(PipelineAudio.sampleRate)
    }

    public func finish() throws(AudioError) {
        let rc = snd_pcm_drain(stream.pcm)
        if rc < 0 && rc != -EPIPE { throw .deviceFailed(name: stream.name, reason: ALSA.message(rc)) }
    }
}
