import Audio
import COpus
import Foundation
import SeededRandom
import Testing
@testable import Opus

func speechLike(seconds: Double) -> [Int16] { TestSignal.speechLike(seconds: seconds) }

func frames(_ pcm: [Int16], size: Int) -> [[Int16]] {
    stride(from: 0, to: pcm.count - size + 1, by: size).map { Array(pcm[$0..<$0 + size]) }
}

/// Signal-to-noise ratio in dB of `test` against `reference`.
func snr(_ reference: ArraySlice<Int16>, _ test: ArraySlice<Int16>) -> Double {
    var signal = 0.0, noise = 0.0
    for (r, t) in zip(reference, test) {
        signal += Double(r) * Double(r)
        noise += (Double(r) - Double(t)) * (Double(r) - Double(t))
    }
    return 10 * log10(signal / max(noise, 1))
}

/// Normalised cross-correlation of two equal-length slices.
func correlation(_ a: ArraySlice<Int16>, _ b: ArraySlice<Int16>) -> Double {
    var ab = 0.0, aa = 0.0, bb = 0.0
    for (x, y) in zip(a, b) { ab += Double(x) * Double(y); aa += Double(x) * Double(x); bb += Double(y) * Double(y) }
    return ab / (aa * bb).squareRoot()
}


@Suite struct OpusCodecTests {
    @Test func defaultsAreThePushToTalkProfile() throws {
        let encoder = try OpusEncoder()
        #expect(encoder.readBack(OPUS_GET_BITRATE_REQUEST) == 32_000)
        #expect(encoder.readBack(OPUS_GET_VBR_REQUEST) == 1)
        #expect(encoder.readBack(OPUS_GET_INBAND_FEC_REQUEST) == 1)
        #expect(encoder.readBack(OPUS_GET_PACKET_LOSS_PERC_REQUEST) == 5)
        #expect(encoder.readBack(OPUS_GET_DTX_REQUEST) == 0)
        let complexity = try #require(encoder.readBack(OPUS_GET_COMPLEXITY_REQUEST))
        #expect((5...8).contains(complexity))
        #expect(encoder.readBack(OPUS_GET_APPLICATION_REQUEST) == OPUS_APPLICATION_VOIP)
        #expect(encoder.configuration.frameSamples == 960)
    }

    @Test func everySettingCanBeChanged() throws {
        let encoder = try OpusEncoder()
        var c = encoder.configuration
        c.bitrate = 24_000; c.complexity = 9; c.inbandFEC = false; c.expectedPacketLossPercent = 12; c.dtx = true
        c.variableBitrate = false
        try encoder.reconfigure(c)
        #expect(encoder.readBack(OPUS_GET_BITRATE_REQUEST) == 24_000)
        #expect(encoder.readBack(OPUS_GET_COMPLEXITY_REQUEST) == 9)
        #expect(encoder.readBack(OPUS_GET_INBAND_FEC_REQUEST) == 0)
        #expect(encoder.readBack(OPUS_GET_PACKET_LOSS_PERC_REQUEST) == 12)
        #expect(encoder.readBack(OPUS_GET_DTX_REQUEST) == 1)
        #expect(encoder.readBack(OPUS_GET_VBR_REQUEST) == 0)
        try encoder.setExpectedPacketLoss(percent: 3)
        #expect(encoder.readBack(OPUS_GET_PACKET_LOSS_PERC_REQUEST) == 3)
    }

    @Test(arguments: OpusConfiguration.FrameDuration.allCases)
    func everyFrameDurationRoundTrips(duration: OpusConfiguration.FrameDuration) throws {
        var c = OpusConfiguration()
        c.frameDuration = duration
        let encoder = try OpusEncoder(configuration: c)
        let decoder = try OpusDecoder()
        let frame = Array(speechLike(seconds: 0.5)[0..<c.frameSamples])
        let packet = try encoder.encode(frame)
        #expect(!packet.isEmpty)
        #expect(try decoder.decode(packet).count == duration.rawValue * 48)
    }

