import ChannelProtocol
import ChannelStore
import Foundation
import Testing
import Wire
@testable import ChannelHub

/// Late-join catch-up: bursts replayed from their first packet, and bursts kept for members who missed them.
@Suite struct HubCatchUpTests {
    @Test func lateJoinerGetsTheBurstFromItsFirstPacketThenLive() {
        let h = Harness()
        let ann = h.join("ann"), bob = h.join("bob")
        h.send(.floorRequest(), from: ann.link)
        let burst = h.grantedBurst(ann.link)!
        for sequence in 0..<40 { h.audio(from: ann.link, burst: burst, sequence: UInt16(sequence), payload: [UInt8(sequence)]) }
        let late = h.join("late")
        guard case .joined(_, _, _, let talkers, _)? = h.joinedMessage(to: late.link) else { Issue.record("no joined"); return }
        #expect(talkers == [Talker(slot: ann.slot, burst: burst)])
        // Live packets while catching up go into the recording, not straight to the late joiner.
        h.audio(from: ann.link, burst: burst, sequence: 40, payload: [40])
        #expect(h.audio(to: late.link).isEmpty)
        h.advance(0)  // the first catch-up batch is due at once
        #expect(h.audio(to: late.link).count == 25)
        for _ in 0..<3 { h.advance(10 * ms) }
        h.audio(from: ann.link, burst: burst, sequence: 41, payload: [41])
        let got = h.audio(to: late.link)
        #expect(got.map(\.header.sequence) == (0...41).map { UInt16($0) })
        #expect(got.prefix(41).allSatisfy { $0.header.flags.contains(.catchUp) })
        #expect(!got.last!.header.flags.contains(.catchUp))
        #expect(got.map(\.payload) == (0...41).map { [UInt8($0)] })
        #expect(h.audio(to: bob.link).count == 42)
        // Catch-up has counters of its own; the live ones count the relay alone.
        let size = AudioHeader.size + Harness.frame([0], keyID: h.keyID(ann.link, burst: burst)).count
        #expect(h.hub.counters.catchUpPacketsOut == 41 && h.hub.counters.catchUpBytesOut == 41 * size)
        #expect(h.hub.counters.packetsOut == 42 + 1 && h.hub.counters.bytesOut == 43 * size)
    }

    /// A member that joined with an entry pass gets no audio while its handshake is unfinished (the
    /// transport could deliver none); then the bursts going on, from their first packet, whether
    /// they began before its join or after it.
    @Test(arguments: [true, false]) func aMemberThatEnteredWithAPassGetsTheBurstOnceItsHandshakeIsDone(_ burstBeforeJoin: Bool) {
        let h = Harness()
        let ann = h.join("ann"), bob = h.join("bob")
        var burst: UInt16 = 0
        func speak(_ sequences: Range<Int>) {
            for sequence in sequences { h.audio(from: ann.link, burst: burst, sequence: UInt16(sequence), payload: [UInt8(sequence)]) }
        }
        if burstBeforeJoin {
            h.send(.floorRequest(), from: ann.link)
            burst = h.grantedBurst(ann.link)!
            speak(0..<5)
        }
        let late = h.join("late", entered: true)
        if !burstBeforeJoin {
            h.send(.floorRequest(), from: ann.link)
            burst = h.grantedBurst(ann.link)!
            speak(0..<5)
        }
        speak(5..<8)
        for _ in 0..<3 { h.advance(10 * ms) }
        #expect(h.audio(to: late.link).isEmpty, "nothing before its handshake is done")
        #expect(h.audio(to: bob.link).count == 8)
        h.hub.handshakeDone(late.link, at: h.time)
        h.advance(0)
        speak(8..<9)
        let got = h.audio(to: late.link)
        #expect(got.map(\.header.sequence) == (0..<9).map { UInt16($0) }, "the burst whole, from its first packet")
        #expect(!got.last!.header.flags.contains(.catchUp), "then live")
    }

