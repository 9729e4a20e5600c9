import JitterBuffer
import SeededRandom
import Testing

// Seeded arrival patterns through the buffer, with a playout loop ticking every 20 ms as the audio
// output would. Everything is deterministic: the same seed gives the same decisions.

let ms: UInt64 = 1_000_000

/// One packet on the way: when it arrives and what it is.
struct Arrival {
    var at: UInt64
    var sequence: UInt16
    var end = false
    var catchUp = false
    var slot: UInt16 = 1
    var burst: UInt16 = 7
    var payload: [UInt8] { end ? [] : [UInt8(truncatingIfNeeded: sequence), 0xAB] }
}

/// What the playout loop saw, tick by tick.
struct Run {
    var decisions: [PlayoutDecision] = []
    var played: [UInt16] = []
    var fec: [UInt16] = []
    var firstPlayAt: UInt64?
    var ended: (BurstStatistics, BurstEndReason)?
    var endings: [(BurstStatistics, BurstEndReason)] = []
    var outcomes: [ArrivalOutcome] = []
    var conceal: Int { decisions.filter { $0 == .conceal }.count }
    var silence: Int { decisions.filter { $0 == .silence }.count }
}

/// Feeds `arrivals` (any order) and ticks playout every 20 ms from `start` until `until`.
func simulate(_ buffer: inout JitterBuffer, _ arrivals: [Arrival], start: UInt64 = 0, until: UInt64) -> Run {
    var run = Run()
    let sorted = arrivals.enumerated().sorted { ($0.element.at, $0.offset) < ($1.element.at, $1.offset) }.map(\.element)
    var next = 0
    var tick = start
    while tick <= until {
        while next < sorted.count && sorted[next].at <= tick {
            let a = sorted[next]
            let outcome = a.payload.withUnsafeBytes {
                buffer.insert(slot: a.slot, burst: a.burst, sequence: a.sequence, endOfBurst: a.end, catchUp: a.catchUp, payload: $0, now: a.at)
            }
            run.outcomes.append(outcome)
            next += 1
        }
        let decision = buffer.nextFrame(now: tick)
        run.decisions.append(decision)
        switch decision {
        case .play(let frame):
            if run.firstPlayAt == nil { run.firstPlayAt = tick }
            let first = buffer.withPayload(of: frame) { $0.first }
            #expect(first == UInt8(truncatingIfNeeded: frame.sequence), "payload matches its sequence")
            run.played.append(frame.sequence)
        case .recoverWithFEC(let next): run.fec.append(next.sequence &- 1)
        case .ended(let stats, let reason):
            run.ended = (stats, reason)
            run.endings.append((stats, reason))
        default: break
        }
        tick += 20 * ms
    }
    return run
}

/// A talker's burst: frame i sent at `start + i·20 ms`, arriving after `delay(i)`; END three times.
func burst(frames: Int, start: UInt64 = 0, burst: UInt16 = 7, slot: UInt16 = 1, firstSequence: UInt16 = 0,
           delay: (Int) -> UInt64? = { _ in 10 * ms }) -> [Arrival] {
    var out: [Arrival] = []
    for i in 0..<frames {
        guard let d = delay(i) else { continue }
        out.append(Arrival(at: start + UInt64(i) * 20 * ms + d, sequence: firstSequence &+ UInt16(i), slot: slot, burst: burst))
    }
    let endAt = start + UInt64(frames) * 20 * ms + 10 * ms
    for k in 0..<3 { out.append(Arrival(at: endAt + UInt64(k) * ms, sequence: firstSequence &+ UInt16(frames), end: true, slot: slot, burst: burst)) }
    return out
}

@Suite struct JitterBufferTests {
    @Test func aCleanLinkPlaysEveryFrameOnceInOrderAfterTheInitialTarget() {
        var buffer = JitterBuffer()
        let run = simulate(&buffer, burst(frames: 100), until: 3_000 * ms)
        #expect(run.played == (0..<100).map { UInt16($0) })
        #expect(run.conceal == 0 && run.fec.isEmpty)
        // First packet at 10 ms + 60 ms target → the first tick at or after 70 ms.
        #expect(run.firstPlayAt == 80 * ms)
        let (stats, reason) = try! #require(run.ended)
        #expect(reason == .endOfBurst)
        #expect(stats.duplicates == 2, "the end marker's repeats")
        #expect(stats.received == 100 && stats.played == 100 && stats.lost == 0)
        #expect(run.endings.count == 1)
    }

