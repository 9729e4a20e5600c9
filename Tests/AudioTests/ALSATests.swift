import Testing
@testable import Audio

/// This machine has no sound card (no /dev/snd), so these tests use what ALSA offers without one: the
/// `null` plugin, which accepts any configuration but is not paced, and nonexistent device names.
/// Real capture and playback timing can't be exercised here.
@Suite struct ALSATests {
    @Test func openingAMissingDeviceGivesAClearError() throws {
        let error = #expect(throws: AudioError.self) { try ALSAPlayback(device: "hw:CARD=NoSuchCard,DEV=0") }
        let message = String(describing: try #require(error))
        #expect(message.contains("hw:CARD=NoSuchCard,DEV=0"))
        #expect(message.contains("walkie devices"))
        #expect(throws: AudioError.self) { try ALSACapture(device: "nonexistent_pcm_name") }
    }

    @Test func nullDeviceNegotiatesThePipelineFormat() throws {
        let playback = try ALSAPlayback(device: "null")
        #expect(playback.negotiated.sampleRate == 48_000)
        #expect(playback.negotiated.periodFrames == 480)
        #expect(playback.negotiated.bufferFrames == 1_920)
        let samples = [Int16](repeating: 1_000, count: 480)
        for _ in 0..<20 { try samples.withUnsafeBufferPointer { _ = try playback.write($0) } }
        try playback.finish()

        let capture = try ALSACapture(device: "null")
        var buffer = [Int16](repeating: 0, count: 480)
        let stamp = try buffer.withUnsafeMutableBufferPointer { try capture.read(into: $0) }
        #expect(stamp != nil)
        capture.close()
    }

    @Test func deviceListIncludesTheNullDevice() {
        let devices = ALSA.devices()
        #expect(devices.contains { $0.name == "null" && $0.canPlay && $0.canCapture })
    }
}