    /// A burst that starts while a late joiner is still being replayed the previous one reaches it
    /// from its first packet, after the replay, and then live: nothing of it is skipped.
    @Test func aBurstStartedDuringAReplayIsReplayedFromItsFirstPacketToo() throws {
        let h = Harness()
        let ann = h.join("ann"), bob = h.join("bob"), cy = h.join("cy")
        h.send(.floorRequest(), from: ann.link)
        let first = h.grantedBurst(ann.link)!
        for sequence in 0..<100 { h.audio(from: ann.link, burst: first, sequence: UInt16(sequence), payload: [1, UInt8(sequence)]) }
        let late = h.join("late")
        h.advance(0)
        #expect(h.audio(to: late.link).count == 25, "the first batch of the replay")
        h.send(.floorRelease, from: ann.link)
        // Bob takes the floor while the late joiner is 75 packets short of the end of ann's burst; a
        // catch-up tick passes before his first packet (his recording is empty until then).
        h.send(.floorRequest(), from: bob.link)
        let second = try #require(h.grantedBurst(bob.link))
        h.advance(10 * ms)
        for sequence in 0..<5 { h.audio(from: bob.link, burst: second, sequence: UInt16(sequence), payload: [2, UInt8(sequence)]) }
        #expect(h.audio(to: cy.link).filter { $0.payload.first == 2 }.count == 5, "members on the fan-out hear bob at once")
        for _ in 0..<9 { h.advance(10 * ms) }
        for sequence in 5..<8 { h.audio(from: bob.link, burst: second, sequence: UInt16(sequence), payload: [2, UInt8(sequence)]) }
        let got = h.audio(to: late.link)
        let ann1 = got.filter { $0.payload.first == 1 }, bob2 = got.filter { $0.payload.first == 2 }
        #expect(ann1.map(\.header.sequence) == (0..<100).map { UInt16($0) }, "ann's burst whole")
        #expect(bob2.map(\.header.sequence) == (0..<8).map { UInt16($0) }, "bob's from its first packet, no gap, no duplicate")
        #expect(got.firstIndex { $0.payload.first == 2 }! > got.lastIndex { $0.payload.first == 1 }!, "bob's after ann's")
        #expect(bob2.prefix(5).allSatisfy { $0.header.flags.contains(.catchUp) } && bob2.prefix(5).allSatisfy { $0.header.slot == bob.slot })
        #expect(!bob2.last!.header.flags.contains(.catchUp), "then live")
        #expect(h.audio(to: bob.link).filter { $0.payload.first == 2 }.isEmpty, "never back to the talker")
    }

    /// Full duplex, two bursts live when a member joins: it is replayed both, and the packets of the
    /// one it caught up with first keep reaching it while the other is replayed; then both live.
    @Test func aReplayOfTwoLiveBurstsLosesNothingOfEither() throws {
        let h = Harness(mode: .fullDuplex)
        let ann = h.join("ann"), cy = h.join("cy")
        h.send(.floorRequest(), from: ann.link)
        h.send(.floorRequest(), from: cy.link)
        let a = try #require(h.grantedBurst(ann.link)), c = try #require(h.grantedBurst(cy.link))
        for sequence in 0..<10 { h.audio(from: ann.link, burst: a, sequence: UInt16(sequence), payload: [1, UInt8(sequence)]) }
        for sequence in 0..<60 { h.audio(from: cy.link, burst: c, sequence: UInt16(sequence), payload: [3, UInt8(sequence)]) }
        let late = h.join("late")
        var annNext: UInt16 = 10, cyNext: UInt16 = 60
        for _ in 0..<12 {
            h.advance(10 * ms)
            h.audio(from: ann.link, burst: a, sequence: annNext, payload: [1, UInt8(truncatingIfNeeded: annNext)])
            h.audio(from: cy.link, burst: c, sequence: cyNext, payload: [3, UInt8(truncatingIfNeeded: cyNext)])
            annNext += 1
            cyNext += 1
        }
        let got = h.audio(to: late.link)
        #expect(got.filter { $0.payload.first == 1 }.map(\.header.sequence) == (0..<annNext).map { $0 }, "ann's burst without a gap")
        #expect(got.filter { $0.payload.first == 3 }.map(\.header.sequence) == (0..<cyNext).map { $0 }, "cy's burst without a gap")
        #expect(!got.last!.header.flags.contains(.catchUp), "live by the end")
        #expect(h.hub.catchingUp.isEmpty)
    }

