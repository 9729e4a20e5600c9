import Audio
import ChannelProtocol
import Foundation
import JitterBuffer
import MediaFrames
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

/// A sink that takes every period at once and counts them: the playout loop runs as fast as it
/// can, and a test reads the period an event came in as its time.
final class CountingSink: AudioSink, Sendable {
    let periods = NIOLockedValueBox(0)
    func write(_ samples: UnsafeBufferPointer<Int16>) throws(AudioError) -> UInt64 {
        periods.withLockedValue { $0 += 1 }
        return monotonicNanoseconds()
    }
    func finish() throws(AudioError) {}
}

extension Receiver {
    /// `header` and `payload` as the relay would deliver them: sealed by the talker with a key of
    /// the burst's, which the receiver is given first (as the server does, before a burst's audio).
    func receiveSealed(_ header: AudioHeader, payload: [UInt8]) {
        let key = MediaKey(slot: header.slot, burst: header.burst, keyID: UInt64(header.slot) << 16 | UInt64(header.burst),
                           key: [UInt8](repeating: UInt8(truncatingIfNeeded: header.slot), count: MediaKey.keyLength))
        addMediaKey(key)
        var datagram = [UInt8](repeating: 0, count: AudioHeader.size + AudioHeader.maxPayload)
        let talkerHeader = AudioHeader(flags: header.flags.intersection(.endOfBurst), burst: header.burst, sequence: header.sequence)
        let length = datagram.withUnsafeMutableBytes { out in
            payload.withUnsafeBytes { MediaSealer(counter: UInt64(header.sequence)).seal(talkerHeader, payload: $0, key: key, into: out) }
        }
        // What the relay sets: the talker's slot, the catch-up flag.
        datagram.withUnsafeMutableBytes { header.write(to: $0) }
        datagram.withUnsafeBytes { receive(UnsafeRawBufferPointer(rebasing: $0[..<length!])) }
    }
}

/// A receiver playing into a `CountingSink`, fed datagrams before playout starts, and its events
/// with the period each came in.
struct PlayoutProbe {
    let sink = CountingSink()
    let events = NIOLockedValueBox<[(period: Int, event: Receiver.ReceiverEvent)]>([])
    let receiver: Receiver

    init() {
        let sink = self.sink, events = self.events
        receiver = Receiver(configuration: AudioConfiguration(makeOutput: { sink }), onEvent: { event in
            let period = sink.periods.withLockedValue { $0 }
            events.withLockedValue { $0.append((period, event)) }
        })
        receiver.arm()
    }

    func deliver(slot: UInt16, burst: UInt16, sequence: UInt16, flags: AudioHeader.Flags = []) {
        receiver.receiveSealed(AudioHeader(flags: flags, slot: slot, burst: burst, sequence: sequence), payload: [UInt8](repeating: 0xF8, count: 40))
    }

