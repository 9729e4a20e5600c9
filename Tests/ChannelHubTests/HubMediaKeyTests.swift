import ChannelProtocol
import Foundation
import Testing
import Wire
@testable import ChannelHub

/// The bursts' media keys (docs/protocol.md §16.4.5): who gets them, when a burst gets a new one, and
/// what the relay does with frames under keys that are not the burst's.
@Suite struct HubMediaKeyTests {
    @Test func aGrantGivesTheBurstsKeyToTheTalkerAndEveryoneWhoMayListenFirst() throws {
        let h = Harness()
        let ann = h.join("ann"), bob = h.join("bob"), cat = h.join("cat", capabilities: [.listen])
        let deaf = h.join("dan", capabilities: [.talk])
        h.send(.floorRequest(), from: ann.link)
        let burst = try #require(h.grantedBurst(ann.link))
        let key = try #require(h.mediaKeys(to: ann.link).last)
        #expect(key.slot == ann.slot && key.burst == burst && key.key.count == MediaKey.keyLength)
        for listener in [bob, cat] { #expect(h.mediaKeys(to: listener.link) == [key]) }
        #expect(h.mediaKeys(to: deaf.link).isEmpty, "a member who may not listen gets no key")
        // The key comes before the message that announces the burst, to the talker and to listeners.
        for (link, kind) in [(ann.link, FloorEventKind.granted), (bob.link, .taken)] {
            let messages = h.messages(to: link)
            let keyAt = try #require(messages.firstIndex(of: .mediaKey(key)))
            let eventAt = try #require(messages.firstIndex { if case .floor(let e) = $0 { e.kind == kind } else { false } })
            #expect(keyAt < eventAt)
        }
        // Each burst has a key of its own.
        h.send(.floorRelease, from: ann.link)
        h.send(.floorRequest(), from: ann.link)
        let next = try #require(h.mediaKeys(to: ann.link).last)
        #expect(next.keyID != key.keyID && next.key != key.key)
    }

    @Test func framesUnderAKeyThatIsNotTheBurstsAreDropped() throws {
        let h = Harness()
        let ann = h.join("ann"), bob = h.join("bob")
        h.send(.floorRequest(), from: ann.link)
        let burst = try #require(h.grantedBurst(ann.link))
        let good = h.keyID(ann.link, burst: burst)
        for keyID in [0, good + 1, 1 << 40] as [UInt64] {
            let datagram = AudioHeader(burst: burst, sequence: 0).datagram(payload: Harness.frame([1], keyID: keyID))
            _ = datagram.withUnsafeBytes { h.hub.receiveAudio(from: ann.link, datagram: $0, at: h.time.instant, send: h.record) }
        }
        // Shorter than a tag: not a sealed frame.
        let short = AudioHeader(burst: burst, sequence: 0).datagram(payload: Array(Harness.frame([], keyID: good).dropLast(1)))
        _ = short.withUnsafeBytes { h.hub.receiveAudio(from: ann.link, datagram: $0, at: h.time.instant, send: h.record) }
        #expect(h.audio(to: bob.link).isEmpty)
        #expect(h.hub.counters.drops(.unknownKey) == 4)
        h.audio(from: ann.link, burst: burst, sequence: 0, payload: [1])
        #expect(h.audio(to: bob.link).count == 1)
    }

    @Test func aMemberWhoLeavesMidBurstGetsNoKeyForWhatFollows() throws {
        let h = Harness()
        let ann = h.join("ann"), bob = h.join("bob"), cat = h.join("cat")
        h.send(.floorRequest(), from: ann.link)
        let burst = try #require(h.grantedBurst(ann.link))
        let first = try #require(h.mediaKeys(to: ann.link).last)
        h.audio(from: ann.link, burst: burst, sequence: 0, payload: [0])
        h.send(.leave, from: cat.link)
        let second = try #require(h.mediaKeys(to: ann.link).last)
        #expect(second.keyID != first.keyID && second.burst == burst && second.slot == ann.slot)
        #expect(h.mediaKeys(to: bob.link).last == second)
        #expect(!h.mediaKeys(to: cat.link).contains(second))
        // Frames still in flight under the first key are relayed; the new key's too.
        h.audio(from: ann.link, burst: burst, sequence: 1, payload: [1])
        #expect(h.audio(to: bob.link).map(\.payload) == [[0], [1]])
        #expect(h.hub.counters.drops(.unknownKey) == 0)
        // A member who joins later gets every key of the burst, for its catch-up.
        let late = h.join("late")
        let lateKeys = h.mediaKeys(to: late.link)
        #expect(lateKeys.contains(first) && lateKeys.contains(second))
    }

    @Test func aTalkerBackWithinTheGraceGetsItsKeyWithTheFloor() throws {
        let h = Harness()
        let ann = h.join("ann"), bob = h.join("bob")
        h.send(.floorRequest(), from: ann.link)
        let burst = try #require(h.grantedBurst(ann.link))
        h.hub.closed(ann.link, at: h.time)
        h.advance(500 * ms)
        let back = h.join("ann")
        #expect(back.slot == ann.slot)
        // Its new session knows no keys: the burst's come with the join (the newest too, made when
        // the talker's own connection dropped), and it seals on.
        let keys = h.mediaKeys(to: back.link)
        #expect(keys.allSatisfy { $0.burst == burst && $0.slot == ann.slot })
        #expect(keys.last != nil && keys.last == h.mediaKeys(to: bob.link).last)
        h.audio(from: back.link, burst: burst, sequence: 1, payload: [1])
        #expect(h.hub.counters.drops(.unknownKey) == 0 && h.hub.counters.packetsIn == 1)
    }

    @Test func aDroppedConnectionChangesNoKeyAndItsReturnBringsThem() throws {
        let h = Harness()
        let ann = h.join("ann"), bob = h.join("bob")
        h.send(.floorRequest(), from: ann.link)
        let key = try #require(h.mediaKeys(to: ann.link).last)
        h.hub.closed(bob.link, at: h.time)
        h.advance(500 * ms)
        #expect(h.mediaKeys(to: ann.link) == [key], "a disconnection is no departure")
        let back = h.join("bob")
        #expect(h.mediaKeys(to: back.link) == [key])
        #expect(h.hub.counters.mediaKeys == 1)
    }

    @Test func aBurstKeepsOnlyItsNewestKeys() throws {
        let h = Harness()
        let ann = h.join("ann")
        h.send(.floorRequest(), from: ann.link)
        let burst = try #require(h.grantedBurst(ann.link))
        let first = try #require(h.mediaKeys(to: ann.link).first)
        for i in 0..<20 {
            let passer = h.join("p\(i)")
            h.send(.leave, from: passer.link)
        }
        #expect(h.mediaKeys(to: ann.link).count == 21)
        // The oldest keys are gone from the relay: a frame under the first is refused now.
        let datagram = AudioHeader(burst: burst, sequence: 0).datagram(payload: Harness.frame([1], keyID: first.keyID))
        _ = datagram.withUnsafeBytes { h.hub.receiveAudio(from: ann.link, datagram: $0, at: h.time.instant, send: h.record) }
        #expect(h.hub.counters.drops(.unknownKey) == 1)
        h.audio(from: ann.link, burst: burst, sequence: 1, payload: [1])
        #expect(h.hub.counters.drops(.unknownKey) == 1)
    }
}