    @Test func tenPercentLossIsRecoveredWithFECOrConcealedAndTheCountsAddUp() {
        var rng = SplitMix64(seed: 42)
        var lostSet = Set<Int>()
        for i in 0..<200 where Double(rng.next() % 1000) < 100 { lostSet.insert(i) }
        var buffer = JitterBuffer()
        let run = simulate(&buffer, burst(frames: 200, delay: { lostSet.contains($0) ? nil : 10 * ms }), until: 6_000 * ms)
        let (stats, reason) = try! #require(run.ended)
        #expect(reason == .endOfBurst)
        #expect(!lostSet.isEmpty)
        #expect(run.played.count == 200 - lostSet.count)
        #expect(Set(run.fec.map { Int($0) }).isSubset(of: lostSet))
        // Two or three losses in a row empty a 60 ms buffer: the buffer can't tell that from lateness, so
        // it waits a frame (an underrun) before it gives the frame up.
        #expect(run.fec.count + run.conceal == lostSet.count + stats.underruns)
        // A lost frame whose successor arrived is always FEC-recovered.
        let recoverable = lostSet.filter { !lostSet.contains($0 + 1) && $0 + 1 < 200 }
        #expect(Set(run.fec.map { Int($0) }) == recoverable)
        #expect(stats.played + stats.fecRecovered + stats.concealed - stats.underruns == 200)
        #expect(stats.lost == lostSet.count)
        // What a listener is told it heard: the burst's 200 frames, its underruns' waiting not among them.
        #expect(stats.framesDue == 200 && stats.underruns > 0)
    }

    @Test func neighboursSwappedWithinTheTargetAllPlayInOrder() {
        var buffer = JitterBuffer()
        let arrivals = burst(frames: 100, delay: { $0 % 2 == 0 ? 35 * ms : 10 * ms })
        let run = simulate(&buffer, arrivals, until: 3_000 * ms)
        #expect(run.played == (0..<100).map { UInt16($0) })
        #expect(run.conceal == 0)
    }

    @Test func duplicatesAreCountedAndPlayedOnce() {
        var buffer = JitterBuffer()
        let once = burst(frames: 50)
        let run = simulate(&buffer, once + once.filter { !$0.end }.map { var a = $0; a.at += 3 * ms; return a }, until: 2_000 * ms)
        #expect(run.played == (0..<50).map { UInt16($0) })
        #expect(run.ended?.0.duplicates == 52)
    }

    @Test func aDelaySpikeGrowsTheBufferWithinTheBurstAndTheNextTargetThenCalmsDown() {
        var buffer = JitterBuffer()
        // A 200 ms stall from frame 120: those packets pile up and arrive together.
        let spike = burst(frames: 150, delay: { i in
            let sent = UInt64(i) * 20 * ms
            let stallStart: UInt64 = 120 * 20 * ms
            if sent >= stallStart && sent < stallStart + 200 * ms { return stallStart + 200 * ms - sent + 10 * ms }
            return 10 * ms
        })
        let run = simulate(&buffer, spike, until: 5_000 * ms)
        let (stats, _) = try! #require(run.ended)
        #expect(run.conceal > 0, "the stall underran the buffer")
        #expect(stats.targetDelayMilliseconds > 60, "it grew within the burst")
        #expect(stats.underruns > 0)
        #expect(stats.played + stats.fecRecovered + stats.concealed - stats.underruns == 150)
        #expect(stats.framesDue == 150)
        let afterSpike = buffer.currentTargetMilliseconds
        #expect(afterSpike > 60, "the next burst starts with more room: \(afterSpike)")
        // Calm bursts bring it back down to the minimum.
        var start: UInt64 = 6_000 * ms
        for k in 0..<8 {
            _ = simulate(&buffer, burst(frames: 100, start: start, burst: UInt16(100 + k)), start: start, until: start + 2_500 * ms)
            start += 3_000 * ms
        }
        #expect(buffer.currentTargetMilliseconds == 40)
    }

