import ChannelProtocol
import Foundation
import ParticipantClaims
import ParticipantTokens
import Testing
@testable import PTTClient

extension ChannelSessionTests {
    /// The server drops control messages over its rate and says so at most once a second, not which.
    /// What it must know (muted, subscriptions, push token) is said again once the budget refills.
    @Test func whatTheServerDroppedForItsRateIsSaidAgain() throws {
        var s = joinedSession()
        s.setMuted(true)
        s.applySubscriptions(["bob": .none])
        #expect(sent(s.takeOutputs()).count == 2)
        // Both were over the rate: the server's entry still says not muted.
        s.received(.error(code: .rateLimited, reason: "more than 20 control messages a second"))
        s.received(.error(code: .rateLimited, reason: "more than 20 control messages a second"))
        let out = s.takeOutputs()
        #expect(out.filter { $0 == .scheduleResync(milliseconds: 1_500) }.count == 1, "one resync for a run of notices")
        s.resyncDue()
        let again = sent(s.takeOutputs())
        #expect(again.contains(.setMuted(true)))
        #expect(again.contains(.setSubscriptions(unheard: ["bob"])))
        #expect(again.contains { if case .registerPushToken(let token, _) = $0 { token == "abcd" } else { false } })
        // Once the server's entry agrees, muted isn't sent again.
        s.received(.participant(RosterMember(slot: 1, userID: "ann", name: "Ann", muted: true)))
        _ = s.takeOutputs()
        s.received(.error(code: .rateLimited, reason: "again"))
        s.resyncDue()
        #expect(!sent(s.takeOutputs()).contains(.setMuted(true)))
        // A token renewal dropped too would block every later one: it is offered again.
        try s.renewToken("t2", channelID)
        #expect(sent(s.takeOutputs()) == [.renewToken(token: "t2")])
        s.received(.error(code: .rateLimited, reason: "again"))
        s.resyncDue()
        #expect(sent(s.takeOutputs()).contains(.renewToken(token: "t2")))
    }

    @Test func mutingPlaybackShowsInTheRosterAndEveryNewSessionSaysItAgain() {
        var s = joinedSession()
        s.setMuted(true)
        #expect(sent(s.takeOutputs()) == [.setMuted(true)])
        s.setMuted(true)
        #expect(sent(s.takeOutputs()).isEmpty, "the same value again sends nothing")
        // A new session (the server restarted and forgot): its own entry says unmuted, so it is said again.
        s.transportReconnecting()
        s.transportConnected()
        s.received(.joined(channel: ChannelInfo(id: channelID, name: "Ops", image: nil, mode: .halfDuplex, maxBurstSeconds: 60), you: 1,
                           roster: [participant(1, "Ann"), participant(2, "Bob")], talkers: []))
        #expect(sent(s.takeOutputs()).contains(.setMuted(true)))
        // Unmuted while the connection is down: nothing to send it on, so the next join says it.
        s.transportReconnecting()
        s.setMuted(false)
        #expect(!sent(s.takeOutputs()).contains(.setMuted(false)))
        s.transportConnected()
        var ann = participant(1, "Ann")
        ann.muted = true
        s.received(.joined(channel: ChannelInfo(id: channelID, name: "Ops", image: nil, mode: .halfDuplex, maxBurstSeconds: 60), you: 1,
                           roster: [ann, participant(2, "Bob")], talkers: []))
        #expect(sent(s.takeOutputs()).contains(.setMuted(false)))
        // A join whose entry already agrees sends nothing.
        s.transportReconnecting()
        s.transportConnected()
        s.received(.joined(channel: ChannelInfo(id: channelID, name: "Ops", image: nil, mode: .halfDuplex, maxBurstSeconds: 60), you: 1,
                           roster: [participant(1, "Ann"), participant(2, "Bob")], talkers: []))
        #expect(!sent(s.takeOutputs()).contains { if case .setMuted = $0 { true } else { false } })
    }

