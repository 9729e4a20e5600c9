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