    @Test func aFinishedBurstIsLetGoWhenItsLastReplayEndsEarly() throws {
        let h = Harness()
        let ann = h.join("ann")
        h.send(.floorRequest(), from: ann.link)
        let burst = try #require(h.grantedBurst(ann.link))
        for sequence in 0 ..< 200 as Range<UInt16> { h.audio(from: ann.link, burst: burst, sequence: sequence, payload: [UInt8](repeating: 7, count: 80)) }
        let late = h.join("late")
        h.send(.floorRelease, from: ann.link)
        let channel = try #require(h.hub.channels[h.channel.id])
        #expect(channel.recordings.count == 1, "the late joiner is still reading it")
        h.hub.closed(late.link, at: h.time)
        h.drain()
        // Its replay was cut short, so it is owed the burst for the missed-burst window; then the
        // recording goes back even though no later burst comes to recycle it.
        #expect(channel.recordings.count == 1)
        h.advance(HubConfiguration().missedBurstWindow)
        #expect(channel.recordings.isEmpty, "nobody reads it or is owed it any more")
        #expect(channel.spareRecordings.count == 1)
    }

    /// Ann says three words while Bob's phone is asleep; the push wakes it, and by the time his app
    /// has joined, the burst is over. He still hears it, once, from its first packet.
    @Test func aMemberWhoMissedABurstThatEndedIsReplayedItOnJoining() throws {
        let h = Harness()
        let ann = h.join("ann"), bob = h.join("bob"), cy = h.join("cy")
        h.send(.registerPushToken(token: "b0b0b0", environment: .production), from: bob.link)
        h.hub.closed(bob.link, at: h.time)
        h.advance(3_000 * ms)  // past the grace: Bob is offline, and a burst would wake him
        h.send(.floorRequest(), from: ann.link)
        let burst = try #require(h.grantedBurst(ann.link))
        for sequence in 0 ..< 3 as Range<UInt16> { h.audio(from: ann.link, burst: burst, sequence: sequence, payload: [1, UInt8(sequence)]) }
        h.advance(60 * ms)
        h.send(.floorRelease, from: ann.link)
        h.advance(2_000 * ms)
        let woken = h.join("bob")
        h.advance(10 * ms)
        let got = h.audio(to: woken.link)
        #expect(got.map(\.header.sequence) == [0, 1, 2])
        #expect(got.allSatisfy { $0.header.flags.contains(.catchUp) && $0.header.slot == ann.slot && $0.header.burst == burst })
        #expect(got.map(\.payload) == [[1, 0], [1, 1], [1, 2]], "byte for byte")
        #expect(h.hub.counters.missedBurstReplays == 1)
        // Cy heard it live: a rejoin replays nothing. Nor does Bob's second join.
        h.hub.closed(cy.link, at: h.time)
        let cyAgain = h.join("cy")
        h.hub.closed(woken.link, at: h.time)
        let bobAgain = h.join("bob")
        h.advance(10 * ms)
        #expect(h.audio(to: cyAgain.link).isEmpty && h.audio(to: bobAgain.link).isEmpty)
        #expect(h.hub.channels[h.channel.id]!.recordings.isEmpty, "nobody is owed it: the recording is recycled")
    }

