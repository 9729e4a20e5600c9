import Audio
import Foundation

/// The short tones a radio plays around the floor (MCPTT's "talk permit" and friends), so that a
/// talker need not look at a screen to know when to speak, and a listener hears that a call ended.
public enum Tone: String, CaseIterable, Sendable {
    /// The floor is granted: speak after it.
    case talkPermit
    /// The floor was refused (someone else talks, or talking is not allowed): the "bonk".
    case busy
    /// The request waits in the floor queue.
    case queued
    /// A burst this member heard has ended.
    case endOfBurst

    /// The tone as (frequency in Hz, milliseconds) steps; 0 Hz is a gap.
    var steps: [(hertz: Double, milliseconds: Int)] {
        switch self {
        case .talkPermit: [(1_200, 40), (0, 30), (1_200, 40)]
        case .busy: [(400, 150), (0, 50), (400, 150)]
        case .queued: [(800, 60), (0, 40), (600, 60)]
        case .endOfBurst: [(1_600, 80)]
        }
    }

    /// The tone's samples in the pipeline format, at `volume` (0–1 of full scale), each step faded in
    /// and out over 4 ms so that it doesn't click.
    func samples(volume: Double) -> [Int16] {
        let rate = Double(PipelineAudio.sampleRate)
        let fade = Int(rate * 0.004)
        var out: [Int16] = []
        for step in steps {
            let count = Int(rate) * step.milliseconds / 1000
            for i in 0..<count {
                guard step.hertz > 0 else { out.append(0); continue }
                let edge = min(i, count - 1 - i)
                let envelope = edge < fade ? 0.5 - 0.5 * cos(Double.pi * Double(edge) / Double(fade)) : 1
                out.append(Int16(volume * envelope * 32_767 * sin(2 * Double.pi * step.hertz * Double(i) / rate)))
            }
        }
        return out
    }
}

/// Which tones play, and how loud. Part of `AudioConfiguration`; `ChannelManager.setTonesMuted`
/// silences them all while the app runs.
public struct ToneConfiguration: Sendable, Equatable {
    public var enabled: Set<Tone>
    /// 0–1 of full scale; the default is well under speech, as a radio's tones are.
    public var volume: Double

    public init(enabled: Set<Tone> = Set(Tone.allCases), volume: Double = 0.2) {
        self.enabled = enabled
        self.volume = min(max(volume, 0), 1)
    }

    public static let standard = ToneConfiguration()
    public static let off = ToneConfiguration(enabled: [])
}

/// Plays tones into the receiver's mix, one after another. Lives in the receiver's state, so the
/// playout thread mixes it and the engine queues tones under the same lock, the one the connection's
/// event loop takes for every audio datagram: the tones are rendered once, here, and nothing under
/// that lock computes or allocates.
struct TonePlayer {
    /// Each enabled tone's samples, at the configured volume.
    private let rendered: [Tone: [Int16]]
    private var muted = false
    /// The tone playing, and how far.
    private var playing: (tone: Tone, position: Int)?
    private var waiting: [Tone] = []
    /// Tones asked for faster than they play (a press hammered against a busy floor) are dropped
    /// past this, rather than beep on long after.
    static let maxWaiting = 2

    init(configuration: ToneConfiguration) {
        var rendered: [Tone: [Int16]] = [:]
        if configuration.volume > 0 {
            for tone in configuration.enabled { rendered[tone] = tone.samples(volume: configuration.volume) }
        }
        self.rendered = rendered
        waiting.reserveCapacity(Self.maxWaiting)
    }

    var isIdle: Bool { playing == nil && waiting.isEmpty }

    mutating func play(_ tone: Tone) {
        guard !muted, rendered[tone] != nil, waiting.count < Self.maxWaiting else { return }
        waiting.append(tone)
    }

    mutating func setMuted(_ value: Bool) {
        muted = value
        if value { stop() }
    }

    mutating func stop() {
        playing = nil
        waiting.removeAll(keepingCapacity: true)
    }

    /// Adds the next `mix.count` samples of the tones (nothing when idle) onto `mix`.
    mutating func mix(into mix: UnsafeMutableBufferPointer<Int32>) {
        var i = 0
        while i < mix.count {
            if playing == nil {
                guard !waiting.isEmpty else { return }
                playing = (waiting.removeFirst(), 0)
            }
            guard let (tone, position) = playing, let samples = rendered[tone] else { return }
            let n = min(mix.count - i, samples.count - position)
            for k in 0..<n { mix[i + k] += Int32(samples[position + k]) }
            i += n
            playing = position + n < samples.count ? (tone, position + n) : nil
        }
    }
}
