import ChannelProtocol
import Foundation
import ParticipantClaims
import ParticipantTokens
import Testing
@testable import PTTClient

extension ChannelSessionTests {
    /// Suspending ends a request still waiting (the app hears it), and answers owed to requests
    /// withdrawn on the old connection are not skipped on the next one, where they never come.
    @Test func suspendingEndsAWaitingRequestAndForgetsOwedAnswers() {
        var s = joinedSession()
        s.beginTransmitting(channelID, source: .userRequest)
        s.stopTransmitting(channelID, source: .userRequest)  // withdrawn unanswered: one answer owed
        s.beginTransmitting(channelID, source: .userRequest)
        _ = s.takeOutputs()
        s.suspend()
        var out = s.takeOutputs()
        #expect(delegateCalls(out).contains { if case .failedToBegin(_, let e) = $0 { return e.message.contains("suspended") } else { return false } })
        // Withdrawn on the server too, before the connection closes.
        let release = out.firstIndex(of: .send(.floorRelease)), disconnect = out.firstIndex(of: .disconnect)
        #expect(release != nil && disconnect != nil && release! < disconnect!, "\(out)")
        #expect(s.transmit == .idle)
        s.resume()
        s.transportConnected()
        s.received(.joined(channel: ChannelInfo(id: channelID, name: "Ops", image: nil, mode: .halfDuplex, maxBurstSeconds: 60), you: 1,
                           roster: [participant(1, "Ann"), participant(2, "Bob")], talkers: []))
        _ = s.takeOutputs()
        s.beginTransmitting(channelID, source: .userRequest)
        _ = s.takeOutputs()
        // A server that doesn't number its answers.
        s.received(.floor(FloorEvent(kind: .granted, burst: 4)))
        out = s.takeOutputs()
        #expect(delegateCalls(out).contains(.didBeginTransmitting(channelID, .userRequest)), "\(out)")
    }

    /// A call, or switching to listen only, withdraws a request still waiting: its grant must not
    /// start a transmission into the call or from a listen-only channel.
    @Test func aCallOrListenOnlyWithdrawsAWaitingRequest() throws {
        var s = joinedSession()
        s.beginTransmitting(channelID, source: .userRequest)
        s.received(.floor(FloorEvent(kind: .queued, position: 1, request: 1)))
        _ = s.takeOutputs()
        s.setSystemCall(active: true)
        var out = s.takeOutputs()
        #expect(sent(out) == [.floorRelease])
        #expect(delegateCalls(out).contains { if case .failedToBegin(_, let e) = $0 { return e.code == .callActive } else { return false } })
        s.received(.floor(FloorEvent(kind: .granted, burst: 3, request: 1)))
        #expect(delegateCalls(s.takeOutputs()).isEmpty && s.transmit == .idle)
        s.setSystemCall(active: false)
        s.beginTransmitting(channelID, source: .userRequest)
        _ = s.takeOutputs()
        try s.setTransmissionMode(.listenOnly, channelID)
        out = s.takeOutputs()
        #expect(sent(out) == [.floorRelease])
        #expect(delegateCalls(out).contains { if case .failedToBegin(_, let e) = $0 { return e.code == .transmissionNotAllowed } else { return false } })
        #expect(s.transmit == .idle)
    }

    @Test func losingTalkByANewTokenChangesTheTransmissionMode() {
        var s = joinedSession()
        #expect(s.transmissionMode == .halfDuplex)
        s.received(.participant(participant(1, "Ann", talk: false)))
        #expect(s.takeOutputs().contains(.event(.transmissionMode(.listenOnly))))
        s.received(.participant(participant(2, "Bob", talk: false)))
        #expect(!s.takeOutputs().contains { if case .event(.transmissionMode) = $0 { return true } else { return false } })
    }

