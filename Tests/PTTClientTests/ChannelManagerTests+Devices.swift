import Audio
import Foundation
import NIOConcurrencyHelpers
@testable import PTTClient
import SquelchTesting
import Testing

/// An audio device that can be unplugged: a stand-in for a USB headset, as this machine has no sound
/// card. Plugged in, it plays into a WAV file (a new one each time it is opened, paced in real time)
/// or captures a 440 Hz tone; unplugged, opening it fails as ALSA's open of a missing device does, and
/// a device open at that moment fails its next read or write as ALSA's do (-ENODEV).
final class UnpluggableDevice: Sendable {
    let directory: String
    let plugged = NIOLockedValueBox(true)
    let opened = NIOLockedValueBox(0)
    init(directory: String) { self.directory = directory }

    func file(_ number: Int) -> String { directory + "/headset-\(number).wav" }

    func makeOutput() throws -> any AudioSink {
        guard plugged.withLockedValue({ $0 }) else { throw AudioError.device(name: "headset", reason: "No such device") }
        let number = opened.withLockedValue { $0 += 1; return $0 }
        return Sink(device: self, file: try WAVFileSink(path: file(number), pacer: RealTimePacer()))
    }

    func makeInput() throws -> any AudioSource {
        guard plugged.withLockedValue({ $0 }) else { throw AudioError.device(name: "headset", reason: "No such device") }
        let tone = (0..<480_000).map { Int16(8_000 * sin(2 * .pi * 440 * Double($0) / 48_000)) }
        return Source(device: self, file: WAVFileSource(pipelineSamples: tone, pacer: RealTimePacer()))
    }

    final class Sink: AudioSink {
        let device: UnpluggableDevice
        let file: WAVFileSink
        init(device: UnpluggableDevice, file: WAVFileSink) { self.device = device; self.file = file }
        func write(_ samples: UnsafeBufferPointer<Int16>) throws(AudioError) -> UInt64 {
            guard device.plugged.withLockedValue({ $0 }) else { throw .deviceFailed(name: "headset", reason: "No such device") }
            return try file.write(samples)
        }
        func finish() throws(AudioError) { try file.finish() }
    }

    final class Source: AudioSource {
        let device: UnpluggableDevice
        let file: WAVFileSource
        init(device: UnpluggableDevice, file: WAVFileSource) { self.device = device; self.file = file }
        func read(into buffer: UnsafeMutableBufferPointer<Int16>) throws(AudioError) -> UInt64? {
            guard device.plugged.withLockedValue({ $0 }) else { throw .deviceFailed(name: "headset", reason: "No such device") }
            return try file.read(into: buffer)
        }
        func close() { file.close() }
    }
}