    @Test func speechSurvivesEncodeAndDecode() throws {
        let encoder = try OpusEncoder()
        let decoder = try OpusDecoder()
        let input = speechLike(seconds: 3)
        var output: [Int16] = []
        for frame in frames(input, size: 960) { output += try decoder.decode(try encoder.encode(frame)) }
        let delay = encoder.lookahead
        #expect(delay > 0 && delay < 960)
        // Align for the codec delay, skip the first 100 ms while the codec settles.
        let start = 4_800, length = output.count - start - 2 * 960
        let ref = input[start..<start + length]
        func aligned(_ lag: Int) -> ArraySlice<Int16> { output[start + lag..<start + lag + length] }
        // The best alignment must be the codec delay the encoder reports, give or take a few samples.
        // Searched over ±2 ms of it on a 0.5 s window, to keep the debug build fast.
        let window = ref.prefix(24_000)
        func score(_ lag: Int) -> Double { correlation(window, aligned(lag).prefix(24_000)) }
        let bestLag = (max(0, delay - 96)...(delay + 96)).max { score($0) < score($1) }!
        #expect(abs(bestLag - delay) <= 4, "best lag \(bestLag), lookahead \(delay)")
        let r = correlation(ref, aligned(delay))
        let s = snr(ref, aligned(delay))
        print("speech round trip: lookahead \(delay), best lag \(bestLag), correlation \(r), SNR \(s) dB")
        #expect(r > 0.85, "correlation \(r)")
        #expect(s > 5, "SNR \(s) dB")
        // A wrong alignment must score clearly worse, or the checks above prove nothing.
        #expect(correlation(ref, aligned(delay + 37)) < r - 0.1)
    }

    /// Drops every 7th frame and conceals it twice: with FEC taken from the next packet, and with
    /// PLC. Returns how close each comes (SNR over the lost frames, dB) to what the decoder produced
    /// when nothing was lost.
    func lostFrameScores(_ configuration: OpusConfiguration) throws -> (fec: Double, plc: Double) {
        let encoder = try OpusEncoder(configuration: configuration)
        let input = speechLike(seconds: 4)
        let packets = try frames(input, size: 960).map { try encoder.encode($0) }

        func run(concealWithFEC: Bool) throws -> (pcm: [Int16], lost: [Int]) {
            let decoder = try OpusDecoder()
            var out: [Int16] = [], lost: [Int] = []
            var buf = [Int16](repeating: 0, count: 960)
            for i in packets.indices {
                if i % 7 == 3, i + 1 < packets.count {
                    lost.append(i)
                    let n = try buf.withUnsafeMutableBufferPointer { b in
                        try concealWithFEC
                            ? packets[i + 1].withUnsafeBytes { try decoder.decodeFEC(from: $0, frameSamples: 960, into: b) }
                            : decoder.decodeMissing(frameSamples: 960, into: b)
                    }
                    #expect(n == 960)
                    out += buf
                } else {
                    out += try decoder.decode(packets[i])
                }
            }
            return (out, lost)
        }
        let cleanDecoder = try OpusDecoder()
        let clean = try packets.flatMap { try cleanDecoder.decode($0) }
        let fec = try run(concealWithFEC: true), plc = try run(concealWithFEC: false)
        func lostSNR(_ pcm: [Int16]) -> Double {
            var signal = 0.0, noise = 0.0
            for i in fec.lost {
                for j in i * 960..<(i + 1) * 960 {
                    signal += Double(clean[j]) * Double(clean[j])
                    noise += pow(Double(clean[j]) - Double(pcm[j]), 2)
                }
            }
            return 10 * log10(signal / max(noise, 1))
        }
        return (lostSNR(fec.pcm), lostSNR(plc.pcm))
    }

    /// The settings a talker switches to once a listener reports loss carry real FEC.
    @Test func fecRecoversADroppedFrameBetterThanPLC() throws {
        let adapted = OpusConfiguration.pushToTalk.adapted(toListenerLoss: 3)
        let (fec, plc) = try lostFrameScores(adapted)
        print("lost frames, adapted to 3 % loss: FEC \(fec) dB, PLC \(plc) dB")
        #expect(fec > plc + 1, "FEC \(fec) dB vs PLC \(plc) dB over the lost frames")
    }

    /// Why the talker adapts at all: at the plain settings (32 kbps, 5 % expected loss) libopus 1.3
    /// (Debian 12's, which the benchmarks used) codes no FEC, so "recovering" a frame from the next
    /// packet is concealment by another name. Other releases decide FEC differently; with them this
    /// checks only what holds for any: the adapted settings recover a lost frame at least as well.
    @Test func thePlainSettingsCarryNoFEC() throws {
        let (fec, plc) = try lostFrameScores(.pushToTalk)
        print("lost frames, plain settings, \(OpusLibrary.version): FEC \(fec) dB, PLC \(plc) dB")
        if OpusLibrary.version.hasPrefix("libopus 1.3") {
            #expect(abs(fec - plc) < 0.5, "FEC \(fec) dB vs PLC \(plc) dB over the lost frames")
        } else {
            let adapted = try lostFrameScores(OpusConfiguration.pushToTalk.adapted(toListenerLoss: 3))
            #expect(adapted.fec >= fec, "adapted FEC \(adapted.fec) dB vs plain \(fec) dB")
        }
    }