    /// Plays what was delivered until `bursts` bursts have finished (10 s at most); the events.
    func play(untilFinished bursts: Int) async throws -> [(period: Int, event: Receiver.ReceiverEvent)] {
        receiver.start()
        let deadline = Date().addingTimeInterval(10)
        while events.withLockedValue({ $0.filter { if case .burstFinished = $0.event { true } else { false } }.count }) < bursts, Date() < deadline {
            try await Task.sleep(for: .milliseconds(10))
        }
        await receiver.stop()
        return events.withLockedValue { $0 }
    }
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
            receiver.receiveSealed(AudioHeader(slot: slot, burst: 1, sequence: 0), payload: payload)
        }
        receiver.receiveSealed(AudioHeader(slot: 1, burst: 1, sequence: 1), payload: payload)
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

    /// A listener catching up on a burst that had ended (a phone its push woke hears the burst
    /// it missed) while two members of a full-duplex channel begin to talk together: it hears the
    /// missed burst first, then the two together, each whole from its first frame. Talkers who
    /// began one after the other (the second after the first had ended) are still heard one after
    /// the other. Before, every new talker queued behind the replay on its one track: the two were
    /// heard one after the other, and a burst whose later packets found a free track was split.
    @Test func talkersWhoBeganTogetherWhileAListenerCaughtUpAreHeardTogether() async throws {
        let probe = PlayoutProbe()
        // The missed burst, replayed whole: 25 frames and its end.
        for sequence in 0..<UInt16(25) { probe.deliver(slot: 1, burst: 10, sequence: sequence, flags: .catchUp) }
        probe.deliver(slot: 1, burst: 10, sequence: 25, flags: [.catchUp, .endOfBurst])
        // Two live talkers at once, their packets interleaved; then a third who begins after both ended.
        for sequence in 0..<UInt16(20) {
            probe.deliver(slot: 2, burst: 11, sequence: sequence)
            probe.deliver(slot: 3, burst: 12, sequence: sequence)
        }
        probe.deliver(slot: 2, burst: 11, sequence: 20, flags: .endOfBurst)
        probe.deliver(slot: 3, burst: 12, sequence: 20, flags: .endOfBurst)
        for sequence in 0..<UInt16(10) { probe.deliver(slot: 4, burst: 13, sequence: sequence) }
        probe.deliver(slot: 4, burst: 13, sequence: 10, flags: .endOfBurst)
        let events = try await probe.play(untilFinished: 4)

        var starts: [UInt16: Int] = [:], finishes: [UInt16: (period: Int, statistics: BurstStatistics)] = [:]
        var startCounts: [UInt16: Int] = [:]
        for (period, event) in events {
            switch event {
            case .burstStarted(let slot, _, _):
                starts[slot] = period
                startCounts[slot, default: 0] += 1
            case .burstFinished(let statistics): finishes[statistics.slot] = (period, statistics)
            default: break
            }
        }
        for slot in [UInt16(1), 2, 3, 4] {
            #expect(startCounts[slot] == 1, "talker \(slot)'s burst started once: \(startCounts)")
        }
        guard let missed = finishes[1], let second = starts[2], let third = starts[3], let fourth = starts[4],
              let secondEnd = finishes[2], let thirdEnd = finishes[3] else {
            Issue.record("not every burst started and finished: starts \(starts), finishes \(finishes.keys.sorted())")
            return
        }
        // Each period is 10 ms; a frame 20 ms, two periods. Events are read a tick late at most.
        #expect(second >= missed.period - 2, "the missed burst is heard first: it ended at \(missed.period), talker 2 began at \(second)")
        #expect(abs(second - third) <= 2, "the two who talked together are heard together: periods \(second) and \(third)")
        #expect(fourth >= max(secondEnd.period, thirdEnd.period) - 2,
                "the talker who began after them is heard after them: \(fourth) against \(secondEnd.period), \(thirdEnd.period)")
        for slot in [UInt16(2), 3] {
            #expect(finishes[slot]?.statistics.played == 21, "talker \(slot)'s burst was played whole: \(String(describing: finishes[slot]?.statistics))")
        }
    }

    /// A phone its push woke missed Ann, then Bob, then Ann again; squelchd replays the three back
    /// to back, far faster than they were said. They play in that order, one after the other: Ann's
    /// second burst must not start on her track (and over Bob) as soon as her first one ends.
    @Test func missedBurstsReplayedBackToBackPlayInTheirOrder() async throws {
        let probe = PlayoutProbe()
        func replay(slot: UInt16, burst: UInt16, frames: UInt16) {
            for sequence in 0...frames {
                probe.deliver(slot: slot, burst: burst, sequence: sequence, flags: sequence == frames ? [.catchUp, .endOfBurst] : .catchUp)
            }
        }
        replay(slot: 1, burst: 20, frames: 15)
        replay(slot: 2, burst: 21, frames: 10)
        replay(slot: 1, burst: 22, frames: 10)
        let events = try await probe.play(untilFinished: 3)
        var starts: [UInt16: Int] = [:], ends: [UInt16: Int] = [:]
        for (period, event) in events {
            switch event {
            case .burstStarted(_, let burst, _): starts[burst] = period
            case .burstFinished(let statistics): ends[statistics.burst] = period
            default: break
            }
        }
        guard let first = ends[20], let bob = starts[21], let bobEnd = ends[21], let second = starts[22] else {
            Issue.record("not every burst started and finished: starts \(starts), ends \(ends)")
            return
        }
        #expect(bob >= first - 2, "Bob after Ann's first: \(bob) against \(first)")
        #expect(second >= bobEnd - 2, "Ann's second after Bob: \(second) against \(bobEnd)")
    }
}
