/// Brings a mix of several talkers (a full-duplex channel, two people answering at once) back into
/// 16 bits without clipping. Clamping each sample, as a plain sum would need, flattens the peaks of
/// two loud voices into a square-ish buzz that makes both hard to understand; scaling the whole
/// frame down keeps both intelligible, only quieter.
///
/// A frame's gain is decided before any of it plays (the frame is all there: the look-ahead is
/// free), so it drops at once to what the frame's peak needs and never lets a sample past full
/// scale; it climbs back towards 1 over a few frames once the mix is quieter, so that the level
/// doesn't pump at every syllable. A lone talker, whose decoded audio stays within 16 bits, passes
/// through unchanged.
public struct MixLimiter: Sendable {
    /// The gain the last frame ended with (1: not limiting).
    public private(set) var gain: Float = 1
    /// The fraction of the way back to 1 that the gain climbs per frame: about 100 ms to recover
    /// most of the way with 20 ms frames.
    public var release: Float = 0.2

    public init() {}

    /// Writes `mix` (sums of 16-bit samples) into `out`, scaled so that nothing clips; `out` holds
    /// at least `mix.count` samples. Allocates nothing: it runs once per playout frame.
    public mutating func process(_ mix: UnsafeBufferPointer<Int32>, into out: UnsafeMutableBufferPointer<Int16>) {
        let count = min(mix.count, out.count)
        var peak: Int32 = 0
        for i in 0..<count { peak = max(peak, mix[i] == .min ? .max : abs(mix[i])) }
        let limit = Float(Int16.max)
        // A mix past 16 bits is brought to a hair under full scale (-0.2 dBFS), not onto it, so
        // that its peaks don't sit at the rails as clipping would.
        let needed = peak > Int32(Int16.max) ? 32_000 / Float(peak) : 1
        if gain == 1, needed == 1 {
            for i in 0..<count { out[i] = Int16(mix[i]) }
            return
        }
        // Down at once to what this frame needs; back up only part of the way.
        let start = min(gain, needed)
        let end = min(needed, gain + (1 - gain) * release)
        let step = count > 1 ? (end - start) / Float(count - 1) : 0
        for i in 0..<count {
            // Both ends are at most `needed`, so the ramp is too; the clamp only guards rounding.
            let scaled = (Float(mix[i]) * (start + step * Float(i))).rounded()
            out[i] = Int16(max(-limit - 1, min(limit, scaled)))
        }
        // Within a hair of 1 is 1, so that a lone talker's frames take the exact path again.
        gain = end > 0.999 ? 1 : end
    }
}