    @Test func reconnectingHoldsAPressUntilRejoinedWithoutASecondDidJoin() {
        var s = joinedSession()
        s.transportReconnecting()
        #expect(s.serviceStatus == .connecting)
        s.beginTransmitting(channelID, source: .userRequest)
        var out = s.takeOutputs()
        #expect(delegateCalls(out).isEmpty, "the press is held, not refused")
        #expect(out.contains(.scheduleTransmitWait(milliseconds: ChannelSession.transmitWaitMilliseconds, request: 1)))
        #expect(!out.contains(.connect(credentials)), "the transport is already handshaking again")
        s.transportConnected()
        #expect(sent(s.takeOutputs()).allSatisfy { if case .floorRequest = $0 { false } else { true } }, "not before the join is answered")
        s.received(.joined(channel: ChannelInfo(id: channelID, name: "Ops", image: nil, mode: .halfDuplex, maxBurstSeconds: 60), you: 1,
                           roster: [participant(1, "Ann")], talkers: []))
        out = s.takeOutputs()
        #expect(!delegateCalls(out).contains(.didJoin(channelID, .developerRequest)))
        #expect(sent(out).contains(.registerPushToken(token: "abcd", environment: .sandbox)), "the token goes again")
        #expect(sent(out).contains(.floorRequest(request: 1)), "the held press asks for the floor")
        s.received(.floor(FloorEvent(kind: .granted, burst: 9, request: 1)))
        #expect(delegateCalls(s.takeOutputs()).contains(.didBeginTransmitting(channelID, .userRequest)))
        // The wait's timer, when it comes after the join, changes nothing.
        s.transmitWaitDue(request: 1)
        #expect(delegateCalls(s.takeOutputs()).isEmpty && s.transmit == .active(.userRequest, burst: 9))
    }

    @Test func aHeldPressOutlivesAFailedConnectAndEndsWithTheChannel() {
        func failures(_ outputs: [SessionOutput]) -> [String] {
            delegateCalls(outputs).compactMap { if case .failedToBegin(_, let e) = $0 { e.message } else { nil } }
        }
        let joined = ChannelInfo(id: channelID, name: "Ops", image: nil, mode: .halfDuplex, maxBurstSeconds: 60)
        // Pressed while down; the connect it starts fails at once (the server still away): the press
        // was never sent, so it waits on for the next attempt, within its 4 s.
        var s = joinedSession()
        s.transportFailed("no answer")
        s.beginTransmitting(channelID, source: .userRequest)
        _ = s.takeOutputs()
        s.transportFailed("no answer")
        #expect(failures(s.takeOutputs()).isEmpty)
        s.reconnectDue()
        s.transportConnected()
        s.received(.joined(channel: joined, you: 1, roster: [participant(1, "Ann")], talkers: []))
        #expect(sent(s.takeOutputs()).contains(.floorRequest(request: 1)))
        // The token runs out while the press waits: it fails now, saying what to do.
        var t = joinedSession()
        t.transportReconnecting()
        t.beginTransmitting(channelID, source: .userRequest)
        t.transportConnected()
        _ = t.takeOutputs()
        t.received(.refused(code: .tokenExpired, reason: "token expired"))
        #expect(failures(t.takeOutputs()) == ["the participant token expired; hand the channel a new one with renewToken to talk again"])
        // A join that went unanswered for the stall timeout: a new press is refused, not held.
        var j = joinedSession()
        j.transportReconnecting()
        j.transportConnected()
        j.transportStalled(true)
        _ = j.takeOutputs()
        j.beginTransmitting(channelID, source: .userRequest)
        #expect(failures(j.takeOutputs()) == ["squelchd did not answer the join; the connection may be down"])
        // Left while it waits: the app hears that it ended.
        var l = joinedSession()
        l.transportReconnecting()
        l.beginTransmitting(channelID, source: .userRequest)
        _ = l.takeOutputs()
        l.leave(channelID)
        #expect(failures(l.takeOutputs()) == ["the channel ended before it was rejoined"])
        // Pressed during the very first join, which then fails: both are said, nothing waits on.
        var f = ChannelSession()
        f.requestJoin(channelID, descriptor: descriptor, credentials: credentials, reason: .developerRequest)
        f.beginTransmitting(channelID, source: .userRequest)
        _ = f.takeOutputs()
        f.transportFailed("no answer")
        let out = f.takeOutputs()
        #expect(delegateCalls(out).contains(.failedToJoin(channelID, ChannelError(.unknown, "no answer"))))
        #expect(failures(out) == ["the channel could not be joined: no answer"])
    }