extension ChannelManagerTests {
    /// A headset pulled out and put back, at the listener and at the talker: each side says the device
    /// is lost, carries on meanwhile (the listener's bursts still come and go; the talker keeps the
    /// floor), and finds the device again within about a second of its return. Tested with a device
    /// that fails on purpose (`UnpluggableDevice`): there is no sound card here to unplug.
    @Test func aHeadsetUnpluggedAndPluggedBackIsFoundAgain() async throws {
        let fixture = try await ClientFixture(pushes: false)
        let id = fixture.channel.id
        let annHeadset = UnpluggableDevice(directory: fixture.directory + "/ann"), bobHeadset = UnpluggableDevice(directory: fixture.directory + "/bob")
        try FileManager.default.createDirectory(atPath: annHeadset.directory, withIntermediateDirectories: true)
        try FileManager.default.createDirectory(atPath: bobHeadset.directory, withIntermediateDirectories: true)
        var annAudio = AudioConfiguration(makeInput: { try annHeadset.makeInput() })
        annAudio.tones = .off
        var bobAudio = AudioConfiguration(makeOutput: { try bobHeadset.makeOutput() })
        bobAudio.tones = .off
        let annDelegate = RecordingDelegate(), bobDelegate = RecordingDelegate()
        let ann = try await manager(fixture, "dev-ann", annDelegate, audio: annAudio, pushes: false)
        let bob = try await manager(fixture, "dev-bob", bobDelegate, audio: bobAudio, pushes: false)
        let annEvents = EventLog(ann), bobEvents = EventLog(bob)
        for (name, member, delegate) in [("ann", ann, annDelegate), ("bob", bob, bobDelegate)] {
            member.requestJoinChannel(channelUUID: id, descriptor: ChannelDescriptor(name: "Ops"), credentials: fixture.credentials(try await fixture.token(name)))
            #expect(await delegate.wait(for: .didJoin(.developerRequest)))
        }
        #expect(await eventually { bob.roster.count == 2 })
        func talk(seconds: Double) async throws {
            ann.requestBeginTransmitting(channelUUID: id)
            #expect(await eventually { ann.isTransmitting })
            try await Task.sleep(for: .seconds(seconds))
            ann.stopTransmitting(channelUUID: id)
            #expect(await eventually { !ann.isTransmitting })
        }
        func heard(_ number: Int) throws -> Int {
            TonePresence.windows(of: 440, in: try WAVAudio.read(path: bobHeadset.file(number)).pipelineSamples(resampler: Resampler())).count
        }
        func lost(_ log: EventLog, output: Bool) -> Bool {
            log.all.contains { if case .outputDevice(.lost(let why)) = $0 { output && why.contains("headset") }
                               else if case .inputDevice(.lost(let why)) = $0 { !output && why.contains("headset") } else { false } }
        }

        // Bob's headset goes: he is told, and Ann's next burst still reaches him (its events), unheard.
        try await talk(seconds: 0.6)
        #expect(await eventually { bobEvents.finishedBursts.count == 1 })
        bobHeadset.plugged.withLockedValue { $0 = false }
        #expect(await eventually { lost(bobEvents, output: true) }, "\(bobEvents.all)")
        try await talk(seconds: 0.6)
        #expect(await eventually { bobEvents.finishedBursts.count == 2 }, "playout goes on without the device")
        #expect(bobHeadset.opened.withLockedValue { $0 } == 1, "the missing device was not opened")
        // Back: found again (the next burst is heard in it, below).
        bobHeadset.plugged.withLockedValue { $0 = true }
        #expect(await eventually(seconds: 5) { bobEvents.all.contains(.outputDevice(.restored)) }, "\(bobEvents.all)")

        // (A third grant is Ann's last for now: squelchd allows a member 3 at once.) Ann's headset is out when she presses: she holds the floor, is told, and once it is back
        // within the burst her voice goes out in it.
        annHeadset.plugged.withLockedValue { $0 = false }
        ann.requestBeginTransmitting(channelUUID: id)
        #expect(await eventually { lost(annEvents, output: false) }, "\(annEvents.all)")
        #expect(await eventually { ann.isTransmitting }, "the press holds the floor without a microphone: \(annDelegate.all)")
        try await Task.sleep(for: .seconds(0.5))
        annHeadset.plugged.withLockedValue { $0 = true }
        #expect(await eventually(seconds: 5) { annEvents.all.contains(.inputDevice(.restored)) }, "\(annEvents.all)")
        try await Task.sleep(for: .seconds(0.8))
        ann.stopTransmitting(channelUUID: id)
        #expect(await eventually { bobEvents.finishedBursts.count == 3 })
        try await Task.sleep(for: .seconds(0.3))
        await ann.invalidate()
        await bob.invalidate()
        let first = try heard(1), second = try heard(2)
        #expect(first >= 20, "the first burst in the first file: \(first) windows")
        #expect(second >= 25, "the third burst's second half in the second file: \(second) windows")
        #expect(bobHeadset.opened.withLockedValue { $0 } == 2)
        await fixture.stop()
    }
}