    @Test func aCatchUpBurstPlaysFromItsFirstFrameWithNothingSkipped() {
        var buffer = JitterBuffer()
        // 5 s of speech: the first 3 s (150 frames) replayed within 50 ms, the rest live from t = 3 s.
        var arrivals: [Arrival] = []
        for i in 0..<150 { arrivals.append(Arrival(at: UInt64(i) * ms / 3, sequence: UInt16(i), catchUp: true)) }
        for i in 150..<250 { arrivals.append(Arrival(at: UInt64(i - 150) * 20 * ms + 50 * ms, sequence: UInt16(i))) }
        for k in 0..<3 { arrivals.append(Arrival(at: 100 * 20 * ms + 60 * ms + UInt64(k) * ms, sequence: 250, end: true)) }
        let run = simulate(&buffer, arrivals, until: 8_000 * ms)
        #expect(run.played == (0..<250).map { UInt16($0) })
        #expect(run.firstPlayAt == 0, "catch-up starts at once")
        let (stats, reason) = try! #require(run.ended)
        #expect(reason == .endOfBurst && stats.lost == 0 && stats.resyncs == 0 && stats.catchUpFrames == 150)
        #expect(!run.outcomes.contains(.backlogFull) && !run.outcomes.contains(.resynced))
    }

    /// A listener replaying one burst when the next begins (its talker started while the listener
    /// was still behind) plays the first whole, then the second from its first frame.
    @Test func aBurstArrivingDuringACatchUpWaitsItsTurnInsteadOfCuttingIt() throws {
        var buffer = JitterBuffer()
        // Burst 7 of slot 1: 100 frames replayed within 400 ms, with its end; burst 3 of slot 2 live
        // from 300 ms, while the first still has over a second to play.
        var arrivals: [Arrival] = []
        for i in 0..<100 { arrivals.append(Arrival(at: UInt64(i) * 4 * ms, sequence: UInt16(i), catchUp: true)) }
        arrivals.append(Arrival(at: 400 * ms, sequence: 100, end: true, catchUp: true))
        arrivals += burst(frames: 50, start: 300 * ms, burst: 3, slot: 2)
        let run = simulate(&buffer, arrivals, until: 6_000 * ms)
        #expect(run.outcomes.filter { $0 == .deferred }.count > 0)
        #expect(run.played == (0..<100).map { UInt16($0) } + (0..<50).map { UInt16($0) }, "\(run.played)")
        try #require(run.endings.count == 2)
        let (first, firstReason) = run.endings[0], (second, secondReason) = run.endings[1]
        #expect(first.slot == 1 && firstReason == .endOfBurst && first.played == 100 && first.lost == 0)
        #expect(second.slot == 2 && secondReason == .endOfBurst && second.played == 50 && second.lost == 0)
        // A live listener still switches to a new burst at once.
        var live = JitterBuffer()
        let switched = simulate(&live, burst(frames: 50) + burst(frames: 20, start: 300 * ms, burst: 3, slot: 2), until: 3_000 * ms)
        #expect(switched.endings.first?.1 == .superseded)
        #expect(!switched.outcomes.contains(.deferred))
    }

    @Test func aCatchUpBurstWithoutItsEndPlaysWhatItHasBeforeTimingOut() {
        var buffer = JitterBuffer()
        // 100 frames replayed within 100 ms and no end marker (all three were lost upstream): 2 s of
        // audio that must not be cut one second after the last arrival.
        let arrivals = (0..<100).map { Arrival(at: UInt64($0) * ms, sequence: UInt16($0), catchUp: true) }
        let run = simulate(&buffer, arrivals, until: 5_000 * ms)
        #expect(run.played == (0..<100).map { UInt16($0) })
        #expect(run.ended?.1 == .timeout)
    }