    /// Offline for long without a push token, nothing will bring the member back within the window:
    /// the burst isn't kept for it. The member owed a burst that leaves lets it go at once.
    @Test func onlyMembersWhoMayBeBackSoonAreOwedABurst() throws {
        let h = Harness()
        let ann = h.join("ann"), dan = h.join("dan"), eve = h.join("eve")
        h.send(.registerPushToken(token: "e0e0e0", environment: .production), from: eve.link)
        h.hub.closed(dan.link, at: h.time)
        h.hub.closed(eve.link, at: h.time)
        h.advance(3_000 * ms)
        h.send(.floorRequest(), from: ann.link)
        let burst = try #require(h.grantedBurst(ann.link))
        h.audio(from: ann.link, burst: burst, sequence: 0, payload: [1])
        h.send(.floorRelease, from: ann.link)
        let channel = try #require(h.hub.channels[h.channel.id])
        #expect(channel.recordings.count == 1 && channel.recordings[0].missed == [eve.slot], "Dan has no token to be woken by")
        h.hub.removeMember(channel: h.channel.id, user: "eve", at: h.time)
        h.drain()
        #expect(channel.recordings.isEmpty, "nobody is owed it any more")
    }

    /// Ann and Bob join; Bob registers a push token and his connection closes (a phone asleep); Ann
    /// sends `packets` packets and releases. Bob is owed the burst.
    func burstMissedByBob(_ h: Harness, packets: UInt16) throws -> UInt16 {
        let ann = h.join("ann"), bob = h.join("bob")
        h.send(.registerPushToken(token: "b0b0b0", environment: .production), from: bob.link)
        h.hub.closed(bob.link, at: h.time)
        h.send(.floorRequest(), from: ann.link)
        let burst = try #require(h.grantedBurst(ann.link))
        for sequence in 0 ..< packets {
            h.audio(from: ann.link, burst: burst, sequence: sequence, payload: [1, UInt8(truncatingIfNeeded: sequence)])
        }
        h.send(.floorRelease, from: ann.link)
        return burst
    }

    /// Partway through the replay, the same user joins from a new connection (a phone that changed
    /// networks right after its wake): the new connection gets the whole burst.
    @Test func aMemberReplacedMidReplayGetsTheMissedBurstAgain() throws {
        let h = Harness()
        _ = try burstMissedByBob(h, packets: 100)
        let first = h.join("bob")
        h.advance(0)
        #expect(h.audio(to: first.link).count < 100, "still being replayed")
        let second = h.join("bob")
        for _ in 0 ..< 20 { h.advance(10 * ms) }
        #expect(h.audio(to: second.link).map(\.header.sequence) == (0 ..< 100).map { UInt16($0) })
    }

    /// A replay cut off late in the window (the phone dropped again 25 s after the burst ended) keeps
    /// the burst for a whole window from then: the phone's next join still gets it.
    @Test func aReplayCutOffLateInTheWindowKeepsTheBurstForAnotherWindow() throws {
        let h = Harness()
        _ = try burstMissedByBob(h, packets: 140)  // the talker's rate limit lets 150 through at once
        h.advance(25_000 * ms)
        let first = h.join("bob")
        h.advance(0)
        #expect(h.audio(to: first.link).count < 140)
        h.hub.closed(first.link, at: h.time)
        h.advance(10_000 * ms)  // 35 s after the end
        let second = h.join("bob")
        for _ in 0 ..< 30 { h.advance(10 * ms) }
        #expect(h.audio(to: second.link).map(\.header.sequence) == (0 ..< 140).map { UInt16($0) })

    }

    /// A phone that drops mid-replay again and again doesn't keep the burst for good: twice the
    /// window from the end at most.
    @Test func aReplayCutOffAgainAndAgainIsKeptTwiceTheWindowAtMost() throws {
        let h = Harness()
        _ = try burstMissedByBob(h, packets: 140)
        h.advance(25_000 * ms)
        for _ in 0 ..< 4 {  // cut off at 25, 34, 43 and 52 s after the end
            let again = h.join("bob")
            h.advance(0)
            h.hub.closed(again.link, at: h.time)
            h.advance(9_000 * ms)
        }
        // 61 s after the end: past twice the window, though the last drop was 9 s ago.
        let late = h.join("bob")
        h.advance(10 * ms)
        #expect(h.audio(to: late.link).isEmpty)
        #expect(h.hub.channels[h.channel.id]!.recordings.isEmpty)
    }

