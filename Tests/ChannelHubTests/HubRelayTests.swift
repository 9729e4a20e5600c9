import ChannelProtocol
import ChannelStore
import Foundation
import Testing
import Wire
@testable import ChannelHub

/// The relay: who gets a talker's audio, what is dropped, and the talker's rate and recording limits.
@Suite struct HubRelayTests {
    @Test func joinedMemberGetsChannelRosterAndOthersHearOfIt() {
        let h = Harness()
        let ann = h.join("ann")
        guard case .joined(let info, let you, let roster, let talkers, _)? = h.lastMessage(to: ann.link) else {
            Issue.record("no joined message"); return
        }
        #expect(info.name == "Ops" && info.id == h.channel.id && you == ann.slot)
        #expect(roster.map(\.userID) == ["ann"] && talkers.isEmpty)
        let bob = h.join("bob", capabilities: [.listen])
        #expect(h.messages(to: ann.link).contains(.participant(RosterMember(
            slot: bob.slot, userID: "bob", name: "Bob", canTalk: false, canListen: true))))
        guard case .joined(_, _, let roster2, _, _)? = h.lastMessage(to: bob.link) else { Issue.record("no joined"); return }
        #expect(roster2.map(\.userID) == ["bob", "ann"], "the joiner's own entry first, then the rest in slot order")
        #expect(h.stored.contains { if case .upsertMember(let m) = $0 { return m.userID == "bob" } else { return false } })
        #expect(h.hub.counters.joins == 2)
    }

    @Test func audioFromTheFloorHolderReachesEveryListenerButTheTalkerByteForByte() {
        let h = Harness()
        let ann = h.join("ann"), bob = h.join("bob"), cat = h.join("cat", capabilities: [.listen])
        let deaf = h.join("dan", capabilities: [.talk])  // may talk, may not listen
        h.send(.floorRequest(), from: ann.link)
        let burst = try! #require(h.grantedBurst(ann.link))
        #expect(h.floorEvents(to: bob.link).last == FloorEvent(kind: .taken, slot: ann.slot, burst: burst))
        let payload = (0..<80).map { UInt8($0) }
        h.audio(from: ann.link, burst: burst, sequence: 0, payload: payload)
        #expect(h.audio(to: ann.link).isEmpty)
        #expect(h.audio(to: deaf.link).isEmpty)
        for listener in [bob, cat] {
            let got = h.audio(to: listener.link)
            #expect(got.count == 1)
            #expect(got.first?.payload == payload)
            #expect(got.first?.header == AudioHeader(slot: ann.slot, burst: burst, sequence: 0))
        }
        #expect(h.hub.counters.packetsOut == 2)
    }

    @Test func audioFromAnyoneElseIsDroppedAndCounted() {
        let h = Harness()
        let ann = h.join("ann"), bob = h.join("bob")
        h.send(.floorRequest(), from: ann.link)
        let burst = h.grantedBurst(ann.link)!
        h.audio(from: bob.link, burst: burst, sequence: 0, payload: [1, 2, 3])
        h.audio(from: ann.link, burst: burst &+ 1, sequence: 0, payload: [1])
        h.audio(from: Link(index: 99, generation: 1), burst: burst, sequence: 0, payload: [1])
        _ = [0x00, 0x41].withUnsafeBytes { h.hub.receiveAudio(from: ann.link, datagram: $0, at: h.time.instant, send: h.record) }
        #expect(h.sent.isEmpty)
        #expect(h.hub.counters.drops(.notFloorHolder) == 1)
        #expect(h.hub.counters.drops(.staleBurst) == 1)
        #expect(h.hub.counters.drops(.notJoined) == 1)
        #expect(h.hub.counters.drops(.malformed) == 1)
    }

    @Test func contentionQueuesThenGrantsOnRelease() {
        let h = Harness()
        let ann = h.join("ann"), bob = h.join("bob")
        h.send(.floorRequest(), from: ann.link)
        h.send(.floorRequest(), from: bob.link)
        #expect(h.floorEvents(to: bob.link).last == FloorEvent(kind: .queued, slot: bob.slot, position: 1))
        h.send(.floorRelease, from: ann.link)
        #expect(h.floorEvents(to: bob.link).last?.kind == .granted)
        #expect(h.floorEvents(to: ann.link).suffix(2).map(\.kind) == [.ended, .taken])
        #expect(h.stored.contains { if case .logTransmission(let t) = $0 { return t.userID == "ann" && t.endReason == "released" } else { return false } })
    }

    @Test func aTalkerSendingFasterThanAnyOpusSenderIsHeldToItsRate() {
        let h = Harness()
        let ann = h.join("ann"), bob = h.join("bob")
        h.send(.floorRequest(), from: ann.link)
        let burst = h.grantedBurst(ann.link)!
        // 150 at once (a second and a half of packets the network held up) pass; the next doesn't.
        for sequence in 0..<151 { h.audio(from: ann.link, burst: burst, sequence: UInt16(sequence), payload: [1]) }
        #expect(h.audio(to: bob.link).count == 150)
        #expect(h.hub.counters.drops(.overRate) == 1)
        #expect(h.hub.channels[h.channel.id]!.recordings.first?.count == 150, "dropped packets are not recorded either")
        // Then 150 a second: 100 ms buys 15.
        h.advance(100 * ms)
        for sequence in 151..<171 { h.audio(from: ann.link, burst: burst, sequence: UInt16(sequence), payload: [1]) }
        #expect(h.audio(to: bob.link).count == 165)
        #expect(h.hub.counters.drops(.overRate) == 6)
        // A real-time talker (10 ms frames, the shortest) is never touched.
        for sequence in 171..<471 {
            h.advance(10 * ms)
            h.audio(from: ann.link, burst: burst, sequence: UInt16(sequence), payload: [1])
        }
        #expect(h.audio(to: bob.link).count == 465)
        #expect(h.hub.counters.drops(.overRate) == 6)
    }

    @Test func releasingAndRequestingAgainDoesNotRefillTheTalkersBudget() {
        let h = Harness()
        let ann = h.join("ann"), bob = h.join("bob")
        // Ten bursts of 150 packets within 100 ms: only the first burst's packets (and the 15 the
        // 100 ms refill) may pass, not 1,500.
        for round in 0..<10 {
            h.send(.floorRequest(), from: ann.link)
            let burst = h.grantedBurst(ann.link)!
            for sequence in 0..<150 { h.audio(from: ann.link, burst: burst, sequence: UInt16(sequence), payload: [1]) }
            h.send(.floorRelease, from: ann.link)
            if round < 9 { h.advance(10 * ms) }
        }
        #expect(h.audio(to: bob.link).count <= 150 + 14)
        #expect(h.hub.counters.drops(.overRate) >= 1_500 - 164)
    }

    @Test func aRecordingStopsAtItsByteLimitWhileTheRelayGoesOn() {
        var configuration = HubConfiguration.unpaced
        configuration.maxRecordedBytes = 1_000
        let h = Harness(configuration: configuration)
        let ann = h.join("ann"), bob = h.join("bob")
        h.send(.floorRequest(), from: ann.link)
        let burst = h.grantedBurst(ann.link)!
        // Full-size packets: three fit in 1,000 bytes, the fourth would not.
        for sequence in 0..<10 { h.audio(from: ann.link, burst: burst, sequence: UInt16(sequence), payload: [UInt8](repeating: UInt8(sequence), count: 300)) }
        #expect(h.audio(to: bob.link).count == 10)
        #expect(h.hub.channels[h.channel.id]!.recordings.first?.count == 3)
        let late = h.join("late")
        h.advance(0)
        h.audio(from: ann.link, burst: burst, sequence: 10, payload: [10])
        // What was kept, then live: a gap, but never more memory than the limit.
        #expect(h.audio(to: late.link).map(\.header.sequence) == [0, 1, 2, 10])
        // Packet 10 would have fitted, but a recording with holes would replay words missing.
        #expect(h.hub.channels[h.channel.id]!.recordings.first?.count == 3)
    }

    @Test func aSpareRecordingGivesBackTheMemoryOfALongBurst() {
        var configuration = HubConfiguration.unpaced
        configuration.spareRecordingCapacity = 4_096
        let h = Harness(configuration: configuration)
        let ann = h.join("ann")
        _ = h.join("bob")
        func burst(packets: Int, size: Int) {
            h.send(.floorRequest(), from: ann.link)
            let burst = h.grantedBurst(ann.link)!
            for sequence in 0..<packets { h.audio(from: ann.link, burst: burst, sequence: UInt16(sequence), payload: [UInt8](repeating: 1, count: size)) }
            h.send(.floorRelease, from: ann.link)
        }
        burst(packets: 10, size: 100)
        let kept = h.hub.channels[h.channel.id]!.spareRecordings
        #expect(kept.count == 1 && kept[0].capacityBytes >= 1_000, "a short burst's buffers are kept for the next")
        burst(packets: 40, size: 500)
        let spare = h.hub.channels[h.channel.id]!.spareRecordings
        #expect(spare.count == 1 && spare[0].capacityBytes == 0)
        // And it records again, into new storage.
        burst(packets: 5, size: 100)
        let again = h.hub.channels[h.channel.id]!.spareRecordings
        #expect(again.count == 1 && again[0].capacityBytes >= 500)
    }
}
