import Audio
import ChannelProtocol
import Foundation
import NIOConcurrencyHelpers
@testable import PTTClient
import Testing

/// A sink whose writes fail after a few periods: stands in for a disk that fills up, which a test
/// can't make without mounting a small filesystem (root only).
final class FillingSink: AudioSink {
    let periods: Int
    var written = 0
    init(periods: Int) { self.periods = periods }
    func write(_ samples: UnsafeBufferPointer<Int16>) throws(AudioError) -> UInt64 {
        written += 1
        guard written <= periods else { throw .file(path: "full.wav", reason: "write failed: No space left on device") }
        return monotonicNanoseconds()
    }
    func finish() throws(AudioError) {}
}

/// The playout side's own drop counters, fed datagrams directly (the server can't be made to send
/// these: it relays at most 16 talkers at once and only well-formed audio).
@Suite struct ReceiverTests {
    @Test func datagramsItCannotPlayAreCountedInTheStatistics() async throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("receiver-\(UUID()).wav").path
        defer { try? FileManager.default.removeItem(atPath: path) }
        let receiver = Receiver(configuration: AudioConfiguration(makeOutput: { try WAVFileSink(path: path, pacer: RealTimePacer()) }),
                                onEvent: { _ in })
        receiver.start()
        func deliver(_ bytes: [UInt8]) { bytes.withUnsafeBytes { receiver.receive($0) } }
        let payload = [UInt8](repeating: 0xF8, count: 40)
        // One more talker than the receiver mixes: the last is dropped, the first still plays.
        for slot in 1...UInt16(Receiver.maxTracks + 1) {
            deliver(AudioHeader(slot: slot, burst: 1, sequence: 0).datagram(payload: payload))
        }
        deliver(AudioHeader(slot: 1, burst: 1, sequence: 1).datagram(payload: payload))
        deliver([AudioHeader.kind, 0, 0])  // shorter than a header
        deliver([0x7F] + AudioHeader(slot: 2, burst: 1, sequence: 1).datagram(payload: payload).dropFirst())  // not audio
        let figures = receiver.statistics
        // As many as squelchd may let talk at once are all mixed (it used to be 4, and a channel
        // allowing 6 lost two talkers unheard): only the one beyond is dropped.
        #expect(Receiver.maxTracks >= 6, "a channel letting 6 talk at once is heard whole")
        #expect(figures.tooManyTalkers == 1)
        #expect(figures.malformed == 2)
        #expect(figures.current?.received == 2, "the first talker's two packets were taken: \(String(describing: figures.current))")
        await receiver.stop()
    }

    /// A recording that can't be written any more says so, once, and stops: `walkie listen` used to
    /// print "saved" and exit 0 over a file cut off at the disk's end.
    @Test func anOutputThatFailsIsReportedAndPlaybackStops() async throws {
        let events = NIOLockedValueBox<[String]>([])
        let receiver = Receiver(configuration: AudioConfiguration(makeOutput: { FillingSink(periods: 5) }),
                                onEvent: { event in
                                    if case .outputFailed(let message) = event { events.withLockedValue { $0.append(message) } }
                                })
        receiver.start()
        let deadline = Date().addingTimeInterval(5)
        while events.withLockedValue({ $0.isEmpty }), Date() < deadline { try await Task.sleep(for: .milliseconds(20)) }
        try await Task.sleep(for: .milliseconds(200))
        let seen = events.withLockedValue { $0 }
        #expect(seen.count == 1, "\(seen)")
        #expect(seen.first?.contains("No space left on device") == true)
        #expect(!receiver.isPlaying, "playback stopped")
        await receiver.stop()
    }
}
