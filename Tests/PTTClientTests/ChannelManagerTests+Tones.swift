import Audio
import Foundation
@testable import PTTClient
import SquelchTesting
import Testing

extension ChannelManagerTests {
    /// The floor's tones in the real output files: the talker hears the talk-permit tone when the floor
    /// is granted, the listener the end-of-burst tone after the burst, and nothing once tones are muted.
    @Test func theTalkerHearsTheTalkPermitAndTheListenerTheEndOfBurst() async throws {
        let fixture = try await ClientFixture(pushes: false)
        let id = fixture.channel.id
        // A 440 Hz microphone: nothing near the tones' pitches.
        let microphone = (0..<96_000).map { Int16(8_000 * sin(2 * .pi * 440 * Double($0) / 48_000)) }
        let annHeard = fixture.directory + "/ann-tones.wav", bobHeard = fixture.directory + "/bob-tones.wav"
        var annAudio = recorder(annHeard)
        annAudio.makeInput = { WAVFileSource(pipelineSamples: microphone, pacer: RealTimePacer()) }
        let annDelegate = RecordingDelegate(), bobDelegate = RecordingDelegate()
        let ann = try await manager(fixture, "tone-ann", annDelegate, audio: annAudio, pushes: false)
        let bob = try await manager(fixture, "tone-bob", bobDelegate, audio: recorder(bobHeard), pushes: false)
        let bobEvents = EventLog(bob)
        for (name, member, delegate) in [("ann", ann, annDelegate), ("bob", bob, bobDelegate)] {
            member.requestJoinChannel(channelUUID: id, descriptor: ChannelDescriptor(name: "Ops"), credentials: fixture.credentials(try await fixture.token(name)))
            #expect(await delegate.wait(for: .didJoin(.developerRequest)))
        }
        #expect(await eventually { bob.roster.count == 2 })
        for burst in 1...2 {
            if burst == 2 { bob.setTonesMuted(true) }
            ann.requestBeginTransmitting(channelUUID: id)
            #expect(await annDelegate.wait(for: .didBegin(.developerRequest)))
            try await Task.sleep(for: .seconds(0.8))
            ann.stopTransmitting(channelUUID: id)
            #expect(await eventually { bobEvents.finishedBursts.count == burst })
            try await Task.sleep(for: .seconds(0.4))  // the tone's 80 ms, played out
        }
        await ann.invalidate()
        await bob.invalidate()
        func windows(_ path: String, _ frequency: Double) throws -> [Int] {
            TonePresence.windows(of: frequency, in: try WAVAudio.read(path: path).pipelineSamples(resampler: Resampler()))
        }
        let permit = try windows(annHeard, 1_200)
        #expect(permit.count >= 2, "the talk-permit tone twice, in \(permit.count) windows of Ann's output")
        let ends = try windows(bobHeard, 1_600)
        // 80 ms: four 20 ms windows, three or more whole; once, as the second burst's was muted.
        #expect(ends.count >= 2 && ends.count <= 5, "one end-of-burst tone in Bob's output: \(ends)")
        #expect(try windows(bobHeard, 1_200).isEmpty, "the talker's tone is the talker's")
        await fixture.stop()
    }
}