    /// A catch-up burst that stopped arriving with a stray frame far ahead skips the gap after the
    /// timeout instead of playing silence through it while the next burst waits.
    @Test func aCatchUpBurstSkipsAGapToAStrayFrameOnceNothingMoreArrives() throws {
        var buffer = JitterBuffer()
        var arrivals = (0..<20).map { Arrival(at: UInt64($0) * ms, sequence: UInt16($0), catchUp: true) }
        arrivals.append(Arrival(at: 20 * ms, sequence: 1_000, catchUp: true))
        arrivals += burst(frames: 50, start: 100 * ms, burst: 3, slot: 2)
        let run = simulate(&buffer, arrivals, until: 6_000 * ms)
        #expect(run.played == (0..<20).map { UInt16($0) } + [1_000] + (0..<50).map { UInt16($0) }, "\(run.played.count)")
        try #require(run.endings.count == 2)
        #expect(run.endings[0].1 == .timeout && run.endings[0].0.lost == 980)
        #expect(run.endings[1].0.slot == 2 && run.endings[1].0.played == 50)
    }

    /// The receiver asks every buffer whether a burst ended there, so that its repeated end markers
    /// don't start it again on another; leaving a channel forgets (burst numbers start again).
    @Test func aFinishedBurstIsKnownUntilReset() {
        var buffer = JitterBuffer()
        #expect(!buffer.hasFinished(slot: 1, burst: 7))
        let run = simulate(&buffer, burst(frames: 10), until: 1_000 * ms)
        #expect(run.ended?.1 == .endOfBurst)
        #expect(buffer.hasFinished(slot: 1, burst: 7) && !buffer.hasFinished(slot: 2, burst: 7) && !buffer.hasFinished(slot: 1, burst: 8))
        buffer.reset()
        #expect(!buffer.hasFinished(slot: 1, burst: 7))
    }

    @Test func aLiveBurstFarBehindResyncs() {
        var buffer = JitterBuffer()
        // Frames 0-4 normal, then 45-60 arrive at once: more than the 32-frame window ahead of playout.
        var arrivals = burst(frames: 5).filter { !$0.end }
        for i in 45...60 { arrivals.append(Arrival(at: 120 * ms, sequence: UInt16(i))) }
        let run = simulate(&buffer, arrivals, until: 3_500 * ms)
        #expect(run.outcomes.contains(.resynced))
        let stats = try! #require(run.ended?.0)
        #expect(stats.resyncs == 1)
        #expect(Array(run.played.suffix(16)) == (45...60).map { UInt16($0) })
        #expect(stats.lost >= 40 - 32, "the skipped frames count as lost")
    }

    @Test func packetsThatStopWithoutAnEndTimeOutAfterSilence() {
        var buffer = JitterBuffer()
        let arrivals = burst(frames: 30).filter { !$0.end }
        let run = simulate(&buffer, arrivals, until: 3_000 * ms)
        let (_, reason) = try! #require(run.ended)
        #expect(reason == .timeout)
        #expect(run.silence > 0, "after 10 misses in a row, silence instead of concealment")
        let firstSilence = run.decisions.firstIndex(of: .silence)!
        let concealBefore = run.decisions[..<firstSilence].filter { $0 == .conceal }.count
        #expect(concealBefore >= 10)
    }

    @Test func framesAfterTheLastOneReceivedAreNotCountedAsLost() {
        // 30 frames, no end marker (all three copies lost): playout conceals until the timeout, but no
        // frame after the 30th ever existed.
        var buffer = JitterBuffer()
        let run = simulate(&buffer, burst(frames: 30).filter { !$0.end }, until: 3_000 * ms)
        let (stats, reason) = try! #require(run.ended)
        #expect(reason == .timeout)
        #expect(stats.played == 30 && stats.lost == 0, "\(stats)")
        // A gap inside the burst is still loss.
        var gappy = JitterBuffer()
        let gap = simulate(&gappy, burst(frames: 30, delay: { (10..<13).contains($0) ? nil : 10 * ms }), until: 3_000 * ms)
        #expect(gap.ended?.0.lost == 3)
    }