    @Test func listenerLossTurnsFECOnAtAHigherBitrate() throws {
        let plain = OpusConfiguration.pushToTalk
        #expect(plain.adapted(toListenerLoss: 0) == plain)
        #expect(plain.adapted(toListenerLoss: 1) == plain)
        let some = plain.adapted(toListenerLoss: 2)
        #expect(some.inbandFEC && some.expectedPacketLossPercent == 10 && some.bitrate == 40_000)
        #expect(plain.adapted(toListenerLoss: 18).expectedPacketLossPercent == 18)
        #expect(plain.adapted(toListenerLoss: 90).expectedPacketLossPercent == 25)
        // Never below what was configured, and never on where FEC was turned off.
        var rich = plain
        rich.bitrate = 64_000
        rich.expectedPacketLossPercent = 30
        #expect(rich.adapted(toListenerLoss: 5).bitrate == 64_000)
        #expect(rich.adapted(toListenerLoss: 5).expectedPacketLossPercent == 30)
        var noFEC = plain
        noFEC.inbandFEC = false
        #expect(noFEC.adapted(toListenerLoss: 50) == noFEC)
        // What the encoder is given is valid and takes effect.
        let encoder = try OpusEncoder(configuration: plain)
        try encoder.reconfigure(plain.adapted(toListenerLoss: 12))
        #expect(encoder.readBack(OPUS_GET_PACKET_LOSS_PERC_REQUEST) == 12)
        #expect(encoder.readBack(OPUS_GET_BITRATE_REQUEST) == 40_000)
    }

    @Test func garbagePacketsThrowTypedErrorsAndNeverCrash() throws {
        let decoder = try OpusDecoder()
        // TOC code 3 (several frames) with a frame count of zero is invalid by RFC 6716 §3.2.5.
        #expect(throws: OpusError.corruptPacket(length: 2)) { try decoder.decode([0x03, 0x00]) }
        #expect(throws: OpusError.emptyPacket) { try decoder.decode([]) }
        // Code 1 (two equal frames) with an odd payload length is invalid.
        #expect(throws: OpusError.corruptPacket(length: 4)) { try decoder.decode([0x01, 0x01, 0x02, 0x03]) }

        var rng = SplitMix64(seed: 0x5EED_0F_0905)
        var corrupt = 0
        for _ in 0..<5_000 {
            let packet = (0..<Int.random(in: 1...400, using: &rng)).map { _ in UInt8.random(in: 0...255, using: &rng) }
            do { _ = try decoder.decode(packet) } catch .corruptPacket { corrupt += 1 } catch {
                Issue.record("unexpected error \(error)")
            }
        }
        #expect(corrupt > 0)
        // The decoder still works after all that garbage.
        let good = try OpusEncoder().encode(Array(speechLike(seconds: 0.1)[0..<960]))
        decoder.reset()
        #expect(try decoder.decode(good).count == 960)
    }

    @Test func wrongFrameSizeIsRejectedWithAClearMessage() throws {
        let encoder = try OpusEncoder()
        let error = #expect(throws: OpusError.self) { try encoder.encode([Int16](repeating: 0, count: 1_000)) }
        #expect(error == .wrongFrameSize(got: 1_000, expected: 960, sampleRate: 48_000, channels: 1))
        let message = String(describing: try #require(error))
        #expect(message.contains("expected 960"))
        #expect(message.contains("20 ms at 48000 Hz"))
        #expect(message.contains("10, 20, 40 or 60 ms"))

        let decoder = try OpusDecoder()
        var buf = [Int16](repeating: 0, count: 960)
        // Concealment must cover a whole number of 2.5 ms steps (120 samples at 48 kHz).
        #expect(throws: OpusError.wrongFrameSize(got: 100, expected: 120, sampleRate: 48_000, channels: 1)) {
            try buf.withUnsafeMutableBufferPointer { try decoder.decodeMissing(frameSamples: 100, into: $0) }
        }
    }

    @Test func invalidConfigurationsAreRejected() throws {
        var c = OpusConfiguration()
        c.bitrate = 1_000
        #expect(throws: OpusError.self) { try OpusEncoder(configuration: c) }
        c = OpusConfiguration(); c.complexity = 11
        #expect(throws: OpusError.self) { try OpusEncoder(configuration: c) }
        c = OpusConfiguration(); c.sampleRate = 44_100
        let error = #expect(throws: OpusError.self) { try OpusEncoder(configuration: c) }
        #expect(String(describing: try #require(error)).contains("44100"))
    }
}
