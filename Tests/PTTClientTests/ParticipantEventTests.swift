import ChannelProtocol
import Foundation
@testable import PTTClient
import Testing

/// Per-person events beside the roster snapshots, as a stage renderer has them (IVS).
@Suite struct ParticipantEventTests {
    func personal(_ outputs: [SessionOutput]) -> [String] {
        outputs.compactMap {
            switch $0 {
            case .event(.participantJoined(let e)): "joined \(e.userID)"
            case .event(.participantLeft(let e)): "left \(e.userID)"
            case .event(.participantPublishState(let user, let state)): "\(user) \(state.rawValue)"
            case .event(.participantSubscribeState(let user, let state)): "\(user) \(state.rawValue)"
            default: nil
            }
        }
    }

    func joined(_ roster: [RosterMember]) -> ServerMessage {
        .joined(channel: ChannelInfo(id: channelID, name: "Ops", image: nil, mode: .halfDuplex, maxBurstSeconds: 60), you: 1,
                roster: roster, talkers: [], features: [.receptionReport])
    }

    @Test func everyoneThereAtTheJoinThenEachChange() {
        var s = ChannelSession()
        s.requestJoin(channelID, descriptor: descriptor, credentials: credentials, reason: .developerRequest)
        s.transportConnected()
        s.received(joined([participant(1, "Ann"), participant(2, "Bob")]))
        #expect(personal(s.takeOutputs()) == ["joined bob"], "everyone there but this member")
        s.received(.participant(participant(3, "Cy")))
        #expect(personal(s.takeOutputs()) == ["joined cy"])
        s.received(.participant(RosterMember(slot: 3, userID: "cy", name: "Cy", talking: true)))
        #expect(personal(s.takeOutputs()) == ["cy published"])
        s.received(.participant(RosterMember(slot: 3, userID: "cy", name: "Cy", connection: .offline, talking: false)))
        #expect(personal(s.takeOutputs()) == ["cy notPublished"], "offline is no leave")
        s.applySubscriptions(["cy": .none, "bob": .audio])
        #expect(personal(s.takeOutputs()) == ["cy notSubscribed"])
        s.received(.participantLeft(slot: 3, userID: "cy"))
        #expect(personal(s.takeOutputs()) == ["left cy"])
    }

    @Test func aRejoinTellsOnlyWhatChangedWhileAway() {
        var s = joinedSession()  // Ann (this member) and Bob
        s.received(.participant(participant(3, "Cy")))
        _ = s.takeOutputs()
        // Reconnected: the roster comes again, in two chunks; Bob left meanwhile, Dee joined.
        s.transportFailed("no answer")
        s.reconnectDue()
        s.transportConnected()
        _ = s.takeOutputs()
        s.received(joined([participant(1, "Ann")]))
        var out = s.takeOutputs()
        #expect(personal(out).isEmpty, "nobody is taken for gone before the roster is whole: \(personal(out))")
        guard case .scheduleRosterSettle(_, let first)? = out.first(where: { if case .scheduleRosterSettle = $0 { true } else { false } }) else {
            Issue.record("no settle scheduled: \(out)")
            return
        }
        s.received(.roster([participant(3, "Cy"), participant(4, "Dee")]))
        out = s.takeOutputs()
        #expect(personal(out) == ["joined dee"])
        guard case .scheduleRosterSettle(_, let second)? = out.first(where: { if case .scheduleRosterSettle = $0 { true } else { false } }) else {
            Issue.record("no new settle after a chunk: \(out)")
            return
        }
        s.rosterSettled(generation: first)
        #expect(personal(s.takeOutputs()).isEmpty, "an older wait is not the last")
        s.rosterSettled(generation: second)
        #expect(personal(s.takeOutputs()) == ["left bob"])
    }
}

/// The active speaker's picture: the roster's, and the app's when it set one.
@Suite struct SpeakerImageTests {
    @Test func theRostersPictureShowsAndTheAppsStays() {
        var s = joinedSession()
        s.received(.participant(RosterMember(slot: 2, userID: "bob", name: "Bob", image: "https://example.org/bob.png")))
        s.received(.floor(FloorEvent(kind: .taken, slot: 2, burst: 5)))
        #expect(s.rosterEntries.first { $0.userID == "bob" }?.image == ChannelImage(url: "https://example.org/bob.png"))
        #expect(s.takeOutputs().contains(.event(.activeRemoteParticipant(try! Participant(name: "Bob", image: ChannelImage(url: "https://example.org/bob.png"))))))
        let own = ChannelImage(url: "https://contacts.example.org/bob.jpg")
        try? s.setActiveRemoteParticipant(try! Participant(name: "Bob", image: own), channelID)
        _ = s.takeOutputs()
        // The next floor events and roster changes for Bob keep the app's picture.
        s.received(.participant(RosterMember(slot: 2, userID: "bob", name: "Bob", image: "https://example.org/bob.png", talking: true)))
        s.received(.floor(FloorEvent(kind: .ended, slot: 2, burst: 5)))
        s.received(.floor(FloorEvent(kind: .taken, slot: 2, burst: 6)))
        let shown = s.takeOutputs().compactMap { if case .event(.activeRemoteParticipant(let p?)) = $0 { p } else { nil } }
        #expect(!shown.isEmpty && shown.allSatisfy { $0.image == own }, "\(shown)")
    }
}