    @Test func receptionIsReportedWhenItMovesAndListenerLossAdaptsTheEncoder() {
        var s = joinedSession()
        func reported(_ percent: Int) -> [ClientMessage] {
            s.receptionMeasured(percent)
            return sent(s.takeOutputs())
        }
        #expect(reported(0).isEmpty, "a clean link says nothing")
        #expect(reported(1).isEmpty, "nor does noise under 2 points")
        #expect(reported(6) == [.receptionReport(lossPercent: 6)])
        #expect(reported(7).isEmpty)
        #expect(reported(4) == [.receptionReport(lossPercent: 4)])
        #expect(reported(0) == [.receptionReport(lossPercent: 0)], "back to clean is always said")
        // The server's figure for this member's listeners drives the encoder, and the app hears of it.
        s.received(.receptionLoss(lossPercent: 9))
        let out = s.takeOutputs()
        #expect(out.contains(.adaptToListenerLoss(9)) && out.contains(.event(.listenerLoss(9))))
        // A new session starts both figures at 0 on this side as on the server's.
        _ = reported(5)
        s.transportReconnecting()
        #expect(reported(20).isEmpty, "nothing is reported while not joined")
        s.transportConnected()
        s.received(.joined(channel: ChannelInfo(id: channelID, name: "Ops", image: nil, mode: .halfDuplex, maxBurstSeconds: 60), you: 1,
                           roster: [participant(1, "Ann")], talkers: [], features: [.receptionReport]))
        let rejoined = s.takeOutputs()
        #expect(rejoined.contains(.adaptToListenerLoss(0)))
        #expect(sent(rejoined).contains(.receptionReport(lossPercent: 20)), "the latest figure goes out with the new session")
        #expect(reported(20).isEmpty)
        // A server that doesn't announce the message (one older than it) gets none, so it has nothing
        // to refuse: no reports, and no notice.
        s.transportReconnecting()
        s.transportConnected()
        s.received(.joined(channel: ChannelInfo(id: channelID, name: "Ops", image: nil, mode: .halfDuplex, maxBurstSeconds: 60), you: 1,
                           roster: [participant(1, "Ann")], talkers: []))
        let older = s.takeOutputs()
        #expect(!older.contains { if case .event(.notice) = $0 { return true } else { return false } })
        #expect(reported(0).isEmpty && reported(30).isEmpty)
    }

    /// `receptionReport` goes only to a server whose `joined` announces it (an older one would answer
    /// it with an error); names this client doesn't know are ignored.
    @Test func receptionIsReportedOnlyToAServerThatAnnouncesIt() {
        func joined(features: [ProtocolFeature]) -> ChannelSession {
            var s = ChannelSession()
            s.requestJoin(channelID, descriptor: descriptor, credentials: credentials, reason: .developerRequest)
            s.transportConnected()
            s.receptionMeasured(12)  // from a connection before: said once joined, to a server that takes it
            s.received(.joined(channel: ChannelInfo(id: channelID, name: "Ops", image: nil, mode: .halfDuplex, maxBurstSeconds: 60), you: 1,
                               roster: [participant(1, "Ann")], talkers: [], features: features))
            return s
        }
        func reports(_ outputs: [SessionOutput]) -> [ClientMessage] {
            sent(outputs).filter { if case .receptionReport = $0 { true } else { false } }
        }
        var older = joined(features: [])
        #expect(reports(older.takeOutputs()).isEmpty)
        older.receptionMeasured(30)
        #expect(reports(older.takeOutputs()).isEmpty)
        var unknown = joined(features: [ProtocolFeature(rawValue: "somethingNewer")])
        unknown.receptionMeasured(30)
        #expect(reports(unknown.takeOutputs()).isEmpty)
        var current = joined(features: [ProtocolFeature(rawValue: "somethingNewer"), .receptionReport])
        #expect(reports(current.takeOutputs()) == [.receptionReport(lossPercent: 12)])
        current.receptionMeasured(30)
        #expect(reports(current.takeOutputs()) == [.receptionReport(lossPercent: 30)])
    }

    @Test func leavingPutsTheEncoderBackWithoutAnnouncingIt() {
        var s = joinedSession()
        s.received(.receptionLoss(lossPercent: 9))
        _ = s.takeOutputs()
        s.leave(channelID)
        let out = s.takeOutputs()
        #expect(out.contains(.adaptToListenerLoss(0)))
        #expect(!out.contains { if case .event(.listenerLoss) = $0 { return true } else { return false } })
    }