    @Test func anotherTalkerSupersedesAnUnfinishedBurst() {
        var buffer = JitterBuffer()
        let first = burst(frames: 20, slot: 1).filter { !$0.end }
        let second = burst(frames: 20, start: 200 * ms, burst: 9, slot: 2)
        let run = simulate(&buffer, first + second, until: 2_000 * ms)
        #expect(run.endings.map(\.1) == [.superseded, .endOfBurst])
        #expect(run.endings.map(\.0.slot) == [1, 2])
        // Straggling end markers of a finished burst don't start it again.
        let late = [UInt8]().withUnsafeBytes { buffer.insert(slot: 2, burst: 9, sequence: 20, endOfBurst: true, catchUp: false, payload: $0, now: 3_000 * ms) }
        #expect(late == .late)
    }

    /// A burst's later packets belong where its first ones went: the buffer says it holds a burst
    /// it plays, and one whose packets wait behind the catch-up it plays, until it is reset.
    @Test func itSaysWhichBurstsItHolds() {
        var buffer = JitterBuffer()
        let frame = [UInt8](repeating: 0xF8, count: 40)
        func insert(slot: UInt16, burst: UInt16, sequence: UInt16, catchUp: Bool) -> ArrivalOutcome {
            frame.withUnsafeBytes { buffer.insert(slot: slot, burst: burst, sequence: sequence, endOfBurst: false, catchUp: catchUp, payload: $0, now: 0) }
        }
        #expect(insert(slot: 1, burst: 5, sequence: 0, catchUp: true) == .newBurst)
        #expect(insert(slot: 2, burst: 6, sequence: 0, catchUp: false) == .deferred)
        #expect(buffer.holds(slot: 1, burst: 5) && buffer.holds(slot: 2, burst: 6))
        #expect(!buffer.holds(slot: 2, burst: 7) && !buffer.holds(slot: 3, burst: 6))
        buffer.reset()
        #expect(!buffer.holds(slot: 1, burst: 5) && !buffer.holds(slot: 2, burst: 6))
    }

    /// A listener that stops playing for a while (an overloaded or stalled machine) skips ahead to
    /// live speech when it resumes, and says so: the frames it received but dropped are counted as
    /// skipped, not lost and not left out, so the burst's frames still add up to what was sent.
    @Test func framesDroppedToCatchUpWithLiveSpeechAreCountedAsSkipped() {
        var buffer = JitterBuffer()
        let frame = [UInt8](repeating: 0xF8, count: 40)
        for sequence in 0..<UInt16(100) {
            _ = frame.withUnsafeBytes { buffer.insert(slot: 1, burst: 3, sequence: sequence, endOfBurst: false, catchUp: false, payload: $0, now: 0) }
        }
        _ = [UInt8]().withUnsafeBytes { buffer.insert(slot: 1, burst: 3, sequence: 100, endOfBurst: true, catchUp: false, payload: $0, now: 0) }
        var ended: BurstStatistics?
        for tick in 0..<400 where ended == nil {
            if case .ended(let statistics, _) = buffer.nextFrame(now: 1_000 * ms + UInt64(tick) * 20 * ms) { ended = statistics }
        }
        guard let statistics = ended else {
            Issue.record("the burst never ended")
            return
        }
        #expect(statistics.lost == 0, "every frame arrived: \(statistics)")
        #expect(statistics.skipped > 0 && statistics.framesDue == 100, "\(statistics)")
        #expect(statistics.played + statistics.skipped == 100)
    }

    @Test func sequenceNumbersWrapAround() {
        var buffer = JitterBuffer()
        let run = simulate(&buffer, burst(frames: 40, firstSequence: 65_520), until: 2_000 * ms)
        #expect(run.played == (0..<40).map { UInt16(truncatingIfNeeded: 65_520 + $0) })
        #expect(run.ended?.1 == .endOfBurst)
    }

    @Test func oversizedPayloadsAreRefused() {
        var buffer = JitterBuffer()
        let big = [UInt8](repeating: 1, count: 1_101)
        let outcome = big.withUnsafeBytes { buffer.insert(slot: 1, burst: 1, sequence: 0, endOfBurst: false, catchUp: false, payload: $0, now: 0) }
        #expect(outcome == .malformed)
        #expect(buffer.nextFrame(now: 0) == .idle)
    }
}

