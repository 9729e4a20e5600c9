import ChannelProtocol
import ChannelStore
import Foundation
import Testing
import Wire
@testable import ChannelHub

/// Liveness: dropped and silent members, the grace, and what they are replayed when heard again.
@Suite struct HubLivenessTests {
    @Test func talkerWhoDropsKeepsTheFloorForTheGraceThenLosesIt() {
        let h = Harness()
        let ann = h.join("ann"), bob = h.join("bob")
        h.send(.floorRequest(), from: ann.link)
        h.hub.closed(ann.link, at: h.time)
        h.drain()
        #expect(h.messages(to: bob.link).last == .participant(RosterMember(slot: ann.slot, userID: "ann", name: "Ann",
                                                                           connection: .reconnecting, talking: true)))
        h.advance(1_999 * ms)
        #expect(!h.floorEvents(to: bob.link).contains { $0.kind == .ended })
        h.advance(1 * ms)
        #expect(h.floorEvents(to: bob.link).suffix(2).map(\.kind) == [.ended, .idle])
        #expect(h.hub.roster(of: h.channel.id).first { $0.userID == "ann" }?.connection == .offline)
    }

    /// A client that closes its connection on purpose (the app quit, `walkie talk` done) is offline
    /// at once, and its floor goes to the next in the queue now, not after the grace period.
    @Test func aDeliberateCloseIsOfflineAtOnceAndFreesTheFloor() throws {
        let h = Harness()
        let ann = h.join("ann"), bob = h.join("bob"), cat = h.join("cat")
        h.send(.floorRequest(), from: ann.link)
        h.send(.floorRequest(), from: bob.link)
        h.send(.floorRequest(), from: cat.link)
        #expect(h.floorEvents(to: cat.link).last?.position == 2)
        // Bob, waiting, quits: out of the queue at once.
        h.hub.closed(bob.link, deliberately: true, at: h.time)
        h.drain()
        #expect(h.floorEvents(to: cat.link).last?.position == 1)
        #expect(h.hub.roster(of: h.channel.id).first { $0.userID == "bob" }?.connection == .offline)
        // Ann, talking for 3 s, quits: Cat has the floor without waiting out the grace, and the
        // log has Ann's 3 s (not less the grace a dropped talker's length gives back).
        h.audio(from: ann.link, burst: h.grantedBurst(ann.link)!, sequence: 0, payload: [1])
        h.advance(2_000 * ms)
        h.audio(from: ann.link, burst: h.grantedBurst(ann.link)!, sequence: 1, payload: [1])
        h.advance(1_000 * ms)
        h.hub.closed(ann.link, deliberately: true, at: h.time)
        h.drain()
        #expect(h.floorEvents(to: cat.link).last?.kind == .granted)
        #expect(h.messages(to: cat.link).contains(.participant(RosterMember(slot: ann.slot, userID: "ann", name: "Ann", connection: .offline))))
        #expect(!h.messages(to: cat.link).contains { if case .participant(let p) = $0 { p.connection == .reconnecting } else { false } })
        #expect(h.stored.contains { if case .logTransmission(let t) = $0 { t.userID == "ann" && t.endReason == "closed" && t.durationMilliseconds == 3_000 } else { false } },
                "\(h.stored)")
    }

    @Test func aMemberWhoseConnectionGoesSilentShowsReconnectingUntilHeardAgain() {
        let h = Harness()
        let ann = h.join("ann"), bob = h.join("bob"), cat = h.join("cat")
        func annSeenBy(_ link: Link) -> ConnectionState? {
            h.messages(to: link).compactMap { if case .participant(let p) = $0, p.userID == "ann" { return p.connection } else { return nil } }.last
        }
        // Everyone heard lately: nothing changes, nothing is sent.
        let before = h.messages.count
        h.hub.sweepLiveness(at: h.time) { _ in true }
        h.drain()
        #expect(h.messages.count == before)

        // Ann's phone dies: her connection stays open, but nothing comes from it.
        h.hub.sweepLiveness(at: h.time) { $0 != ann.link }
        h.drain()
        #expect(annSeenBy(bob.link) == .reconnecting && annSeenBy(cat.link) == .reconnecting)
        #expect(h.hub.roster(of: h.channel.id).first { $0.userID == "ann" }?.connection == .reconnecting)
        #expect(h.hub.counters.silentMembers == 1)
        // Told once, not at every sweep.
        let told = h.messages.count
        h.hub.sweepLiveness(at: h.time) { $0 != ann.link }
        h.drain()
        #expect(h.messages.count == told)
        // Only the roster changed: she still hears the channel.
        h.send(.floorRequest(), from: bob.link)
        h.audio(from: bob.link, burst: h.grantedBurst(bob.link)!, sequence: 0, payload: [1, 2, 3])
        #expect(h.audio(to: ann.link).count == 1)

        // Heard again at the next sweep.
        h.hub.sweepLiveness(at: h.time) { _ in true }
        h.drain()
        #expect(annSeenBy(bob.link) == .connected && annSeenBy(ann.link) == .connected)

        // Silent again, then a control message: back at once, without waiting for a sweep.
        h.hub.sweepLiveness(at: h.time) { $0 != ann.link }
        h.drain()
        #expect(annSeenBy(cat.link) == .reconnecting)
        h.send(.setMuted(true), from: ann.link)
        #expect(annSeenBy(cat.link) == .connected)
        #expect(h.hub.roster(of: h.channel.id).first { $0.userID == "ann" }?.muted == true)

        // A closed connection is the close's business: the sweep leaves it to the grace.
        h.hub.closed(ann.link, at: h.time)
        h.drain()
        h.hub.sweepLiveness(at: h.time) { _ in true }
        h.drain()
        #expect(annSeenBy(bob.link) == .reconnecting)
    }

    /// A radio that died for good is not shown as about to come back until the transport's idle
    /// timeout, minutes later: silent for `silentOffline` after the sweep found it so, it shows
    /// `offline`, keeps its session (and hears the channel, should it be only deaf to us one way),
    /// and shows `connected` the moment it is heard again.
    @Test func aMemberSilentForLongShowsOfflineAndKeepsItsSession() {
        let h = Harness()
        let ann = h.join("ann"), bob = h.join("bob")
        func annSeenBy(_ link: Link) -> [ConnectionState] {
            h.messages(to: link).compactMap { if case .participant(let p) = $0, p.userID == "ann" { return p.connection } else { return nil } }
        }
        h.hub.sweepLiveness(at: h.time) { $0 != ann.link }
        h.drain()
        #expect(annSeenBy(bob.link).last == .reconnecting)
        h.advance(29_999 * ms)
        h.hub.sweepLiveness(at: h.time) { $0 != ann.link }
        h.drain()
        #expect(annSeenBy(bob.link).last == .reconnecting)
        h.advance(1 * ms)
        h.hub.sweepLiveness(at: h.time) { $0 != ann.link }
        h.hub.sweepLiveness(at: h.time) { $0 != ann.link }
        h.drain()
        #expect(annSeenBy(bob.link).suffix(2) == [.reconnecting, .offline], "told once: \(annSeenBy(bob.link))")
        #expect(h.hub.roster(of: h.channel.id).first { $0.userID == "ann" }?.connection == .offline)
        h.send(.floorRequest(), from: bob.link)
        h.audio(from: bob.link, burst: h.grantedBurst(bob.link)!, sequence: 0, payload: [7])
        #expect(h.audio(to: ann.link).count == 1)
        h.send(.floorRelease, from: bob.link)

        // Heard again: connected at once, and the clock starts over the next time.
        h.hub.sweepLiveness(at: h.time) { _ in true }
        h.drain()
        #expect(annSeenBy(bob.link).last == .connected)
        h.hub.sweepLiveness(at: h.time) { $0 != ann.link }
        h.advance(10_000 * ms)
        h.hub.sweepLiveness(at: h.time) { $0 != ann.link }
        h.drain()
        #expect(annSeenBy(bob.link).last == .reconnecting)

        // Offline, then the idle timeout closes the connection: no flicker back to reconnecting.
        h.advance(20_000 * ms)
        h.hub.sweepLiveness(at: h.time) { $0 != ann.link }
        h.drain()
        let told = annSeenBy(bob.link).count
        #expect(annSeenBy(bob.link).last == .offline)
        h.hub.closed(ann.link, at: h.time)
        h.advance(3_000 * ms)
        #expect(annSeenBy(bob.link).count == told)
        #expect(h.hub.roster(of: h.channel.id).first { $0.userID == "ann" }?.connection == .offline)
    }

    /// A join's check may read a channel the hub has not loaded (made by the CLI): it is loaded then.
    /// One the hub deleted meanwhile stays deleted, and one it knows is not overwritten by the
    /// check's copy.
    @Test func aSilentMemberHeardAgainIsReplayedWhatItMissed() throws {
        let h = Harness()
        let ann = h.join("ann"), bob = h.join("bob"), cat = h.join("cat")
        h.hub.sweepLiveness(at: h.time) { $0 != bob.link }
        h.drain()
        h.send(.floorRequest(), from: ann.link)
        let burst = try #require(h.grantedBurst(ann.link))
        for sequence in UInt16(0) ..< 30 { h.audio(from: ann.link, burst: burst, sequence: sequence, payload: [1, UInt8(sequence)]) }
        let live = h.audio(to: bob.link).count
        h.hub.sweepLiveness(at: h.time) { _ in true }
        for _ in 0 ..< 10 { h.advance(10 * ms) }
        let replayed = h.audio(to: bob.link).dropFirst(live)
        #expect(replayed.map(\.header.sequence) == (0 ..< 30).map { UInt16($0) } && replayed.allSatisfy { $0.header.flags.contains(.catchUp) },
                "\(replayed.map(\.header.sequence))")
        // Then live again, once.
        h.audio(from: ann.link, burst: burst, sequence: 30, payload: [1, 30])
        #expect(h.audio(to: bob.link).last.map { $0.header.sequence == 30 && !$0.header.flags.contains(.catchUp) } == true)
        #expect(h.audio(to: bob.link).filter { $0.header.sequence == 30 }.count == 1)
        h.send(.floorRelease, from: ann.link)

        // Silent when a burst started and back by a control message after it ended.
        h.hub.sweepLiveness(at: h.time) { $0 != cat.link }
        h.drain()
        h.send(.floorRequest(), from: ann.link)
        let second = try #require(h.grantedBurst(ann.link))
        for sequence in UInt16(0) ..< 5 { h.audio(from: ann.link, burst: second, sequence: sequence, payload: [2, UInt8(sequence)]) }
        h.send(.floorRelease, from: ann.link)
        let before = h.audio(to: cat.link).count
        h.send(.setMuted(false), from: cat.link)
        for _ in 0 ..< 3 { h.advance(10 * ms) }
        let again = h.audio(to: cat.link).dropFirst(before)
        #expect(again.filter { $0.header.burst == second }.map(\.header.sequence) == [0, 1, 2, 3, 4], "\(again.map(\.header))")
        // Replayed once: a later sweep that hears it changes nothing.
        h.hub.sweepLiveness(at: h.time) { _ in true }
        h.advance(10 * ms)
        #expect(h.audio(to: cat.link).count == before + again.count)

        // Back with an unsubscription as its first word: Ann's burst is not replayed.
        h.hub.sweepLiveness(at: h.time) { $0 != cat.link }
        h.drain()
        h.send(.floorRequest(), from: ann.link)
        let third = try #require(h.grantedBurst(ann.link))
        for sequence in UInt16(0) ..< 40 { h.audio(from: ann.link, burst: third, sequence: sequence, payload: [3, UInt8(sequence)]) }
        h.send(.floorRelease, from: ann.link)
        let quiet = h.audio(to: cat.link).count
        h.send(.setSubscriptions(unheard: ["ann"]), from: cat.link)
        for _ in 0 ..< 10 { h.advance(10 * ms) }
        #expect(h.audio(to: cat.link).count == quiet, "replayed a talker it unsubscribed from")
    }

    /// The server's own network went: everyone is silent in the same sweep. One `roster` message per
    /// member says so, not one `participant` per silent member to every member.
    @Test func aSweepThatFindsManySilentSendsThemAsOneRoster() {
        let h = Harness()
        let members = (0..<6).map { h.join("m\($0)") }
        let before = h.messages.count
        // Right after a stall of the server itself, silence proves nothing.
        h.hub.sweepLiveness(mayMarkSilent: false, at: h.time) { _ in false }
        h.drain()
        #expect(h.messages.count == before)
        h.hub.sweepLiveness(at: h.time) { _ in false }
        h.drain()
        let sent = h.messages[before...]
        #expect(sent.count == members.count, "one message per member")
        for member in members {
            guard case .roster(let entries)? = h.messages(to: member.link).last else { Issue.record("no roster"); continue }
            #expect(entries.count == members.count && entries.allSatisfy { $0.connection == .reconnecting })
        }
        // And back, the same way, even when the stall guard is on: being heard is never in doubt.
        h.hub.sweepLiveness(mayMarkSilent: false, at: h.time) { _ in true }
        h.drain()
        guard case .roster(let back)? = h.messages(to: members[0].link).last else { Issue.record("no roster"); return }
        #expect(back.count == members.count && back.allSatisfy { $0.connection == .connected })
    }

    @Test func talkerWhoRejoinsWithinTheGraceKeepsTheFloor() {
        let h = Harness()
        let ann = h.join("ann")
        h.send(.floorRequest(), from: ann.link)
        let burst = h.grantedBurst(ann.link)!
        h.audio(from: ann.link, burst: burst, sequence: 0, payload: [1])
        h.hub.closed(ann.link, at: h.time)
        h.advance(500 * ms)
        let again = h.join("ann")
        #expect(again.slot == ann.slot)
        guard case .joined(_, _, _, let talkers, _)? = h.joinedMessage(to: again.link) else { Issue.record("no joined"); return }
        #expect(talkers == [Talker(slot: ann.slot, burst: burst)])
        h.advance(3_000 * ms)
        #expect(!h.floorEvents(to: again.link).contains { $0.kind == .revoked })
    }

    @Test func aTalkerWhoseAudioStopsLosesTheFloorAndTheNextIsGranted() {
        let h = Harness()
        let ann = h.join("ann"), bob = h.join("bob")
        h.send(.floorRequest(), from: ann.link)
        let burst = h.grantedBurst(ann.link)!
        h.send(.floorRequest(), from: bob.link)
        #expect(h.floorEvents(to: bob.link).last?.kind == .queued)
        // Audio every 20 ms for 6 s keeps the floor...
        for sequence in 0 ..< 300 as Range<UInt16> {
            h.advance(20 * ms)
            h.audio(from: ann.link, burst: burst, sequence: sequence, payload: [1, 2, 3])
        }
        #expect(h.floorEvents(to: ann.link).last?.kind == .granted)
        // ...then Ann's phone dies: no close, just silence.
        h.advance(4_999 * ms)
        #expect(!h.floorEvents(to: ann.link).contains { $0.kind == .revoked })
        h.advance(1 * ms)
        let revoked = h.floorEvents(to: ann.link).last { $0.kind == .revoked }
        #expect(revoked?.cause == .disconnected && revoked?.reason == "no audio arrived from you for 5 s")
        #expect(h.floorEvents(to: bob.link).last?.kind == .granted)
        // Logged as long as Ann was heard (6 s of audio), not with the 5 s it took to notice.
        let silent = h.stored.compactMap { if case .logTransmission(let t) = $0, t.endReason == "silent" { return t } else { return nil } }
        #expect(silent.map(\.durationMilliseconds) == [6_000], "\(silent)")
    }
}
