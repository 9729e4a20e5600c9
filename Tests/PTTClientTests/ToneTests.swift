import Audio
import ChannelProtocol
import Foundation
@testable import PTTClient
import SquelchTesting
import Testing

struct ToneTests {
    @Test func eachToneHasItsPitchLengthAndLevel() {
        for tone in Tone.allCases {
            let samples = tone.samples(volume: 0.2)
            let milliseconds = tone.steps.reduce(0) { $0 + $1.milliseconds }
            #expect(samples.count == PipelineAudio.sampleRate * milliseconds / 1000, "\(tone)")
            let peak = samples.map { abs(Int($0)) }.max() ?? 0
            #expect(peak > 6_000 && peak <= 6_554, "\(tone): peak \(peak)")
            #expect(abs(Int(samples.first!)) < 100 && abs(Int(samples.last!)) < 100, "\(tone) fades in and out")
            let first = tone.steps[0]
            let count = PipelineAudio.sampleRate * first.milliseconds / 1000
            let share = TonePresence.share(of: first.hertz, in: samples[0..<count])
            #expect(share > 0.8, "\(tone): \(share) of its first step at \(first.hertz) Hz")
        }
        // A gap is silence.
        let permit = Tone.talkPermit.samples(volume: 0.2)
        #expect(permit[2_000 ..< 3_200].allSatisfy { $0 == 0 }, "the talk-permit tone's gap")
    }

    @Test func thePlayerMixesQueuedTonesAcrossFramesAndObeysItsSettings() {
        var player = TonePlayer(configuration: .standard)
        var mix = [Int32](repeating: 100, count: 960)
        #expect(player.isIdle)
        player.play(.endOfBurst)
        player.play(.busy)
        player.play(.queued)  // past maxWaiting: dropped
        var heard: [Int32] = []
        for _ in 0 ..< 40 {
            for i in mix.indices { mix[i] = 100 }
            mix.withUnsafeMutableBufferPointer { player.mix(into: $0) }
            heard += mix.map { $0 - 100 }
        }
        let expected = Tone.endOfBurst.samples(volume: 0.2) + Tone.busy.samples(volume: 0.2)
        #expect(Array(heard.prefix(expected.count)) == expected.map(Int32.init), "the two tones, in order, over the audio")
        #expect(heard.dropFirst(expected.count).allSatisfy { $0 == 0 }, "then nothing: the third was dropped")
        #expect(player.isIdle)

        var off = TonePlayer(configuration: ToneConfiguration(enabled: [.busy]))
        off.play(.talkPermit)
        #expect(off.isIdle, "not enabled")
        off.setMuted(true)
        off.play(.busy)
        #expect(off.isIdle, "muted")
        off.setMuted(false)
        off.play(.busy)
        #expect(!off.isIdle)
        off.setMuted(true)
        #expect(off.isIdle, "muting stops a tone playing")
        #expect(ToneConfiguration(volume: 3).volume == 1)
    }

    @Test func theSessionAsksForTheFloorsTones() {
        var s = joinedSession()
        s.beginTransmitting(channelID, source: .userRequest)
        _ = s.takeOutputs()
        s.received(.floor(FloorEvent(kind: .queued, position: 2, request: 1)))
        s.received(.floor(FloorEvent(kind: .queued, position: 1, request: 1)))
        #expect(s.takeOutputs().filter { if case .tone = $0 { true } else { false } } == [.tone(.queued)], "once, not at each move up")
        s.received(.floor(FloorEvent(kind: .granted, burst: 4, request: 1)))
        let granted = s.takeOutputs()
        let tone = granted.firstIndex(of: .tone(.talkPermit)), sending = granted.firstIndex(of: .startSending(burst: 4))
        #expect(tone != nil && sending != nil && tone! < sending!, "\(granted)")
        s.stopTransmitting(channelID, source: .userRequest)
        _ = s.takeOutputs()
        s.beginTransmitting(channelID, source: .userRequest)
        _ = s.takeOutputs()
        s.received(.floor(FloorEvent(kind: .denied, cause: .busy, reason: "Bob is talking", request: 2)))
        #expect(s.takeOutputs().contains(.tone(.busy)))
    }
}
