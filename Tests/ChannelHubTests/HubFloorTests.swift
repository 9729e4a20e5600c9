import ChannelProtocol
import ChannelStore
import Foundation
import Testing
import Wire
@testable import ChannelHub

/// The floor through the hub: grants, queues, pre-emption, limits, the transmission log, and the loss talkers are told.
@Suite struct HubFloorTests {
    @Test func aTalkerBackWithAListenOnlyTokenLosesTheFloor() {
        let h = Harness()
        let ann = h.join("ann"), bob = h.join("bob")
        h.send(.floorRequest(), from: ann.link)
        let burst = try! #require(h.grantedBurst(ann.link))
        // Ann's phone rejoins on a new connection with a listen-only token, mid-burst.
        let again = h.join("ann", capabilities: [.listen])
        #expect(again.slot == ann.slot)
        // `joined` first, then the revocation, to the new connection.
        let toAnn = h.messages(to: again.link)
        let joinedAt = toAnn.firstIndex { if case .joined = $0 { return true } else { return false } }
        let revokedAt = toAnn.firstIndex { if case .floor(let e) = $0 { return e.kind == .revoked && e.cause == .notAllowed } else { return false } }
        #expect(joinedAt != nil && revokedAt != nil && joinedAt! < revokedAt!)
        #expect(h.floorEvents(to: bob.link).contains { $0.kind == .ended && $0.slot == ann.slot })
        // Its audio is no longer relayed.
        h.audio(from: again.link, burst: burst, sequence: 1, payload: [1, 2, 3])
        #expect(h.audio(to: bob.link).isEmpty)
        #expect(h.hub.counters.drops(.notFloorHolder) == 1)
        #expect(h.stored.contains { if case .logTransmission(let r) = $0 { return r.endReason == "notAllowed" } else { return false } })
    }

    /// Every answer about a member's place at the floor names its newest request, including the grant
    /// from the queue long after it and the answers of the rate limiter; requests without a number
    /// (older clients) get answers without one.
    @Test func floorAnswersNameTheRequestTheyAnswer() {
        func answer(_ h: Harness, _ member: (link: Link, slot: UInt16)) -> String {
            h.floorEvents(to: member.link).last.map { "\($0.kind) \($0.request.map(String.init) ?? "nil")" } ?? "none"
        }
        var configuration = HubConfiguration.unpaced
        configuration.controlMessagesPerSecond = 5
        configuration.controlMessageBurst = 10
        let h = Harness(configuration: configuration)
        let ann = h.join("ann"), bob = h.join("bob"), cy = h.join("cy", capabilities: [.listen])
        h.send(.floorRequest(request: 7), from: ann.link)
        #expect(answer(h, ann) == "granted 7")
        h.send(.floorRequest(request: 3), from: bob.link)
        #expect(answer(h, bob) == "queued 3")
        h.send(.floorRequest(request: 1), from: cy.link)
        #expect(answer(h, cy) == "denied 1")
        // Bob withdraws request 3 and asks again with 4: the grant that comes when Ann lets go names 4.
        h.send(.floorRelease, from: bob.link)
        h.send(.floorRequest(request: 4), from: bob.link)
        h.send(.floorRelease, from: ann.link)
        let grant = try! #require(h.floorEvents(to: bob.link).last)
        #expect(grant.kind == .granted && grant.request == 4)
        // Over the rate limit, the limiter's answer names the request it answers.
        h.advance(1_000 * ms)
        for n in UInt32(10)..<30 { h.send(.floorRequest(request: n), from: bob.link) }
        #expect(h.hub.counters.controlRateLimited > 0)
        #expect(answer(h, bob) == "granted 29")
        // The repeated grant gives the time left of the burst, not the channel's whole limit.
        #expect(h.floorEvents(to: bob.link).last?.maxBurstSeconds == h.channel.maxBurstSeconds - 1)
        // Not to others, and not unasked: `taken` and `ended` carry no number.
        #expect(h.floorEvents(to: cy.link).filter { $0.kind != .denied }.allSatisfy { $0.request == nil })
        h.send(.floorRequest(), from: ann.link)
        #expect(answer(h, ann) == "queued nil")
    }