    /// squelchd going away (SIGTERM for a restart) is said, and the failures while it is gone say it
    /// too rather than "check that it runs"; once connected again, a failure is plain again.
    @Test func aServerGoingAwayIsSaidUntilItIsBack() {
        func notices(_ outputs: [SessionOutput]) -> [String] {
            outputs.compactMap { if case .event(.notice(let text)) = $0 { text } else { nil } }
        }
        var s = joinedSession()
        s.transportFailed("squelchd at 127.0.0.1:7700 is going away (server shutting down)", serverWentAway: true)
        #expect(notices(s.takeOutputs()) == ["squelchd at 127.0.0.1:7700 is going away (server shutting down)"])
        s.reconnectDue()
        s.transportFailed("no answer from squelchd at 127.0.0.1:7700; check that it runs")
        #expect(notices(s.takeOutputs()) == ["squelchd went away (shutting down) and is not back yet: no answer from squelchd at 127.0.0.1:7700; check that it runs"])
        s.reconnectDue()
        s.transportConnected()
        s.received(.joined(channel: ChannelInfo(id: channelID, name: "Ops", image: nil, mode: .halfDuplex, maxBurstSeconds: 60), you: 1,
                           roster: [participant(1, "Ann")], talkers: []))
        _ = s.takeOutputs()
        s.transportFailed("no answer")
        #expect(notices(s.takeOutputs()) == ["no answer"])
    }