@Suite struct ReceptionLossMeterTests {
    /// Plays `arrivals` through a buffer and feeds the meter each tick, as the receiver does.
    func measure(_ meter: inout ReceptionLossMeter, _ buffer: inout JitterBuffer, _ arrivals: [Arrival], until: UInt64) -> [Int] {
        var reports: [Int] = []
        let sorted = arrivals.sorted { $0.at < $1.at }
        var next = 0
        var tick: UInt64 = 0
        while tick <= until {
            while next < sorted.count && sorted[next].at <= tick {
                let a = sorted[next]
                _ = a.payload.withUnsafeBytes {
                    buffer.insert(slot: a.slot, burst: a.burst, sequence: a.sequence, endOfBurst: a.end, catchUp: false, payload: $0, now: a.at)
                }
                next += 1
            }
            let report: Int?
            if case .ended(let statistics, _) = buffer.nextFrame(now: tick) {
                report = meter.observe(track: 0, statistics, ended: true)
            } else {
                report = meter.observe(track: 0, buffer.current)
            }
            if let report { reports.append(report) }
            tick += 20 * ms
        }
        return reports
    }

    @Test func eachWindowReportsTheShareOfItsFramesThatNeverArrived() {
        var rng = SplitMix64(seed: 7)
        var lostSet = Set<Int>()
        for i in 0..<300 where rng.next() % 10 == 0 { lostSet.insert(i) }
        var buffer = JitterBuffer()
        var meter = ReceptionLossMeter(tracks: 1, windowFrames: 100, firstWindowFrames: 100)
        let reports = measure(&meter, &buffer, burst(frames: 300, delay: { lostSet.contains($0) ? nil : 10 * ms }), until: 8_000 * ms)
        // Frames fall due in sequence order, so window k is frames 100k ..< 100k + 100.
        let expected = (0..<3).map { k in lostSet.filter { (k * 100 ..< k * 100 + 100).contains($0) }.count }
        #expect(expected.contains { $0 > 0 })
        #expect(reports == expected)
    }

    @Test func windowsSpanBurstsAndACleanLinkReportsZero() {
        var buffer = JitterBuffer()
        var meter = ReceptionLossMeter(tracks: 1, windowFrames: 100, firstWindowFrames: 100)
        // 60 frames with 6 lost, then a second burst of 60 clean ones: the first window (100 frames
        // due) holds all 6 losses, whichever burst its frames came from.
        var arrivals = burst(frames: 60, burst: 1, delay: { $0 % 10 == 5 ? nil : 10 * ms })
        arrivals += burst(frames: 60, start: 2_000 * ms, burst: 2)
        #expect(measure(&meter, &buffer, arrivals, until: 4_000 * ms) == [6])
        // The first window is shorter, so a bad link is reported within a second or so.
        var clean = ReceptionLossMeter(tracks: 1, windowFrames: 100, firstWindowFrames: 50)
        var other = JitterBuffer()
        #expect(measure(&clean, &other, burst(frames: 250, delay: { $0 == 10 ? nil : 10 * ms }), until: 6_000 * ms) == [2, 0, 0])
    }
}

extension ReceptionLossMeterTests {
    @Test func aBurstReplayedToALateJoinerIsLeftOut() {
        var meter = ReceptionLossMeter(tracks: 2, windowFrames: 10, firstWindowFrames: 10)
        var replay = BurstStatistics(slot: 1, burst: 1)
        replay.catchUpFrames = 30
        replay.played = 20
        replay.lost = 40  // a gap skipped at once: the replay's, not the link's
        #expect(meter.observe(track: 0, replay) == nil)
        #expect(meter.observe(track: 0, replay, ended: true) == nil)
        var live = BurstStatistics(slot: 2, burst: 1)
        live.played = 9
        live.lost = 1
        #expect(meter.observe(track: 1, live) == 10, "only the live burst's 10 frames count")
    }
}
