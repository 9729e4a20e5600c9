import SeededRandom

/// xoshiro256** seeded through SplitMix64.
///
/// The standard library's generator is neither seedable nor stable across releases, and reproducing a failing
/// run from its seed is the point of the proxy, so the model carries its own. xoshiro256** is fast, has a
/// 2^256 period and passes BigCrush; SplitMix64 spreads a small seed (0, 1, 42) over the 256-bit state so that
/// nearby seeds still give unrelated streams and the state can never be all zero.
public struct SeededGenerator: RandomNumberGenerator, Sendable, Hashable {
    private var s0: UInt64
    private var s1: UInt64
    private var s2: UInt64
    private var s3: UInt64

    /// Creates a generator whose whole output is determined by `seed`.
    public init(seed: UInt64) {
        var mixer = SplitMix64(seed: seed)
        s0 = mixer.next()
        s1 = mixer.next()
        s2 = mixer.next()
        s3 = mixer.next()
    }

    /// The next 64 random bits.
    public mutating func next() -> UInt64 {
        let result = rotateLeft(s1 &* 5, 7) &* 9
        let t = s1 << 17
        s2 ^= s0
        s3 ^= s1
        s1 ^= s2
        s0 ^= s3
        s2 ^= t
        s3 = rotateLeft(s3, 45)
        return result
    }

    /// A uniform double in `[0, 1)` built from the top 53 bits, so every representable step is equally likely.
    public mutating func nextUnit() -> Double {
        Double(next() >> 11) * 0x1.0p-53
    }

    /// True with probability `probability` (values outside 0...1 act as 0 or 1). Always draws, so the stream
    /// position does not depend on the configured probability.
    public mutating func chance(_ probability: Double) -> Bool {
        nextUnit() < probability
    }

    /// An approximately standard normal value (mean 0, σ 1, bounded to ±6) from the sum of 12 uniforms.
    public mutating func nextStandardNormal() -> Double {
        var sum = 0.0
        for _ in 0..<12 { sum += nextUnit() }
        return sum - 6
    }

    private func rotateLeft(_ x: UInt64, _ k: UInt64) -> UInt64 {
        (x << k) | (x >> (64 - k))
    }
}