    @Test func aRequestSentOrQueuedWhenTheChannelEndsIsAnswered() {
        // Sent and unanswered, then the member is removed: the app hears the press failed before the leave.
        var s = joinedSession()
        s.beginTransmitting(channelID, source: .userRequest)
        _ = s.takeOutputs()
        s.received(.refused(code: .removedByAdmin, reason: "removed"))
        var calls = delegateCalls(s.takeOutputs())
        #expect(calls == [.failedToBegin(channelID, ChannelError(.transmissionNotAllowed, "the channel ended before the floor was granted")),
                          .didLeave(channelID, .systemPolicy)])
        // Queued behind a talker, then the channel is deleted.
        var q = joinedSession()
        q.beginTransmitting(channelID, source: .userRequest)
        q.received(.floor(FloorEvent(kind: .queued, slot: 1, position: 1, request: 1)))
        _ = q.takeOutputs()
        q.received(.refused(code: .channelDeleted, reason: "the channel was deleted"))
        calls = delegateCalls(q.takeOutputs())
        #expect(calls.first == .failedToBegin(channelID, ChannelError(.transmissionNotAllowed, "the channel ended before the floor was granted")))
        #expect(calls.last == .didLeave(channelID, .systemPolicy))
        #expect(q.transmit == .idle)
    }

    @Test func aPressWhileReconnectingShowsTheBurstInProgressOnRejoin() {
        var s = joinedSession()
        s.transportReconnecting()
        s.transportConnected()
        s.received(.joined(channel: ChannelInfo(id: channelID, name: "Ops", image: nil, mode: .halfDuplex, maxBurstSeconds: 60), you: 1,
                           roster: [participant(1, "Ann")], talkers: [Talker(slot: 3, burst: 4)]))
        _ = s.takeOutputs()
        #expect(s.serviceStatus == .ready && s.activeRemoteParticipant != nil, "a burst in progress shows its talker")
    }

    @Test func aPressWhileDownReconnectsAtOnceAndFailsIfTheServerStaysAway() {
        var s = joinedSession()
        s.transportFailed("no answer")
        #expect(s.takeOutputs().contains(.scheduleReconnect(milliseconds: 500)) && s.link == .down)
        s.beginTransmitting(channelID, source: .userRequest)
        var out = s.takeOutputs()
        #expect(out.contains(.connect(credentials)), "the user is waiting: no backoff")
        #expect(delegateCalls(out).isEmpty && s.link == .connecting)
        // The backoff's own timer then finds a connection under way and leaves it alone.
        s.reconnectDue()
        #expect(!s.takeOutputs().contains(.connect(credentials)))
        // A stale timer (an earlier press) is not this press's.
        s.transmitWaitDue(request: 0)
        #expect(delegateCalls(s.takeOutputs()).isEmpty)
        s.transmitWaitDue(request: 1)
        out = s.takeOutputs()
        let errors = delegateCalls(out).compactMap { if case .failedToBegin(_, let e) = $0 { e } else { nil } }
        #expect(errors.count == 1 && errors.first?.code == .transmissionNotAllowed && errors.first?.message.contains("could not be rejoined") == true)
        // Joined later: the press that gave up is not sent.
        s.transportConnected()
        s.received(.joined(channel: ChannelInfo(id: channelID, name: "Ops", image: nil, mode: .halfDuplex, maxBurstSeconds: 60), you: 1,
                           roster: [participant(1, "Ann")], talkers: []))
        #expect(sent(s.takeOutputs()).allSatisfy { if case .floorRequest = $0 { false } else { true } })
        // Letting go before the rejoin withdraws the press: nothing goes out once joined.
        s.transportReconnecting()
        s.beginTransmitting(channelID, source: .userRequest)
        s.stopTransmitting(channelID, source: .userRequest)
        out = s.takeOutputs()
        #expect(out.contains(.event(.transmitCancelled)) && delegateCalls(out).filter { if case .failedToStop = $0 { true } else { false } }.isEmpty)
        s.transportConnected()
        s.received(.joined(channel: ChannelInfo(id: channelID, name: "Ops", image: nil, mode: .halfDuplex, maxBurstSeconds: 60), you: 1,
                           roster: [participant(1, "Ann")], talkers: []))
        out = s.takeOutputs()
        #expect(sent(out).allSatisfy { if case .floorRequest = $0 { false } else { true } })
        #expect(sent(out).allSatisfy { $0 != .floorRelease }, "nothing was asked on this connection, so nothing is released")
    }

    @Test func aTalkerBackWithinTheGraceGivesBackTheFloorItNoLongerUses() {
        var s = joinedSession()
        s.beginTransmitting(channelID, source: .userRequest)
        s.received(.floor(FloorEvent(kind: .granted, burst: 5)))
        _ = s.takeOutputs()
        s.transportReconnecting()
        var out = s.takeOutputs()
        #expect(delegateCalls(out).contains(.didEndTransmitting(channelID, .unknown)))
        #expect(!sent(out).contains(.floorRelease), "no connection to send it on")
        s.transportConnected()
        // The server kept the burst for the grace period: `joined` lists this member as talking.
        s.received(.joined(channel: ChannelInfo(id: channelID, name: "Ops", image: nil, mode: .halfDuplex, maxBurstSeconds: 60), you: 1,
                           roster: [participant(1, "Ann"), participant(2, "Bob")], talkers: [Talker(slot: 1, burst: 5)]))
        out = s.takeOutputs()
        #expect(sent(out).filter { $0 == .floorRelease }.count == 1)
        #expect(s.activeRemoteParticipant == nil, "its own burst is not a remote talker")
        // A rejoin without the floor gives nothing back.
        s.transportReconnecting()
        s.transportConnected()
        s.received(.joined(channel: ChannelInfo(id: channelID, name: "Ops", image: nil, mode: .halfDuplex, maxBurstSeconds: 60), you: 1,
                           roster: [participant(1, "Ann"), participant(2, "Bob")], talkers: [Talker(slot: 2, burst: 6)]))
        #expect(!sent(s.takeOutputs()).contains(.floorRelease))
    }

    @Test func aSpeakerShownFromAPushGoesWhenTheJoinFindsTheBurstOver() {
        var s = joinedSession()
        s.suspend()
        _ = s.takeOutputs()
        s.pushResult(.activeRemoteParticipant(try! Participant(name: "Bob")), channelID)
        _ = s.takeOutputs()
        #expect(s.activeRemoteParticipant?.name == "Bob")
        s.transportConnected()
        s.received(.joined(channel: ChannelInfo(id: channelID, name: "Ops", image: nil, mode: .halfDuplex, maxBurstSeconds: 60), you: 1,
                           roster: [participant(1, "Ann"), participant(2, "Bob")], talkers: []))
        let out = s.takeOutputs()
        #expect(s.activeRemoteParticipant == nil)
        #expect(out.contains(.event(.activeRemoteParticipant(nil))))
        #expect(delegateCalls(out).contains(.didDeactivate(AudioSession(isTransmitting: false, isReceiving: false))))
        // Woken while the burst still runs: the speaker stays.
        s.suspend()
        s.pushResult(.activeRemoteParticipant(try! Participant(name: "Bob")), channelID)
        s.transportConnected()
        s.received(.joined(channel: ChannelInfo(id: channelID, name: "Ops", image: nil, mode: .halfDuplex, maxBurstSeconds: 60), you: 1,
                           roster: [participant(1, "Ann"), participant(2, "Bob")], talkers: [Talker(slot: 2, burst: 7)]))
        _ = s.takeOutputs()
        #expect(s.activeRemoteParticipant?.name == "Bob")
    }

    /// The server replays a burst the member missed (a phone woken after a short burst ended): its
    /// talker is shown while it plays, even when the replay starts before `joined` has been read, and
    /// a live talker comes first.
    @Test func aReplayedBurstShowsItsTalkerWhileItPlays() {
        var s = joinedSession(mode: .fullDuplex)
        s.suspend()
        s.pushResult(.activeRemoteParticipant(try! Participant(name: "Bob")), channelID)
        s.transportConnected()
        _ = s.takeOutputs()
        // The replay's first frame plays before the engine has read `joined`.
        s.replayStarted(slot: 2, burst: 7)
        s.received(.joined(channel: ChannelInfo(id: channelID, name: "Ops", image: nil, mode: .fullDuplex, maxBurstSeconds: 60), you: 1,
                           roster: [participant(1, "Ann"), participant(2, "Bob"), participant(3, "Cy")], talkers: []))
        _ = s.takeOutputs()
        #expect(s.activeRemoteParticipant?.name == "Bob", "the join found nobody talking, but Bob's burst is playing")
        // Cy talks live meanwhile: Cy is shown; when Cy stops, the replay's talker again.
        s.received(.floor(FloorEvent(kind: .taken, slot: 3, burst: 9)))
        #expect(s.activeRemoteParticipant?.name == "Cy")
        s.received(.floor(FloorEvent(kind: .ended, slot: 3, burst: 9)))
        #expect(s.activeRemoteParticipant?.name == "Bob")
        // A burst that isn't this replay finishing changes nothing (another talker's, or another of
        // Bob's); the replay finishing clears it.
        s.replayFinished(slot: 3, burst: 9)
        s.replayFinished(slot: 2, burst: 6)
        #expect(s.activeRemoteParticipant?.name == "Bob")
        s.replayFinished(slot: 2, burst: 7)
        let out = s.takeOutputs()
        #expect(s.activeRemoteParticipant == nil)
        #expect(delegateCalls(out).contains(.didDeactivate(AudioSession(isTransmitting: false, isReceiving: false))))
        // A burst still going live whose start is being replayed: its talker stays shown after the
        // floor ends, while the replay plays what was said, and goes when it has played.
        s.received(.floor(FloorEvent(kind: .taken, slot: 2, burst: 10)))
        s.replayStarted(slot: 2, burst: 10)
        s.received(.floor(FloorEvent(kind: .ended, slot: 2, burst: 10)))
        #expect(s.activeRemoteParticipant?.name == "Bob")
        s.replayFinished(slot: 2, burst: 10)
        #expect(s.activeRemoteParticipant == nil)
        // The audio output failed mid-replay: no finish will come, and nothing is playing.
        s.replayStarted(slot: 2, burst: 11)
        #expect(s.activeRemoteParticipant?.name == "Bob")
        s.playbackStopped()
        #expect(s.activeRemoteParticipant == nil)
    }
}
