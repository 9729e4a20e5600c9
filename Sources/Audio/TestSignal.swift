import Foundation

/// Deterministic signals for tests and benchmarks, where recorded speech isn't available.
public enum TestSignal {
    /// A speech-like signal: a glottal-pulse-like harmonic series whose pitch glides between 110 and
    /// 220 Hz, shaped by two moving formants and a 4 Hz syllable envelope that is silent half the time.
    /// Codecs treat it as voice (SILK/hybrid), unlike a pure tone.
    public static func speechLike(seconds: Double, sampleRate: Int = PipelineAudio.sampleRate) -> [Int16] {
        let n = Int(seconds * Double(sampleRate))
        var out = [Int16](repeating: 0, count: n)
        var phase = 0.0
        for i in 0..<n {
            let t = Double(i) / Double(sampleRate)
            let f0 = 165 + 55 * sin(2 * .pi * 0.7 * t)
            phase += 2 * .pi * f0 / Double(sampleRate)
            let formant1 = 500 + 300 * sin(2 * .pi * 0.9 * t), formant2 = 1500 + 600 * sin(2 * .pi * 0.5 * t)
            var s = 0.0
            for h in 1...20 {
                let fh = f0 * Double(h)
                let gain = exp(-pow((fh - formant1) / 250, 2)) + 0.6 * exp(-pow((fh - formant2) / 400, 2)) + 0.05 / Double(h)
                s += gain * sin(Double(h) * phase)
            }
            out[i] = Int16(clamping: Int(s * max(0, sin(2 * .pi * 4 * t)) * 6_000))
        }
        return out
    }
}
