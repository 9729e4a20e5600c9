import COpus
import COpusShim

/// An Opus decoder with loss concealment. One decoder per remote talker; reset it at the start of each
/// talk burst from a different talker.
///
/// For a missing frame *n* there are two ways to fill the gap:
/// - `decodeFEC(from:into:)` when packet *n + 1* has already arrived: it carries a coarse copy of *n*
///   (in-band FEC). Call it before decoding *n + 1* normally.
/// - `decodeMissing(into:)` otherwise: packet-loss concealment extrapolates from the past.
public final class OpusDecoder {
    private let state: OpaquePointer
    public let sampleRate: Int
    public let channels: Int

    /// The longest frame a packet may hold: 120 ms.
    public var maximumFrameSamples: Int { sampleRate / 1000 * 120 }

    public init(sampleRate: Int = 48_000, channels: Int = 1) throws(OpusError) {
        var probe = OpusConfiguration()
        probe.sampleRate = sampleRate
        probe.channels = channels
        try probe.validate()
        var error: Int32 = 0
        guard let state = opus_decoder_create(Int32(sampleRate), Int32(channels), &error), error == OPUS_OK else {
            throw .library(code: error, operation: "decoder create")
        }
        self.state = state
        self.sampleRate = sampleRate
        self.channels = channels
    }

    deinit { opus_decoder_destroy(state) }

    /// Samples per channel that `packet` decodes to, without decoding it.
    public func frameSamples(of packet: UnsafeRawBufferPointer) throws(OpusError) -> Int {
        guard let base = packet.baseAddress, !packet.isEmpty else { throw .emptyPacket }
        let n = opus_packet_get_nb_samples(base.assumingMemoryBound(to: UInt8.self), Int32(packet.count), Int32(sampleRate))
        guard n > 0 else { throw .corruptPacket(length: packet.count) }
        return Int(n)
    }

    /// Decodes one packet into interleaved PCM and returns samples per channel.
    public func decode(_ packet: UnsafeRawBufferPointer, into pcm: UnsafeMutableBufferPointer<Int16>) throws(OpusError) -> Int {
        guard let base = packet.baseAddress, !packet.isEmpty else { throw .emptyPacket }
        let needed = try frameSamples(of: packet) * channels
        guard let out = pcm.baseAddress, pcm.count >= needed else { throw .bufferTooSmall(needed: needed, available: pcm.count) }
        let n = opus_decode(state, base.assumingMemoryBound(to: UInt8.self), Int32(packet.count), out,
                            Int32(pcm.count / channels), 0)
        guard n >= 0 else { throw OpusError.decodeFailure(n, packetLength: packet.count) }
        return Int(n)
    }

    /// Recovers the frame *before* `nextPacket` from its in-band FEC data. `frameSamples` is the
    /// duration of the missing frame per channel. If `nextPacket` carries no FEC data, libopus falls
    /// back to concealment, so this never does worse than `decodeMissing`.
    public func decodeFEC(from nextPacket: UnsafeRawBufferPointer, frameSamples: Int,
                          into pcm: UnsafeMutableBufferPointer<Int16>) throws(OpusError) -> Int {
        guard let base = nextPacket.baseAddress, !nextPacket.isEmpty else { throw .emptyPacket }
        try checkConcealment(frameSamples, pcm)
        let n = opus_decode(state, base.assumingMemoryBound(to: UInt8.self), Int32(nextPacket.count), pcm.baseAddress!,
                            Int32(frameSamples), 1)
        guard n >= 0 else { throw OpusError.decodeFailure(n, packetLength: nextPacket.count) }
        return Int(n)
    }

    /// Conceals one lost frame of `frameSamples` per channel (packet-loss concealment).
    public func decodeMissing(frameSamples: Int, into pcm: UnsafeMutableBufferPointer<Int16>) throws(OpusError) -> Int {
        try checkConcealment(frameSamples, pcm)
        let n = opus_decode(state, nil, 0, pcm.baseAddress!, Int32(frameSamples), 0)
        guard n >= 0 else { throw .library(code: n, operation: "concealment") }
        return Int(n)
    }

    /// libopus requires concealment to cover exactly the missing duration, in multiples of 2.5 ms;
    /// anything else leaves the decoder out of step with the next packet.
    private func checkConcealment(_ frameSamples: Int, _ pcm: UnsafeMutableBufferPointer<Int16>) throws(OpusError) {
        let quantum = sampleRate / 400
        guard frameSamples > 0, frameSamples % quantum == 0, frameSamples <= maximumFrameSamples else {
            let nearest = max(quantum, min(maximumFrameSamples, (frameSamples / quantum) * quantum))
            throw .wrongFrameSize(got: frameSamples, expected: nearest, sampleRate: sampleRate, channels: 1)
        }
        guard pcm.baseAddress != nil, pcm.count >= frameSamples * channels else {
            throw .bufferTooSmall(needed: frameSamples * channels, available: pcm.count)
        }
    }

    /// Convenience form that returns a new array. Not for the per-packet path.
    public func decode(_ packet: [UInt8]) throws(OpusError) -> [Int16] {
        var pcm = [Int16](repeating: 0, count: maximumFrameSamples * channels)
        let n = try packet.withUnsafeBytes { p in
            pcm.withUnsafeMutableBufferPointer { out in Result { () throws(OpusError) in try decode(p, into: out) } }
        }.get()
        pcm.removeSubrange((n * channels)...)
        return pcm
    }

    /// Clears the decoder's history, as at the start of a burst from a new talker.
    public func reset() { _ = copus_decoder_reset(state) }
}
