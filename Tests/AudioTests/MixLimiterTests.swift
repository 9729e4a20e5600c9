import Audio
import Foundation
import Testing

@Suite struct MixLimiterTests {
    static let frame = 960

    /// Two talkers' 20 ms frames summed, as the playout mixes them.
    static func sum(_ a: Double, _ b: Double, frame index: Int, amplitudeA: Double, amplitudeB: Double) -> [Int32] {
        (0..<frame).map { i in
            let t = Double(index * frame + i) / 48_000
            return Int32(amplitudeA * sin(2 * .pi * a * t)) + Int32(amplitudeB * sin(2 * .pi * b * t))
        }
    }

    static func run(_ limiter: inout MixLimiter, _ mix: [Int32]) -> [Int16] {
        var out = [Int16](repeating: 0, count: mix.count)
        mix.withUnsafeBufferPointer { sums in out.withUnsafeMutableBufferPointer { limiter.process(sums, into: $0) } }
        return out
    }

    @Test func aLoneTalkerWithinSixteenBitsPassesUnchanged() {
        var limiter = MixLimiter()
        let mix = Self.sum(440, 0, frame: 0, amplitudeA: 30_000, amplitudeB: 0)
        #expect(Self.run(&limiter, mix).map(Int32.init) == mix)
        #expect(limiter.gain == 1)
    }

    /// Two loud talkers at once: their sum reaches about 1.8× full scale. Clamped, a third of the
    /// samples would sit flat at the rails; limited, none does, and the waveform keeps its shape.
    @Test func twoLoudTalkersAreScaledDownNotClipped() {
        var limiter = MixLimiter()
        var clipped = 0, clampedWouldBe = 0
        var worstShape = 1.0
        for index in 0..<25 {
            let mix = Self.sum(440, 660, frame: index, amplitudeA: 30_000, amplitudeB: 30_000)
            let out = Self.run(&limiter, mix)
            clipped += out.filter { $0 == .max || $0 == .min }.count
            clampedWouldBe += mix.filter { abs($0) >= Int32(Int16.max) }.count
            // Within a frame the output is the mix times a smooth gain: compare the shapes.
            let dot = zip(mix, out).reduce(0.0) { $0 + Double($1.0) * Double($1.1) }
            let norms = (mix.reduce(0.0) { $0 + Double($1) * Double($1) } * out.reduce(0.0) { $0 + Double($1) * Double($1) }).squareRoot()
            worstShape = min(worstShape, dot / norms)
        }
        #expect(clampedWouldBe > 1_000, "the test's mix does exceed 16 bits: \(clampedWouldBe)")
        #expect(clipped == 0)
        #expect(worstShape > 0.999, "shape kept: \(worstShape)")
        #expect(limiter.gain < 0.7)
    }

    /// Once one talker stops, the level comes back to unity within a few frames, not at once (no
    /// jump) and not never (no lasting dip for the one still talking).
    @Test func theGainRecoversOverAFewFramesWhenTheMixIsQuietAgain() {
        var limiter = MixLimiter()
        _ = Self.run(&limiter, Self.sum(440, 660, frame: 0, amplitudeA: 30_000, amplitudeB: 30_000))
        let low = limiter.gain
        var gains: [Float] = []
        for index in 1...40 {
            _ = Self.run(&limiter, Self.sum(440, 0, frame: index, amplitudeA: 10_000, amplitudeB: 0))
            gains.append(limiter.gain)
        }
        #expect(low < 0.7)
        #expect(gains[0] < 0.8, "not back at once: \(gains[0])")
        #expect(zip(gains, gains.dropFirst()).allSatisfy { $0 <= $1 }, "climbs steadily: \(gains)")
        #expect(gains.last == 1, "back to unity: \(gains)")
        // And at unity the lone talker is exact again.
        let mix = Self.sum(440, 0, frame: 41, amplitudeA: 10_000, amplitudeB: 0)
        #expect(Self.run(&limiter, mix).map(Int32.init) == mix)
    }

    @Test func extremeSumsStayInRange() {
        var limiter = MixLimiter()
        let mix: [Int32] = [.min, .max, 4 * 32_767, -4 * 32_768, 0]
        let out = Self.run(&limiter, mix)
        #expect(out[0] < 0 && out[1] > 0 && out[4] == 0)
    }
}