    /// A request that won't wait (`queue` false, as `walkie talk` without --wait sends) is denied
    /// busy, with the talker named by the roster, and waits nowhere: the member already waiting
    /// keeps its place.
    @Test func aRequestThatWontWaitIsDeniedBusyAndLeavesTheQueueAlone() throws {
        let h = Harness()
        let ann = h.join("ann"), bob = h.join("bob"), cy = h.join("cy")
        h.send(.floorRequest(), from: ann.link)
        h.send(.floorRequest(), from: bob.link)
        #expect(h.floorEvents(to: bob.link).last?.kind == .queued)
        // The admin API's live roster shows who waits, and where.
        #expect(h.hub.liveRoster(of: h.channel.id).map { "\($0.participant.userID) \($0.queuePosition.map(String.init) ?? "-")" }
                == ["ann -", "bob 1", "cy -"])
        h.send(.floorRequest(request: 5, queue: false), from: cy.link)
        let answer = try #require(h.floorEvents(to: cy.link).last)
        #expect(answer.kind == .denied && answer.cause == .busy && answer.request == 5)
        #expect(h.hub.counters.floorDenials == 1)
        h.send(.floorRelease, from: ann.link)
        #expect(h.floorEvents(to: bob.link).last?.kind == .granted)
        #expect(h.floorEvents(to: cy.link).last?.kind != .granted)
    }

    /// Slots are 16 bits: a channel with 65,535 members refuses the next newcomer as busy (the search
    /// for a free slot used to loop forever on the shared event loop), stored members past the limit
    /// stay out of the hub, and a member already in keeps its slot.
    @Test func aFullChannelRefusesNewcomersInsteadOfHanging() {
        let h = Harness()
        let big = ChannelRecord(name: "Big")
        let members = (0 ..< Int(UInt16.max) + 5).map {
            MemberRecord(channelID: big.id, userID: "u\($0)", displayName: "U\($0)")
        }
        h.hub.upsertChannel(big, members: members, at: h.time)
        let roster = h.hub.roster(of: big.id)
        #expect(roster.count == Int(UInt16.max))
        #expect(Set(roster.map(\.slot)).count == Int(UInt16.max) && !roster.contains { $0.slot == 0 }, "no slot given twice, none 0")
        let late = h.join("newcomer", channel: big.id)
        #expect(h.lastMessage(to: late.link).map { if case .refused(.serverBusy, let why) = $0 { why.contains("65,535") } else { false } } == true)
        let known = h.join("u7", channel: big.id)
        #expect(known.slot == roster.first { $0.userID == "u7" }?.slot)
    }

    @Test func switchingAFullDuplexChannelToHalfDuplexLeavesOneTalker() {
        let h = Harness(mode: .fullDuplex)
        let ann = h.join("ann"), bob = h.join("bob"), cy = h.join("cy", capabilities: [.listen])
        h.send(.floorRequest(), from: ann.link)
        h.advance(10 * ms)
        h.send(.floorRequest(), from: bob.link)
        let bobBurst = try! #require(h.grantedBurst(bob.link))
        var record = h.channel
        record.mode = .halfDuplex
        h.hub.upsertChannel(record, at: h.time)
        h.drain()
        // Bob, granted last, loses the floor; everyone hears of the new mode first.
        #expect(h.floorEvents(to: bob.link).last { $0.kind == .revoked }?.cause == .channelChanged)
        #expect(h.floorEvents(to: ann.link).last { $0.kind == .revoked } == nil)
        let toCy = h.messages(to: cy.link)
        let descriptorAt = toCy.firstIndex { if case .descriptor(let info) = $0 { return info.mode == .halfDuplex } else { return false } }
        let endedAt = toCy.firstIndex { if case .floor(let e) = $0 { return e.kind == .ended && e.slot == bob.slot } else { return false } }
        #expect(descriptorAt != nil && endedAt != nil && descriptorAt! < endedAt!)
        h.audio(from: bob.link, burst: bobBurst, sequence: 0, payload: [9])
        #expect(h.audio(to: cy.link).isEmpty)
        // And a new request now waits, as in any half-duplex channel.
        h.send(.floorRequest(), from: bob.link)
        #expect(h.floorEvents(to: bob.link).last?.kind == .queued)
    }

    @Test func aBurstCutShortByLeavingIsStillLogged() {
        let h = Harness()
        let ann = h.join("ann"), bob = h.join("bob")
        h.send(.floorRequest(), from: ann.link)
        #expect(h.grantedBurst(ann.link) != nil)
        h.send(.leave, from: ann.link)
        let logged = h.stored.compactMap { if case .logTransmission(let t) = $0, t.endReason != TransmissionRecord.inProgress { return t } else { return nil } }
        #expect(logged.map(\.userID) == ["ann"] && logged.first?.endReason == "left", "\(logged)")
        // The burst was logged as it started too, with the same start: the end replaces that record.
        let started = h.stored.compactMap { if case .logTransmission(let t) = $0, t.endReason == TransmissionRecord.inProgress { return t } else { return nil } }
        #expect(started.map(\.startedAt) == logged.map(\.startedAt) && started.first?.userID == "ann", "\(started)")
        #expect(h.floorEvents(to: bob.link).contains { $0.kind == .ended && $0.slot == ann.slot })
    }

    /// A burst going on has its length written every second (the driver asks once a second), so a
    /// server killed during it leaves its length in the log to within about a second, not 0; the
    /// end replaces it.
    @Test func aLongBurstHasItsLengthSoFarLoggedEverySecond() {
        var configuration = HubConfiguration.unpaced
        configuration.talkerSilenceLimit = 0  // no audio in this test
        let h = Harness(configuration: configuration)
        let ann = h.join("ann")
        _ = h.join("bob")
        h.send(.floorRequest(), from: ann.link)
        #expect(h.grantedBurst(ann.link) != nil)
        func progress() -> [TransmissionRecord] {
            h.stored.compactMap { if case .logTransmission(let t) = $0, t.endReason == TransmissionRecord.inProgress { t } else { nil } }
        }
        for _ in 0 ..< 12 {
            h.advance(1_000 * ms)
            h.hub.logBurstProgress(at: h.time)
            h.drain()
        }
        let written = progress()
        #expect(written.map(\.durationMilliseconds) == (0...12).map { $0 * 1_000 }, "the start, then each second: \(written)")
        #expect(Set(written.map(\.startedAt)).count == 1 && written.allSatisfy { $0.userID == "ann" })
        h.send(.floorRelease, from: ann.link)
        h.hub.logBurstProgress(at: h.time)
        h.drain()
        #expect(progress().count == 13, "nothing more once it ended")
        #expect(h.stored.contains { if case .logTransmission(let t) = $0 { t.endReason == "released" && t.durationMilliseconds == 12_000 } else { false } })
    }

    @Test func burstNumbersStartWhereConfiguredAndWrap() throws {
        var configuration = HubConfiguration.unpaced
        configuration.firstBurst = { _ in 65_535 }
        let h = Harness(configuration: configuration)
        let ann = h.join("ann"), bob = h.join("bob")
        h.send(.floorRequest(), from: ann.link)
        #expect(h.grantedBurst(ann.link) == 65_535)
        h.send(.floorRelease, from: ann.link)
        h.send(.floorRequest(), from: ann.link)
        let wrapped = try #require(h.grantedBurst(ann.link))
        #expect(wrapped == 0)
        h.audio(from: ann.link, burst: wrapped, sequence: 0, payload: [1, 2, 3])
        #expect(h.audio(to: bob.link).map(\.payload) == [[1, 2, 3]], "audio of the wrapped burst is relayed")
    }

    /// Slots wrap past 65535 to 1: slot 0 is never a member's, and the last slot is used.
    @Test func slotsWrapWithoutZero() {
        let h = Harness()
        h.hub.channels[h.channel.id]!.nextSlot = 65_534
        let ann = h.join("ann"), bob = h.join("bob"), cat = h.join("cat")
        #expect([ann.slot, bob.slot, cat.slot] == [65_534, 65_535, 1])
        // A slot still held is skipped.
        h.hub.channels[h.channel.id]!.nextSlot = 65_535
        #expect(h.join("dan").slot == 2, "65535 (bob) and 1 (cat) are taken")
    }

    @Test func higherPriorityPreemptsWithAReason() {
        let h = Harness()
        let ann = h.join("ann", priority: 1), chief = h.join("chief", priority: 200)
        h.send(.floorRequest(), from: ann.link)
        h.send(.floorRequest(), from: chief.link)
        let revoked = h.floorEvents(to: ann.link).first { $0.kind == .revoked }
        #expect(revoked?.cause == .preempted)
        #expect(revoked?.reason?.contains("Chief") == true)
        #expect(h.floorEvents(to: chief.link).last?.kind == .granted)
        #expect(h.stored.contains { if case .logTransmission(let t) = $0 { return t.endReason == "preempted" } else { return false } })
    }

    @Test func listenOnlyMemberIsDeniedWithNotAllowed() {
        let h = Harness()
        let cat = h.join("cat", capabilities: [.listen])
        h.send(.floorRequest(), from: cat.link)
        #expect(h.floorEvents(to: cat.link).last == FloorEvent(kind: .denied, slot: cat.slot, cause: .notAllowed,
                                                               reason: "your token allows listening only"))
        #expect(h.hub.counters.floorDenials == 1)
    }

    @Test func maximumBurstRevokes() {
        var configuration = HubConfiguration.unpaced
        configuration.disconnectGrace = 2_000 * ms
        let h = Harness(configuration: configuration)
        var record = h.channel
        record.maxBurstSeconds = 5
        h.hub.upsertChannel(record, at: h.time)
        let ann = h.join("ann")
        h.send(.floorRequest(), from: ann.link)
        h.audio(from: ann.link, burst: h.grantedBurst(ann.link)!, sequence: 0, payload: [1])
        h.advance(4_999 * ms)
        #expect(h.floorEvents(to: ann.link).last?.kind == .granted)
        h.advance(1 * ms)
        #expect(h.floorEvents(to: ann.link).contains { $0.kind == .revoked && $0.cause == .maxBurstReached })
    }

    @Test func aMaximumBurstOutOfRangeFromTheDatabaseIsClampedNotTrapped() {
        // A row edited in the sqlite3 shell skips the store's validation.
        let h = Harness()
        for (seconds, expected) in [(-1, 1), (0, 1), (Int.max, 600)] {
            var record = h.channel
            record.maxBurstSeconds = seconds
            h.hub.upsertChannel(record, at: h.time)
            let ann = h.join("ann\(seconds)")
            h.send(.floorRequest(), from: ann.link)
            let granted = h.floorEvents(to: ann.link).last { $0.kind == .granted }
            #expect(granted?.maxBurstSeconds == expected, "\(seconds)")
            h.send(.floorRelease, from: ann.link)
        }
    }

    @Test func theTalkerIsToldTheWorstLossAmongItsListeners() {
        let h = Harness()
        let ann = h.join("ann"), bob = h.join("bob"), cat = h.join("cat")
        // Reported before anyone talks: kept, and told with the next grant.
        h.send(.receptionReport(lossPercent: 8), from: bob.link)
        #expect(lossTold(h, ann.link).isEmpty)
        h.send(.floorRequest(), from: ann.link)
        #expect(h.floorEvents(to: ann.link).last?.kind == .granted)
        #expect(h.lastMessage(to: ann.link) == .receptionLoss(lossPercent: 8))
        // A better listener changes nothing; the worse one recovering leaves the next worst.
        h.send(.receptionReport(lossPercent: 3), from: cat.link)
        #expect(lossTold(h, ann.link) == [8])
        h.send(.receptionReport(lossPercent: 0), from: bob.link)
        #expect(lossTold(h, ann.link) == [8, 3])
        // A listener that drops takes its figure along; listeners never hear about it.
        h.hub.closed(cat.link, at: h.time)
        h.drain()
        #expect(lossTold(h, ann.link) == [8, 3, 0])
        #expect(lossTold(h, bob.link).isEmpty && lossTold(h, cat.link).isEmpty)
        #expect(h.hub.counters.receptionReports == 3)
        // The same figure again is no change, and a member who may not listen doesn't count, though its
        // figure is kept for when a new token lets it listen.
        h.send(.receptionReport(lossPercent: 0), from: bob.link)
        let dan = h.join("dan", capabilities: [.talk])
        h.send(.receptionReport(lossPercent: 40), from: dan.link)
        #expect(lossTold(h, ann.link) == [8, 3, 0])
        #expect(h.hub.counters.receptionReports == 4)
    }

    /// What an operator's roster shows: each connected listener's last figure, none for a member who
    /// may not listen or is not connected, and a new session's figure starts again at 0.
    @Test func theOperatorsRosterShowsEachConnectedListenersLoss() {
        let h = Harness()
        h.join("ann")
        let bob = h.join("bob"), dan = h.join("dan", capabilities: [.talk])
        h.send(.receptionReport(lossPercent: 14), from: bob.link)
        h.send(.receptionReport(lossPercent: 30), from: dan.link)
        func loss() -> [String: Int?] {
            Dictionary(uniqueKeysWithValues: h.hub.liveRoster(of: h.channel.id).map { ($0.participant.userID, $0.receptionLoss) })
        }
        #expect(loss() == ["ann": 0, "bob": 14, "dan": nil])
        #expect(h.hub.liveRoster(of: h.channel.id).map(\.participant) == h.hub.roster(of: h.channel.id))
        h.hub.closed(bob.link, at: h.time)
        h.drain()
        #expect(loss() == ["ann": 0, "bob": nil, "dan": nil], "bob is reconnecting: no figure")
        _ = h.join("bob")
        #expect(loss()["bob"] == 0)
        #expect(h.hub.liveRoster(of: UUID()).isEmpty)
    }

    @Test func eachTalkerHearsOnlyOfItsOwnListenersAndASessionStartsAtZero() {
        let h = Harness(mode: .fullDuplex)
        let ann = h.join("ann"), bob = h.join("bob"), cat = h.join("cat")
        h.send(.setSubscriptions(unheard: ["bob"]), from: cat.link)
        h.send(.receptionReport(lossPercent: 20), from: cat.link)
        h.send(.floorRequest(), from: ann.link)
        h.send(.floorRequest(), from: bob.link)
        // Cat, the lossy one, hears Ann but not Bob: only Ann's encoder needs FEC for her.
        #expect(lossTold(h, ann.link) == [20])
        #expect(lossTold(h, bob.link).isEmpty)
        // Ann's connection drops and she rejoins within the grace, still talking: her new session
        // starts at 0 on both sides, so she is told again.
        h.hub.closed(ann.link, at: h.time)
        h.drain()
        let again = h.join("ann")
        #expect(lossTold(h, again.link) == [20])
        // A listener that drops takes its figure along, and comes back at 0.
        h.hub.closed(cat.link, at: h.time)
        h.drain()
        _ = h.join("cat")
        #expect(lossTold(h, again.link) == [20, 0])
    }

    @Test func aRepeatedRequestFromTheTalkerIsTheSameBurst() {
        let h = Harness()
        let ann = h.join("ann")
        h.send(.floorRequest(), from: ann.link)
        h.advance(1_000 * ms)
        h.send(.floorRequest(), from: ann.link)
        #expect(h.hub.counters.bursts == 1 && h.hub.counters.floorGrants == 1)
        #expect(h.hub.channels[h.channel.id]!.recordings.count == 1)
        h.advance(1_000 * ms)
        h.send(.floorRelease, from: ann.link)
        let logged = h.stored.compactMap { if case .logTransmission(let t) = $0, t.endReason != TransmissionRecord.inProgress { return t } else { return nil } }
        #expect(logged.map(\.durationMilliseconds) == [2_000])
        #expect(h.hub.channels[h.channel.id]!.recordings.isEmpty)
    }

    @Test func fullDuplexAllowsSeveralTalkers() {
        let h = Harness(mode: .fullDuplex)
        let members = (0..<5).map { h.join("m\($0)") }
        for member in members { h.send(.floorRequest(), from: member.link) }
        #expect(members.prefix(4).allSatisfy { h.grantedBurst($0.link) != nil })
        #expect(h.floorEvents(to: members[4].link).last?.kind == .queued)
    }

    func lossTold(_ h: Harness, _ link: Link) -> [Int] {
        h.messages(to: link).compactMap { if case .receptionLoss(let percent) = $0 { return percent } else { return nil } }
    }
}
