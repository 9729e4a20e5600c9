import ChannelProtocol
import ChannelStore
import Foundation
import Testing
import Wire
@testable import ChannelHub

/// One member can't make the server multiply its messages by the channel's size (issue 42, item 2):
/// with the default limits, a member toggling mute and cycling floor requests and releases at the
/// control rate reaches each other member a few times a second, not 35, and wakes nobody.
@Suite struct HubFloodTests {
    struct Room {
        let h: Harness
        let mal: (link: Link, slot: UInt16)
        let others: [Link]
        let sleepers: [String]

        /// 100 members: the flooder, 89 connected and 10 asleep with push tokens.
        init(configuration: HubConfiguration = HubConfiguration()) {
            h = Harness(configuration: configuration)
            mal = h.join("mal")
            var others: [Link] = [], sleepers: [String] = []
            for index in 0..<99 {
                let member = h.join("m\(index)")
                guard index < 10 else { others.append(member.link); continue }
                h.send(.registerPushToken(token: String(format: "%04x", index), environment: .production), from: member.link)
                h.hub.closed(member.link, deliberately: true, at: h.time)
                sleepers.append("m\(index)")
            }
            h.drain()
            self.others = others
            self.sleepers = sleepers
        }

        /// Sends `script` in turn at the control rate (20 a second) for `seconds`, with one audio
        /// packet after each grant if `audio`. Returns the messages each other member got meanwhile.
        func flood(seconds: Int, audio: Bool) -> [Link: [ServerMessage]] {
            h.advance(5_000 * ms)  // past the joins' roster entries
            let start = h.messages.count
            h.other.removeAll()
            let script: [ClientMessage] = [.setMuted(true), .floorRequest(), .setMuted(false), .floorRelease]
            for step in 0..<(seconds * 20) {
                let message = script[step % script.count]
                h.send(message, from: mal.link)
                if audio, message == .floorRequest(), let burst = h.hub.channels[h.channel.id]?.floor.burst(of: mal.slot) {
                    h.audio(from: mal.link, burst: UInt16(truncatingIfNeeded: burst), sequence: UInt16(step), payload: [1])
                    h.drain()
                }
                h.advance(50 * ms)
            }
            h.advance(1_000 * ms)  // entries still held go out
            var got: [Link: [ServerMessage]] = [:]
            for (link, message) in h.messages[start...] where others.contains(link) { got[link, default: []].append(message) }
            return got
        }

        /// How many wakes each sleeper was asked for.
        var wakes: [String: Int] {
            var count: [String: Int] = [:]
            for case .burstStarted(_, _, let wake, _) in h.other { for member in wake { count[member.userID, default: 0] += 1 } }
            return count
        }
    }

    @Test func aMemberCyclingMuteAndTheFloorReachesEachOtherMemberAFewTimesASecond() {
        let room = Room()
        let got = room.flood(seconds: 10, audio: false)
        let configuration = HubConfiguration()
        #expect(got.count == room.others.count)
        for (link, messages) in got {
            let entries = messages.filter { if case .participant = $0 { return true } else { return false } }.count
            let floor = messages.filter { if case .floor = $0 { return true } else { return false } }.count
            // One entry at once, then at most one per rosterUpdateInterval (500 ms).
            #expect(entries <= 1 + 10 * 2, "\(link): \(entries) roster entries")
            // Each grant is taken, ended, idle: at most floorGrantBurst, then floorGrantsPerMinute.
            let grants = configuration.floorGrantBurst + 10 * configuration.floorGrantsPerMinute / 60 + 1
            #expect(floor <= 3 * grants, "\(link): \(floor) floor events")
            // Each grant also gives its burst's key.
            #expect(messages.count <= 40 + grants, "\(link): \(messages.count) messages in 10 s")
        }
        // The flooder was told why, and its member still shows its last mute.
        #expect(room.h.hub.counters.floorRequestsLimited > 0 && room.h.hub.counters.rosterUpdatesHeld > 0)
        let denial = room.h.floorEvents(to: room.mal.link).last { $0.kind == .denied }
        #expect(denial?.cause == .rateLimited && denial?.reason?.contains("times a minute") == true, "\(String(describing: denial))")
        #expect(room.h.hub.roster(of: room.h.channel.id).first { $0.userID == "mal" }?.muted == false)
        // Bursts with no audio wake nobody.
        #expect(room.wakes.isEmpty, "\(room.wakes)")
    }

    @Test func burstsWithAudioWakeEachSleeperAtMostItsAllowance() {
        let room = Room()
        _ = room.flood(seconds: 10, audio: true)
        let configuration = HubConfiguration()
        let allowance = configuration.wakeBurst + 10 * configuration.wakesPerMinute / 60 + 1
        #expect(Set(room.wakes.keys) == Set(room.sleepers))
        for (user, count) in room.wakes { #expect(count >= 1 && count <= allowance, "\(user) woken \(count) times") }
    }

    /// A tap: talking and not within 500 ms. The others get one merged entry at the interval's end;
    /// the member itself sees each change at once, in order (walkie confirms its release by seeing
    /// its own entry stop talking, which the merged entry would hide).
    @Test func aMemberSeesEachChangeOfItsOwnEntryAtOnce() {
        let h = Harness(configuration: HubConfiguration())
        let ann = h.join("ann"), bob = h.join("bob")
        h.advance(1_000 * ms)
        func entries(to link: Link) -> [RosterMember] {
            h.messages(to: link).compactMap { if case .participant(let p) = $0, p.userID == "ann" { return p } else { return nil } }
        }
        let (annBefore, bobBefore) = (entries(to: ann.link).count, entries(to: bob.link).count)
        h.send(.setMuted(true), from: ann.link)
        h.send(.floorRequest(), from: ann.link)
        h.send(.floorRelease, from: ann.link)
        #expect(entries(to: ann.link).dropFirst(annBefore).map(\.talking) == [false, true, false])
        #expect(entries(to: bob.link).dropFirst(bobBefore).map(\.muted) == [true], "only the first change reached Bob at once")
        h.advance(500 * ms)
        let merged = entries(to: bob.link).dropFirst(bobBefore)
        #expect(merged.count == 2 && merged.last?.talking == false && merged.last?.muted == true)
        #expect(entries(to: ann.link).count == annBefore + 3, "ann is not told again what she was told")
    }

    /// A person's pace is not limited: a burst, a pause of a few seconds, another, for a minute.
    @Test func aTalkerAtAPersonsPaceIsNeverHeldBack() {
        let h = Harness(configuration: HubConfiguration())
        let ann = h.join("ann"), bob = h.join("bob")
        for _ in 0..<15 {
            h.advance(1_000 * ms)
            #expect(h.talk(ann.link) != nil)
            h.advance(2_000 * ms)
            h.send(.floorRelease, from: ann.link)
            h.send(.setMuted(true), from: ann.link)
            h.advance(1_000 * ms)
            h.send(.setMuted(false), from: ann.link)
        }
        #expect(h.hub.counters.floorRequestsLimited == 0)
        #expect(h.floorEvents(to: bob.link).filter { $0.kind == .taken }.count == 15)
    }
}
