import ChannelProtocol
import ChannelStore
import Foundation
import Testing
import Wire
@testable import ChannelHub

/// Joins: replaced connections, rosters sent in chunks, and refusals.
@Suite struct HubJoinTests {
    /// A client sends what is beyond the first protocol only to a server that says it takes it.
    @Test func joinedAnnouncesWhatTheServerUnderstands() {
        let h = Harness()
        let ann = h.join("ann")
        guard case .joined(_, _, _, _, let features)? = h.lastMessage(to: ann.link) else { Issue.record("no joined"); return }
        #expect(features == [.receptionReport])
    }

    @Test func sameUserOnANewConnectionReplacesTheOld() {
        let h = Harness()
        let first = h.join("ann")
        let second = h.join("ann")
        #expect(first.slot == second.slot)
        #expect(h.messages(to: first.link).last == .refused(code: .replaced, reason: "you joined this channel from another connection"))
        #expect(h.closes.contains { $0.0 == first.link && $0.1 == .replaced })
        #expect(h.hub.roster(of: h.channel.id).count == 1)
    }

    /// A replaced connection's place in the queue goes with it, as a close would have taken it: the new
    /// session starts idle, and a grant it never asked for would be a phantom burst (and wake pushes).
    /// A talker replaced within its grace keeps the floor for its client to confirm or release.
    @Test func aReplacedConnectionLosesItsQueuePlaceButATalkerKeepsTheFloor() {
        let h = Harness()
        let ann = h.join("ann"), bob = h.join("bob"), cat = h.join("cat")
        h.send(.floorRequest(), from: ann.link)
        h.send(.floorRequest(), from: bob.link)
        h.send(.floorRequest(), from: cat.link)
        #expect(h.floorEvents(to: cat.link).last?.position == 2)
        let bobAgain = h.join("bob")
        #expect(h.floorEvents(to: cat.link).last?.position == 1, "cat moved up")
        #expect(!h.floorEvents(to: bobAgain.link).contains { $0.kind == .queued })
        let annAgain = h.join("ann")
        #expect(h.floorEvents(to: cat.link).last?.position == 1, "ann still holds the floor: \(h.floorEvents(to: cat.link).suffix(2))")
        h.send(.floorRelease, from: annAgain.link)
        #expect(h.floorEvents(to: cat.link).last?.kind == .granted, "the next in the queue is cat, not bob's old place")
        #expect(!h.floorEvents(to: bobAgain.link).contains { $0.kind == .granted })
    }

    /// `joined` carries the first chunk; the rest wait until the driver says the connection has room,
    /// and then show the members as they are then: one that left meanwhile is not in them.
    @Test func aLargeRosterArrivesInChunksThatFitAControlMessage() {
        let h = Harness()
        let first = h.join("member-0")
        for index in 1..<300 { h.join("member-\(index)") }
        let last = h.join("last")
        #expect(h.messages(to: last.link).filter { if case .roster = $0 { true } else { false } }.isEmpty)
        #expect(h.hub.linksAwaitingRoster.contains(last.link))
        h.send(.leave, from: first.link)
        var more = 0
        while h.hub.continueRoster(last.link) { more += 1 }
        h.drain()
        // 173 entries after joined's 128 (member-0 left meanwhile, already sent): two chunks.
        #expect(more == 2 && !h.hub.isSendingRoster(to: last.link) && !h.hub.continueRoster(last.link))
        let sent = h.messages(to: last.link).filter {
            switch $0 { case .joined, .roster: return true; default: return false }
        }
        var entries: [RosterMember] = []
        for message in sent {
            switch message {
            case .joined(_, _, let roster, _, _), .roster(let roster):
                #expect(roster.count <= ControlLimits.rosterChunk)
                #expect(MessageCodec().encode(message).count < ControlLimits.maxMessageBytes / 2)
                entries += roster
            default: break
            }
        }
        #expect(sent.count == 3)
        // member-0 went with the first chunk, in joined, before it left; its participantLeft followed.
        #expect(Set(entries.map(\.userID)).count == 301)
        #expect(h.messages(to: last.link).contains(.participantLeft(slot: first.slot, userID: "member-0")))
    }

    /// A member that leaves before its chunk is made is not in it.
    @Test func aRosterChunkLeavesOutWhoLeftMeanwhile() {
        let h = Harness()
        let members = (0..<300).map { h.join("member-\($0)") }
        let last = h.join("last")
        h.send(.leave, from: members[299].link)
        while h.hub.continueRoster(last.link) {}
        h.drain()
        var entries: [String] = []
        for message in h.messages(to: last.link) {
            if case .joined(_, _, let roster, _, _) = message { entries += roster.map(\.userID) }
            if case .roster(let roster) = message { entries += roster.map(\.userID) }
        }
        #expect(entries.count == 300 && !entries.contains("member-299") && entries.first == "last")
    }

    /// The joiner's own entry and the talkers' ride in `joined`, even when the roster takes several
    /// messages: the client's transmission mode and the talker's name come from them.
    @Test func joinedCarriesTheJoinersAndTheTalkersEntries() {
        let h = Harness()
        let talker = h.join("talker")
        for index in 0..<300 { h.join("member-\(index)") }
        h.send(.floorRequest(), from: talker.link)
        let last = h.join("last", capabilities: [.listen])
        guard case .joined(_, let you, let roster, let talkers, _)? = h.messages(to: last.link).first(where: { if case .joined = $0 { true } else { false } }) else {
            Issue.record("no joined")
            return
        }
        #expect(talkers.map(\.slot) == [talker.slot])
        #expect(roster.prefix(2).map(\.slot) == [you, talker.slot] && roster[0].canTalk == false)
        #expect(roster.count < 302 && h.hub.linksAwaitingRoster.contains(last.link))
    }

    /// A session that ends stops its roster: nothing more is made for it.
    @Test func aRosterStopsWithItsSession() {
        let h = Harness()
        for index in 0..<300 { h.join("member-\(index)") }
        let last = h.join("last")
        h.hub.closed(last.link, at: h.time)
        #expect(!h.hub.linksAwaitingRoster.contains(last.link) && !h.hub.continueRoster(last.link))
        let again = h.join("late")
        h.send(.leave, from: again.link)
        #expect(!h.hub.continueRoster(again.link) && !h.hub.linksAwaitingRoster.contains(again.link))
    }

    @Test func joinToAMissingChannelIsRefused() {
        let h = Harness()
        let ghost = h.join("ann", channel: UUID())
        guard case .refused(.channelNotFound, _)? = h.lastMessage(to: ghost.link) else { Issue.record("not refused"); return }
        #expect(h.closes.contains { $0.0 == ghost.link && $0.1 == .refused })
    }
}