    @Test func aMemberDroppedDuringABurstGetsItWholeOnRejoiningAfterItEnded() throws {
        let h = Harness()
        let ann = h.join("ann"), bob = h.join("bob")
        h.send(.floorRequest(), from: ann.link)
        let burst = try #require(h.grantedBurst(ann.link))
        for sequence in 0 ..< 5 as Range<UInt16> { h.audio(from: ann.link, burst: burst, sequence: sequence, payload: [1, UInt8(sequence)]) }
        h.hub.closed(bob.link, at: h.time)  // his network went mid-burst
        for sequence in 5 ..< 10 as Range<UInt16> { h.audio(from: ann.link, burst: burst, sequence: sequence, payload: [1, UInt8(sequence)]) }
        h.send(.floorRelease, from: ann.link)
        h.advance(5_000 * ms)
        let back = h.join("bob")
        h.advance(10 * ms)
        #expect(h.audio(to: back.link).map(\.header.sequence) == (0 ..< 10).map { UInt16($0) })
    }

    @Test func aMissedBurstIsKeptOnlyForTheWindowAndOnlyTheNewestFew() throws {
        var configuration = HubConfiguration.unpaced
        configuration.maxMissedBursts = 2
        let h = Harness(configuration: configuration)
        let ann = h.join("ann"), bob = h.join("bob")
        h.hub.closed(bob.link, at: h.time)
        var bursts: [UInt16] = []
        for word in 0 ..< 3 as Range<UInt8> {
            h.send(.floorRequest(), from: ann.link)
            let burst = try #require(h.grantedBurst(ann.link))
            bursts.append(burst)
            h.audio(from: ann.link, burst: burst, sequence: 0, payload: [word])
            h.send(.floorRelease, from: ann.link)
            h.advance(100 * ms)
        }
        let channel = try #require(h.hub.channels[h.channel.id])
        #expect(channel.recordings.count == 2, "the oldest went past the limit")
        // Within the window: the two newest, in order.
        let back = h.join("bob")
        h.advance(10 * ms)
        #expect(h.audio(to: back.link).map(\.header.burst) == Array(bursts.suffix(2)))

        // Past the window, nothing is kept, and a member who missed the burst hears nothing of it.
        h.hub.closed(back.link, at: h.time)
        h.send(.floorRequest(), from: ann.link)
        let late = try #require(h.grantedBurst(ann.link))
        h.audio(from: ann.link, burst: late, sequence: 0, payload: [9])
        h.send(.floorRelease, from: ann.link)
        #expect(channel.recordings.count == 1)
        h.advance(HubConfiguration().missedBurstWindow)
        #expect(channel.recordings.isEmpty)
        let tooLate = h.join("bob")
        h.advance(10 * ms)
        #expect(h.audio(to: tooLate.link).isEmpty)
    }

    /// A member that rejoins on a new connection while it is being replayed is served once, not twice.
    @Test func aRejoinDuringTheReplayIsServedOnce() throws {
        let h = Harness()
        let ann = h.join("ann"), bob = h.join("bob")
        h.send(.floorRequest(), from: ann.link)
        let first = try #require(h.grantedBurst(ann.link))
        for sequence in 0..<100 { h.audio(from: ann.link, burst: first, sequence: UInt16(sequence), payload: [1, UInt8(sequence)]) }
        _ = h.join("late")
        h.advance(0)
        let again = h.join("late")  // the same user from another connection: the first is replaced
        #expect(h.hub.catchingUp.filter { $0.slot == again.slot }.count == 1)
        h.send(.floorRelease, from: ann.link)
        h.send(.floorRequest(), from: bob.link)
        let second = try #require(h.grantedBurst(bob.link))
        for sequence in 0..<5 { h.audio(from: bob.link, burst: second, sequence: UInt16(sequence), payload: [2, UInt8(sequence)]) }
        for _ in 0..<12 { h.advance(10 * ms) }
        let got = h.audio(to: again.link)
        #expect(got.filter { $0.payload.first == 1 }.map(\.header.sequence) == (0..<100).map { UInt16($0) })
        #expect(got.filter { $0.payload.first == 2 }.map(\.header.sequence) == (0..<5).map { UInt16($0) }, "bob's burst once")
    }
}