    @Test func aLostOrUnreachableServerIsRetriedWithBackoffButAFreshJoinFails() {
        // Restored after a restart, maybe before the network is up: keep the channel and retry.
        var r = ChannelSession()
        r.requestJoin(channelID, descriptor: descriptor, credentials: credentials, reason: .channelRestoration)
        _ = r.takeOutputs()
        let delays = (0..<8).map { _ -> Int? in
            r.transportFailed("no answer")
            let out = r.takeOutputs()
            r.reconnectDue()
            #expect(r.takeOutputs().contains(.connect(credentials)))
            return out.compactMap { if case .scheduleReconnect(let ms) = $0 { return ms } else { return nil } }.first
        }
        #expect(delays == [500, 1000, 2000, 4000, 8000, 16000, 30000, 30000])
        #expect(r.channel == channelID)
        // Joined once, then the server went away for good: the same.
        var j = joinedSession()
        j.transportFailed("gone")
        let out = j.takeOutputs()
        #expect(out.contains(.scheduleReconnect(milliseconds: 500)) && j.serviceStatus == .unavailable && j.channel == channelID)
        // A join the app just asked for reports the failure instead.
        var f = ChannelSession()
        f.requestJoin(channelID, descriptor: descriptor, credentials: credentials, reason: .developerRequest)
        _ = f.takeOutputs()
        f.transportFailed("no answer")
        #expect(delegateCalls(f.takeOutputs()) == [.failedToJoin(channelID, ChannelError(.unknown, "no answer"))])
        #expect(f.channel == nil)
    }

    @Test func subscriptionsOnlyGoOutWhenTheyChange() {
        var s = joinedSession()
        s.applySubscriptions(["bob": .none])
        #expect(sent(s.takeOutputs()) == [.setSubscriptions(unheard: ["bob"])])
        s.applySubscriptions(["bob": .none])
        #expect(sent(s.takeOutputs()).isEmpty)
        #expect(s.rosterEntries.first { $0.userID == "bob" }?.subscribe == SubscribeType.none)
        // Unheard talkers don't become the active speaker.
        s.received(.floor(FloorEvent(kind: .taken, slot: 2, burst: 1)))
        #expect(s.activeRemoteParticipant == nil)
    }

    /// In a big channel the roster comes in several messages, with floor events between them: the
    /// mode follows this member's own entry when it arrives, and a talker announced before its
    /// entry is named once the entry comes, or stops being shown if this member doesn't hear it.
    @Test func entriesThatArriveAfterJoinedCorrectModeAndTalker() throws {
        var s = ChannelSession()
        s.requestJoin(channelID, descriptor: descriptor, credentials: credentials, reason: .developerRequest)
        s.transportConnected()
        s.received(.joined(channel: ChannelInfo(id: channelID, name: "Ops", image: nil, mode: .halfDuplex, maxBurstSeconds: 60), you: 1,
                           roster: [], talkers: []))
        _ = s.takeOutputs()
        s.received(.roster([participant(1, "Ann", talk: false)]))
        #expect(s.takeOutputs().contains(.event(.transmissionMode(.listenOnly))))
        s.received(.floor(FloorEvent(kind: .taken, slot: 7, burst: 1)))
        #expect(s.activeRemoteParticipant?.name == "member 7")
        s.received(.roster([participant(7, "Cy")]))
        #expect(s.activeRemoteParticipant == (try Participant(name: "Cy")))
        s.received(.floor(FloorEvent(kind: .ended, slot: 7, burst: 1)))
        s.applySubscriptions(["dan": .none])
        s.received(.floor(FloorEvent(kind: .taken, slot: 8, burst: 1)))
        #expect(s.activeRemoteParticipant?.name == "member 8")
        s.received(.participant(participant(8, "Dan")))
        #expect(s.activeRemoteParticipant == nil && s.remoteTalkers.isEmpty)
    }

    @Test func serviceUpdateBudgetIsSixAnHourFromTheFirst() {
        var budget = ServiceUpdateBudget()
        let t0 = Date(timeIntervalSince1970: 1_000_000)
        let left = (0..<7).map { budget.spend(highPriority: true, at: t0.addingTimeInterval(Double($0) * 60)) }
        #expect(left == [5, 4, 3, 2, 1, 0, 0])
        #expect(budget.spend(highPriority: false, at: t0.addingTimeInterval(600)) == 0)
        #expect(budget.spend(highPriority: true, at: t0.addingTimeInterval(3600)) == 5)
    }
}
