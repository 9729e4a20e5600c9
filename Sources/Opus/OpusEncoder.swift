import COpus
import COpusShim

/// An Opus encoder. Not thread-safe: one encoder belongs to one capture pipeline.
///
/// The hot path is `encode(_:into:)`, which writes into a caller-owned buffer and allocates nothing.
public final class OpusEncoder {
    private let state: OpaquePointer
    public private(set) var configuration: OpusConfiguration

    /// The largest packet one frame can produce (RFC 6716 caps a packet at 1275 bytes per frame,
    /// and a 60 ms packet holds up to three 20 ms frames).
    public static let maximumPacketSize = 4_000

    public init(configuration: OpusConfiguration = .pushToTalk) throws(OpusError) {
        try configuration.validate()
        var error: Int32 = 0
        let app: Int32 = switch configuration.application {
        case .voip: OPUS_APPLICATION_VOIP
        case .audio: OPUS_APPLICATION_AUDIO
        case .restrictedLowDelay: OPUS_APPLICATION_RESTRICTED_LOWDELAY
        }
        guard let state = opus_encoder_create(Int32(configuration.sampleRate), Int32(configuration.channels), app, &error),
              error == OPUS_OK else {
            throw .library(code: error, operation: "encoder create")
        }
        self.state = state
        self.configuration = configuration
        try apply(configuration)
    }

    deinit { opus_encoder_destroy(state) }

    /// Changes the encoder's settings in place. Sample rate, channels and application are fixed at
    /// creation; changing them needs a new encoder.
    public func reconfigure(_ new: OpusConfiguration) throws(OpusError) {
        try new.validate()
        guard new.sampleRate == configuration.sampleRate, new.channels == configuration.channels,
              new.application == configuration.application else {
            throw .invalidConfiguration("sample rate, channels and application are fixed when the encoder is made; create a new encoder to change them")
        }
        try apply(new)
        configuration = new
    }

    /// Follows receiver-reported loss: FEC is only worth its bits when loss is real.
    public func setExpectedPacketLoss(percent: Int) throws(OpusError) {
        var new = configuration
        new.expectedPacketLossPercent = percent
        try reconfigure(new)
    }

    /// Codec delay in samples per channel; the decoded signal lags the input by this much.
    public var lookahead: Int {
        var value: Int32 = 0
        _ = copus_encoder_get(state, OPUS_GET_LOOKAHEAD_REQUEST, &value)
        return Int(value)
    }

    /// Reads a setting back from libopus (used by tests to prove a setting took effect).
    public func readBack(_ request: Int32) -> Int32? {
        var value: Int32 = 0
        return copus_encoder_get(state, request, &value) == OPUS_OK ? value : nil
    }

    private func apply(_ c: OpusConfiguration) throws(OpusError) {
        func set(_ request: Int32, _ value: Int, _ name: String) throws(OpusError) {
            let rc = copus_encoder_set(state, request, Int32(value))
            guard rc == OPUS_OK else { throw .library(code: rc, operation: "setting \(name)") }
        }
        try set(OPUS_SET_BITRATE_REQUEST, c.bitrate, "bitrate")
        try set(OPUS_SET_VBR_REQUEST, c.variableBitrate ? 1 : 0, "VBR")
        try set(OPUS_SET_COMPLEXITY_REQUEST, c.complexity, "complexity")
        try set(OPUS_SET_INBAND_FEC_REQUEST, c.inbandFEC ? 1 : 0, "in-band FEC")
        try set(OPUS_SET_PACKET_LOSS_PERC_REQUEST, c.expectedPacketLossPercent, "expected packet loss")
        try set(OPUS_SET_DTX_REQUEST, c.dtx ? 1 : 0, "DTX")
        if c.application == .voip { try set(OPUS_SET_SIGNAL_REQUEST, Int(OPUS_SIGNAL_VOICE), "signal") }
    }

    private func checkFrame(_ count: Int) throws(OpusError) {
        let expected = configuration.frameSamples * configuration.channels
        guard count == expected else {
            throw .wrongFrameSize(got: count, expected: expected, sampleRate: configuration.sampleRate,
                                  channels: configuration.channels)
        }
    }

    /// Encodes one frame of interleaved 16-bit PCM into `packet` and returns the packet length.
    public func encode(_ pcm: UnsafeBufferPointer<Int16>, into packet: UnsafeMutableRawBufferPointer) throws(OpusError) -> Int {
        try encodeFrame(pcm, into: packet) { opus_encode(state, $0, $1, $2, $3) }
    }

    /// Encodes one frame of interleaved float PCM (nominal range -1...1).
    public func encode(_ pcm: UnsafeBufferPointer<Float>, into packet: UnsafeMutableRawBufferPointer) throws(OpusError) -> Int {
        try encodeFrame(pcm, into: packet) { opus_encode_float(state, $0, $1, $2, $3) }
    }

    /// The checks and result handling both sample types share; `call` is the libopus entry point.
    private func encodeFrame<Sample>(
        _ pcm: UnsafeBufferPointer<Sample>, into packet: UnsafeMutableRawBufferPointer,
        _ call: (UnsafePointer<Sample>, Int32, UnsafeMutablePointer<UInt8>, Int32) -> Int32
    ) throws(OpusError) -> Int {
        try checkFrame(pcm.count)
        guard let input = pcm.baseAddress, let output = packet.baseAddress else { throw .bufferTooSmall(needed: 1, available: 0) }
        let n = call(input, Int32(configuration.frameSamples), output.assumingMemoryBound(to: UInt8.self), Int32(packet.count))
        guard n >= 0 else { throw .library(code: n, operation: "encode") }
        return Int(n)
    }

    /// Convenience form that returns a new array. Not for the per-packet path.
    public func encode(_ pcm: [Int16]) throws(OpusError) -> [UInt8] {
        var packet = [UInt8](repeating: 0, count: Self.maximumPacketSize)
        // Array's closures rethrow untyped errors, so the typed error travels out in a Result.
        let n = try pcm.withUnsafeBufferPointer { input in
            packet.withUnsafeMutableBytes { output in Result { () throws(OpusError) in try encode(input, into: output) } }
        }.get()
        packet.removeSubrange(n...)
        return packet
    }

    /// Clears the encoder's history, as at the start of a new talk burst.
    public func reset() { _ = copus_encoder_reset(state) }
}
