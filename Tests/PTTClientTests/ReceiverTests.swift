import Audio
import ChannelProtocol
import Foundation
@testable import PTTClient
import Testing

/// The playout side's own drop counters, fed datagrams directly (the server can't be made to send
/// these: it relays at most four talkers by default and only well-formed audio).
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
        #expect(figures.tooManyTalkers == 1)
        #expect(figures.malformed == 2)
        #expect(figures.current?.received == 2, "the first talker's two packets were taken: \(String(describing: figures.current))")
        await receiver.stop()
    }
}
