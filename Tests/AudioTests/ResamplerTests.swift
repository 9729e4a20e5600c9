import Foundation
import Testing
@testable import Audio

func sine(_ frequency: Double, rate: Int, seconds: Double, amplitude: Double = 0.5) -> [Float] {
    (0..<Int(Double(rate) * seconds)).map { Float(amplitude * sin(2 * .pi * frequency * Double($0) / Double(rate))) }
}

/// Amplitude of `frequency` in `x` (Goertzel-style single-bin DFT), over the middle of the signal.
func toneAmplitude(_ x: [Float], frequency: Double, rate: Int) -> Double {
    let slice = x[x.count / 4..<x.count * 3 / 4]
    var re = 0.0, im = 0.0
    for (i, v) in slice.enumerated() {
        let w = 2 * .pi * frequency * Double(i) / Double(rate)
        re += Double(v) * cos(w); im += Double(v) * sin(w)
    }
    return 2 * (re * re + im * im).squareRoot() / Double(slice.count)
}

/// Level in dB (relative to the tone) of what remains of the middle half of `x` once the least-squares
/// fit of a sinusoid at `frequency` is subtracted.
func residualAfterRemovingTone(_ x: [Float], frequency: Double, rate: Int) -> Double {
    let range = x.count / 4..<x.count * 3 / 4
    var ss = 0.0, cc = 0.0, sc = 0.0, xs = 0.0, xc = 0.0
    for i in range {
        let w = 2 * .pi * frequency * Double(i) / Double(rate)
        let s = sin(w), c = cos(w), v = Double(x[i])
        ss += s * s; cc += c * c; sc += s * c; xs += v * s; xc += v * c
    }
    let det = ss * cc - sc * sc
    let a = (xs * cc - xc * sc) / det, b = (xc * ss - xs * sc) / det
    var signal = 0.0, noise = 0.0
    for i in range {
        let w = 2 * .pi * frequency * Double(i) / Double(rate)
        let fit = a * sin(w) + b * cos(w)
        signal += fit * fit
        noise += (Double(x[i]) - fit) * (Double(x[i]) - fit)
    }
    return 10 * log10(noise / signal)
}

@Suite struct ResamplerTests {
    /// The residual check must catch the cheap way out: repeating samples to go 44.1 → 48 kHz.
    @Test func residualCheckCatchesSampleDuplication() {
        let input = sine(1_000, rate: 44_100, seconds: 0.5)
        let nearest = (0..<24_000).map { input[min(input.count - 1, $0 * 44_100 / 48_000)] }
        #expect(residualAfterRemovingTone(nearest, frequency: 1_000, rate: 48_000) > -40)
    }

    @Test(arguments: [8_000, 16_000, 22_050, 44_100, 96_000])
    func aToneKeepsItsFrequencyAndLevel(sourceRate: Int) {
        let input = sine(1_000, rate: sourceRate, seconds: 0.5)
        let output = Resampler().resample(input, from: sourceRate, to: 48_000)
        #expect(abs(output.count - 24_000) <= 1)
        let level = toneAmplitude(output, frequency: 1_000, rate: 48_000)
        #expect(abs(level - 0.5) < 0.01, "1 kHz level \(level)")
        // Nothing but the tone: after subtracting the best-fitting 1 kHz sinusoid, what is left
        // (imaging, aliasing, duplicated or dropped samples) must be far below it.
        let residual = residualAfterRemovingTone(output, frequency: 1_000, rate: 48_000)
        #expect(residual < -60, "residual \(residual) dB")
    }

    /// Dropping samples would fold an 18 kHz tone to 2 kHz at 16 kHz; a real filter removes it.
    @Test func downsamplingFiltersWhatWouldAlias() {
        let input = sine(18_000, rate: 48_000, seconds: 0.5)
        let filtered = Resampler().resample(input, from: 48_000, to: 16_000)
        let decimated = stride(from: 0, to: input.count, by: 3).map { input[$0] }
        let aliasFiltered = toneAmplitude(filtered, frequency: 2_000, rate: 16_000)
        let aliasDecimated = toneAmplitude(decimated, frequency: 2_000, rate: 16_000)
        #expect(aliasDecimated > 0.4)  // the naive way really aliases
        #expect(20 * log10(aliasFiltered / 0.5) < -60, "alias at \(20 * log10(aliasFiltered / 0.5)) dB")
    }

    @Test func stereoFilesBecomeMonoPipelineAudio() {
        // Left 1 kHz, right silent → mono at half level; 44.1 kHz → 48 kHz.
        let left = sine(1_000, rate: 44_100, seconds: 0.5, amplitude: 0.8)
        var interleaved: [Float] = []
        for v in left { interleaved += [v, 0] }
        let audio = WAVAudio(format: WAVFormat(encoding: .float32, sampleRate: 44_100, channels: 2), samples: .float32(interleaved))
        let pcm = audio.pipelineSamples()
        #expect(abs(pcm.count - 24_000) <= 1)
        let level = toneAmplitude(pcm.map { Float($0) / 32_768 }, frequency: 1_000, rate: 48_000)
        #expect(abs(level - 0.4) < 0.01)
    }

    @Test func pipelineFormatPassesThroughUntouched() {
        let samples: [Int16] = (0..<4_800).map { Int16(truncatingIfNeeded: $0 &* 7919) }
        let audio = WAVAudio(format: .pipeline, samples: .pcm16(samples))
        #expect(audio.pipelineSamples() == samples)
    }
}
