import Foundation

/// A band-limited sample-rate converter: windowed-sinc interpolation (Kaiser window), after
/// J. O. Smith's "bandlimited interpolation". The kernel is tabulated at `tableResolution` points per
/// zero crossing and read with linear interpolation, so any ratio works (44.1 → 48 kHz, 8 → 48 kHz,
/// 48 → 44.1 kHz) without a table per phase. When downsampling, the kernel is stretched so that its
/// cutoff sits below the new Nyquist frequency: content that would alias is filtered out, not folded.
public struct Resampler: Sendable {
    /// Zero crossings on each side of the kernel. 16 gives a stopband well past 80 dB with β = 8.
    public let zeroCrossings: Int
    /// Passband edge as a fraction of the lower Nyquist frequency; the rest is the transition band.
    public let rolloff: Double
    private let table: [Float]
    private static let tableResolution = 256

    public init(zeroCrossings: Int = 16, rolloff: Double = 0.92, kaiserBeta: Double = 8.0) {
        precondition(zeroCrossings > 0 && rolloff > 0 && rolloff <= 1, "zeroCrossings > 0 and 0 < rolloff <= 1")
        self.zeroCrossings = zeroCrossings
        self.rolloff = rolloff
        let n = zeroCrossings * Self.tableResolution
        let i0Beta = Self.besselI0(kaiserBeta)
        var table = [Float](repeating: 0, count: n + 2)
        for i in 0...n {
            let x = Double(i) / Double(Self.tableResolution)  // in zero crossings
            let sinc = x == 0 ? 1.0 : sin(Double.pi * x) / (Double.pi * x)
            let r = x / Double(zeroCrossings)
            let window = Self.besselI0(kaiserBeta * (1 - r * r).squareRoot()) / i0Beta
            table[i] = Float(sinc * window)
        }
        self.table = table
    }

    /// Converts `input` (mono) from `sourceRate` to `targetRate`. Identity when the rates match.
    public func resample(_ input: [Float], from sourceRate: Int, to targetRate: Int) -> [Float] {
        // Rates come from validated WAV headers (1 kHz to 768 kHz) or constants.
        precondition(sourceRate > 0 && targetRate > 0, "sample rates must be positive")
        guard sourceRate != targetRate, !input.isEmpty else { return input }
        let ratio = Double(targetRate) / Double(sourceRate)
        // Cutoff relative to the input rate's Nyquist: below both Nyquist frequencies.
        let scale = min(1.0, ratio) * rolloff
        let outputCount = Int((Double(input.count) * ratio).rounded())
        let halfWidth = Double(zeroCrossings) / scale  // kernel half-width in input samples
        let step = 1.0 / ratio
        var output = [Float](repeating: 0, count: outputCount)
        let res = Double(Self.tableResolution)
        input.withUnsafeBufferPointer { x in
            table.withUnsafeBufferPointer { h in
                for n in 0..<outputCount {
                    let t = Double(n) * step  // position in input samples
                    let first = max(0, Int((t - halfWidth).rounded(.up)))
                    let last = min(x.count - 1, Int((t + halfWidth).rounded(.down)))
                    guard first <= last else { continue }
                    var acc: Double = 0
                    for j in first...last {
                        let pos = abs(t - Double(j)) * scale * res
                        let i = Int(pos)
                        let frac = Float(pos - Double(i))
                        let k = h[i] + (h[i + 1] - h[i]) * frac
                        acc += Double(x[j] * k)
                    }
                    output[n] = Float(acc * scale)
                }
            }
        }
        return output
    }

    /// Zeroth-order modified Bessel function of the first kind (power series).
    private static func besselI0(_ x: Double) -> Double {
        var sum = 1.0, term = 1.0
        let half = x / 2
        for k in 1..<50 {
            term *= (half / Double(k)) * (half / Double(k))
            sum += term
            if term < sum * 1e-12 { break }
        }
        return sum
    }
}

extension WAVAudio {
    /// Converts to the pipeline's format (48 kHz mono 16-bit): channels are averaged, the rate is
    /// converted with `Resampler`, and floats are rounded and clipped to 16 bits.
    public func pipelineSamples(resampler: Resampler = Resampler()) -> [Int16] {
        if format == .pipeline, case .pcm16(let s) = samples {
            return s  // already in pipeline format: keep it bit-exact, convert nothing
        }
        let channels = format.channels
        var mono: [Float]
        let floats = samples.floats
        if channels == 1 {
            mono = floats
        } else {
            mono = [Float](repeating: 0, count: frameCount)
            for f in 0..<frameCount {
                var sum: Float = 0
                for c in 0..<channels { sum += floats[f * channels + c] }
                mono[f] = sum / Float(channels)
            }
        }
        mono = resampler.resample(mono, from: format.sampleRate, to: 48_000)
        return mono.map { Int16(clamping: Int(($0 * 32_768).rounded())) }
    }
}
