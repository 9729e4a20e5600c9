import Foundation

/// Where a pure tone is in recorded audio: the 20 ms windows (at 48 kHz) whose energy is mostly at
/// `hertz` (one Goertzel bin) and that are loud enough to be a tone, not noise.
public enum TonePresence {
    /// The share of `samples`' energy at `hertz`: near 1 for a tone at that pitch, near 0 otherwise.
    public static func share(of hertz: Double, in samples: some Collection<Int16>, sampleRate: Double = 48_000) -> Double {
        let coefficient = 2 * cos(2 * Double.pi * hertz / sampleRate)
        var s1 = 0.0, s2 = 0.0, total = 0.0
        for x in samples {
            let v = Double(x)
            total += v * v
            let s0 = v + coefficient * s1 - s2
            s2 = s1
            s1 = s0
        }
        let power = s1 * s1 + s2 * s2 - coefficient * s1 * s2
        return total > 0 ? 2 * power / (Double(samples.count) * total) : 0
    }

    /// The start of each 20 ms window holding the tone.
    public static func windows(of hertz: Double, in audio: [Int16], minimumPeak: Int = 3_000) -> [Int] {
        stride(from: 0, to: audio.count - 960, by: 960).filter { start in
            let window = audio[start ..< start + 960]
            return window.contains { abs(Int($0)) > minimumPeak } && share(of: hertz, in: window) > 0.5
        }
    }
}
