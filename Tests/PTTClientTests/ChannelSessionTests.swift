import ChannelProtocol
import Foundation
import ParticipantClaims
import ParticipantTokens
import Testing
@testable import PTTClient

// The channel manager's logic without I/O: commands and server messages in, delegate calls and
// actions out. The end-to-end tests (ChannelManagerTests) run the same paths against a real squelchd.

let credentials = ChannelCredentials(host: "127.0.0.1", port: 1, caPath: "/dev/null", token: "t")
let channelID = UUID()
let descriptor = ChannelDescriptor(name: "Ops")

func participant(_ slot: UInt16, _ name: String, talk: Bool = true) -> RosterMember {
    RosterMember(slot: slot, userID: name.lowercased(), name: name, canTalk: talk)
}

/// A session joined to `channelID` as slot 1 with Bob (slot 2) in the roster, on a server that
/// announces what squelchd does today.
func joinedSession(mode: ChannelProtocol.TransmissionMode = .halfDuplex, canTalk: Bool = true) -> ChannelSession {
    var s = ChannelSession()
    s.requestJoin(channelID, descriptor: descriptor, credentials: credentials, reason: .developerRequest)
    s.transportConnected()
    s.received(.joined(channel: ChannelInfo(id: channelID, name: "Ops", image: nil, mode: mode, maxBurstSeconds: 60), you: 1,
                       roster: [participant(1, "Ann", talk: canTalk), participant(2, "Bob")], talkers: [],
                       features: [.receptionReport]))
    s.pushTokenIssued(Data([0xAB, 0xCD]), for: channelID)
    _ = s.takeOutputs()
    return s
}

func delegateCalls(_ outputs: [SessionOutput]) -> [DelegateCall] {
    outputs.compactMap { if case .delegate(let call) = $0 { return call } else { return nil } }
}

func sent(_ outputs: [SessionOutput]) -> [ClientMessage] {
    outputs.compactMap { if case .send(let m) = $0 { return m } else { return nil } }
}

@Suite struct ChannelSessionTests {
    @Test func rawValuesAreApples() {
        #expect(ServiceStatus.allCases.map(\.rawValue) == [0, 1, 2])
        #expect([TransmissionMode.fullDuplex, .halfDuplex, .listenOnly].map(\.rawValue) == [0, 1, 2])
        #expect([ChannelJoinReason.developerRequest, .channelRestoration].map(\.rawValue) == [0, 1])
        #expect([ChannelLeaveReason.unknown, .userRequest, .developerRequest, .systemPolicy].map(\.rawValue) == [0, 1, 2, 3])
        #expect([ChannelTransmitRequestSource.unknown, .userRequest, .developerRequest, .handsfreeButton].map(\.rawValue) == [0, 1, 2, 3])
        #expect(ChannelError.Code.allCases.map(\.rawValue) == Array(0...9))
        #expect(ChannelError.Code.transmissionNotAllowed.rawValue == 9 && ChannelError.Code.appNotForeground.rawValue == 6)
        #expect(InstantiationError.Code.allCases.map(\.rawValue) == Array(0...5))
        #expect(InstantiationError.Code.instantiationAlreadyInProgress.rawValue == 5)
        #expect(throws: ParticipantError.emptyName) { try Participant(name: "") }
    }

    /// Messages name the server as it would be typed: an IPv6 address in brackets.
    @Test func aServerAddressReadsAsTyped() {
        #expect(ChannelCredentials(host: "::1", port: 7700, caPath: "", token: "").address == "[::1]:7700")
        #expect(ChannelCredentials(host: "127.0.0.1", port: 7700, caPath: "", token: "").address == "127.0.0.1:7700")
        #expect(ChannelCredentials(host: "ptt.example.org", port: 443, caPath: "", token: "").address == "ptt.example.org:443")
    }

    @Test func joinConnectsSendsTheTokenAndReportsOnceJoined() {
        var s = ChannelSession()
        s.requestJoin(channelID, descriptor: descriptor, credentials: credentials, reason: .developerRequest)
        var out = s.takeOutputs()
        #expect(out.contains(.connect(credentials)))
        #expect(out.contains(.event(.serviceStatus(.connecting))))
        s.transportConnected()
        #expect(sent(s.takeOutputs()) == [.join(token: "t", channel: channelID, reason: .developerRequest)])
        s.received(.joined(channel: ChannelInfo(id: channelID, name: "Ops", image: nil, mode: .halfDuplex, maxBurstSeconds: 60), you: 1,
                           roster: [participant(1, "Ann")], talkers: []))
        out = s.takeOutputs()
        #expect(delegateCalls(out) == [.didJoin(channelID, .developerRequest)])
        #expect(out.contains(.requestPushToken(channelID)))
        #expect(out.contains(.event(.serviceStatus(.ready))))
        #expect(out.contains { if case .save(let r) = $0 { return r.channel == channelID } else { return false } })
        s.pushTokenIssued(Data([1, 2]), for: channelID)
        out = s.takeOutputs()
        #expect(delegateCalls(out) == [.receivedPushToken(Data([1, 2]))])
        #expect(sent(out) == [.registerPushToken(token: "0102", environment: .sandbox)])
    }

    /// A request withdrawn by a stall (or by letting go) is still answered, in order, before the next
    /// one: that answer and its burst's end are not taken for the next press's. Here from a server
    /// that doesn't number its answers (older than `FloorEvent.request`).
    @Test func theAnswerToAWithdrawnRequestIsNotTakenForTheNextOnes() {
        var s = joinedSession()
        s.beginTransmitting(channelID, source: .userRequest)
        _ = s.takeOutputs()
        s.transportStalled(true)
        var out = s.takeOutputs()
        #expect(sent(out) == [.floorRelease])
        #expect(out.contains(.event(.serviceStatus(.connecting))))
        #expect(delegateCalls(out).contains { if case .failedToBegin(_, let e) = $0 { return e.message.contains("did not answer") } else { return false } })
        // Pressed again while stalled: refused at once.
        s.beginTransmitting(channelID, source: .userRequest)
        #expect(sent(s.takeOutputs()).isEmpty)
        s.transportStalled(false)
        #expect(s.takeOutputs().contains(.event(.serviceStatus(.ready))))
        s.beginTransmitting(channelID, source: .userRequest)
        #expect(sent(s.takeOutputs()) == [.floorRequest(request: 2)])
        // The server answers request, release, request in turn.
        s.received(.floor(FloorEvent(kind: .granted, burst: 1)))
        s.received(.floor(FloorEvent(kind: .ended, slot: 1, burst: 1)))
        out = s.takeOutputs()
        #expect(delegateCalls(out).isEmpty, "the withdrawn request's grant began nothing: \(out)")
        #expect(sent(out).isEmpty)
        s.received(.floor(FloorEvent(kind: .granted, burst: 2)))
        out = s.takeOutputs()
        #expect(delegateCalls(out).contains(.didBeginTransmitting(channelID, .userRequest)))
        #expect(out.contains(.startSending(burst: 2)))
        #expect(s.transmit == .active(.userRequest, burst: 2))
    }

    /// A hands-free button (walkie's --ptt-device) talks as `handsfreeButton`, in the background too;
    /// `setAccessoryButtonEventsEnabled(false)` makes its presses do nothing until it is turned back on.
    @Test func accessoryButtonEventsTalkUntilTurnedOff() throws {
        var s = joinedSession()
        s.setAppState(.background)
        s.accessoryButton(pressed: true, channelID)
        #expect(sent(s.takeOutputs()) == [.floorRequest(request: 1)])
        #expect(s.transmit == .requesting(.handsfreeButton))
        s.accessoryButton(pressed: false, channelID)
        #expect(sent(s.takeOutputs()) == [.floorRelease])
        try s.setAccessoryButtonEventsEnabled(false, channelID)
        s.accessoryButton(pressed: true, channelID)
        #expect(s.takeOutputs().isEmpty)
        #expect(s.transmit == .idle)
        try s.setAccessoryButtonEventsEnabled(true, channelID)
        s.accessoryButton(pressed: true, channelID)
        #expect(sent(s.takeOutputs()) == [.floorRequest(request: 2)])
        #expect(throws: ChannelError.self) { try s.setAccessoryButtonEventsEnabled(false, UUID()) }
    }

    /// A request withdrawn while queued can still be granted before its release reaches the server,
    /// after the next press went out: the server names the request in each answer, and the client
    /// acts only on the current one's.
    @Test func numberedAnswersToWithdrawnRequestsAreIgnored() {
        var s = joinedSession()
        s.beginTransmitting(channelID, source: .userRequest)
        #expect(sent(s.takeOutputs()) == [.floorRequest(request: 1)])
        s.received(.floor(FloorEvent(kind: .queued, position: 1, request: 1)))
        #expect(s.transmit == .queued(.userRequest, position: 1))
        s.stopTransmitting(channelID, source: .userRequest)
        #expect(sent(s.takeOutputs()) == [.floorRelease])
        s.beginTransmitting(channelID, source: .handsfreeButton)
        #expect(sent(s.takeOutputs()) == [.floorRequest(request: 2)])
        // The server granted request 1 from the queue, then took its release, then request 2.
        s.received(.floor(FloorEvent(kind: .granted, burst: 8, request: 1)))
        var out = s.takeOutputs()
        #expect(delegateCalls(out).isEmpty && sent(out).isEmpty, "\(out)")
        #expect(s.transmit == .requesting(.handsfreeButton))
        s.received(.floor(FloorEvent(kind: .ended, slot: 1, burst: 8)))
        #expect(s.takeOutputs().isEmpty)
        s.received(.floor(FloorEvent(kind: .granted, burst: 9, request: 2)))
        out = s.takeOutputs()
        #expect(delegateCalls(out).contains(.didBeginTransmitting(channelID, .handsfreeButton)))
        #expect(s.transmit == .active(.handsfreeButton, burst: 9))
        // A stale denial doesn't end the burst either.
        s.received(.floor(FloorEvent(kind: .denied, cause: .busy, request: 1)))
        #expect(s.transmit == .active(.handsfreeButton, burst: 9))
    }

    @Test func aStallWhileSuspendedOrJoiningLeavesNoStaleState() {
        var s = joinedSession()
        s.transportStalled(true)
        _ = s.takeOutputs()
        s.suspend()
        #expect(s.serviceStatus == .ready, "a suspended channel is not shown connecting for a stall it no longer has")
        // Woken to talk: the join goes out and gets no answer.
        s.beginTransmitting(channelID, source: .handsfreeButton)
        s.transportConnected()
        _ = s.takeOutputs()
        s.transportStalled(true)
        #expect(delegateCalls(s.takeOutputs()).contains { if case .failedToBegin = $0 { return true } else { return false } })
        #expect(s.transmit == .idle)
    }

    @Test func joinErrors() {
        var s = joinedSession()
        s.requestJoin(UUID(), descriptor: descriptor, credentials: credentials, reason: .developerRequest)
        #expect(delegateCalls(s.takeOutputs()).compactMap { if case .failedToJoin(_, let e) = $0 { return e.code } else { return nil } } == [ChannelError.Code.channelLimitReached])
        var t = ChannelSession()
        t.setAppState(.background)
        t.requestJoin(channelID, descriptor: descriptor, credentials: credentials, reason: .developerRequest)
        #expect(delegateCalls(t.takeOutputs()).compactMap { if case .failedToJoin(_, let e) = $0 { return e.code } else { return nil } } == [ChannelError.Code.appNotForeground])
        #expect(t.channel == nil)
        // Restoration happens in the background, as on iOS.
        t.requestJoin(channelID, descriptor: descriptor, credentials: credentials, reason: .channelRestoration)
        #expect(t.channel == channelID)
    }

    /// A manager that won't wait for the floor (`waitsForFloor` false) says so in every request, and a
    /// busy floor's denial fails the press with `transmissionInProgress`.
    @Test func aSessionThatWontWaitAsksNotToBeQueued() {
        var s = joinedSession()
        s.waitsForFloor = false
        s.beginTransmitting(channelID, source: .userRequest)
        #expect(sent(s.takeOutputs()) == [.floorRequest(request: 1, queue: false)])
        s.received(.floor(FloorEvent(kind: .denied, cause: .busy, reason: "someone else is talking", request: 1)))
        #expect(delegateCalls(s.takeOutputs()).contains { if case .failedToBegin(_, let e) = $0 { e.code == .transmissionInProgress } else { false } })
    }

    @Test func transmitBeginsOnGrantThenActivatesAndEndsThenDeactivates() {
        var s = joinedSession()
        s.beginTransmitting(channelID, source: .userRequest)
        #expect(sent(s.takeOutputs()) == [.floorRequest(request: 1)])
        s.received(.floor(FloorEvent(kind: .granted, burst: 5)))
        var out = s.takeOutputs()
        #expect(delegateCalls(out) == [.didBeginTransmitting(channelID, .userRequest),
                                       .didActivate(AudioSession(isTransmitting: true, isReceiving: false))])
        #expect(out.contains(.startSending(burst: 5)))
        s.stopTransmitting(channelID, source: .userRequest)
        out = s.takeOutputs()
        let stop = out.firstIndex(of: .stopSending)!, release = out.firstIndex(of: .send(.floorRelease))!
        #expect(stop < release, "the end marker goes before the release")
        #expect(delegateCalls(out) == [.didEndTransmitting(channelID, .userRequest),
                                       .didDeactivate(AudioSession(isTransmitting: false, isReceiving: false))])
    }

    @Test func everyTransmitErrorCode() {
        func beginError(_ s: inout ChannelSession, _ uuid: UUID = channelID, source: ChannelTransmitRequestSource = .userRequest) -> ChannelError.Code? {
            s.beginTransmitting(uuid, source: source)
            return delegateCalls(s.takeOutputs()).compactMap { if case .failedToBegin(_, let e) = $0 { return e.code } else { return nil } }.first
        }
        var s = joinedSession()
        #expect(beginError(&s, UUID()) == .channelNotFound)
        s.setAppState(.background)
        #expect(beginError(&s) == .appNotForeground)
        s.setAppState(.foreground)
        s.setSystemCall(active: true)
        _ = s.takeOutputs()
        #expect(beginError(&s) == .callActive)
        s.setSystemCall(active: false)
        try! s.setTransmissionMode(.listenOnly, channelID)
        _ = s.takeOutputs()
        #expect(beginError(&s) == .transmissionNotAllowed)
        try! s.setTransmissionMode(.halfDuplex, channelID)
        try! s.setServiceStatus(.connecting, channelID)
        _ = s.takeOutputs()
        #expect(beginError(&s) == .transmissionNotAllowed)
        try! s.setServiceStatus(.ready, channelID)
        #expect(beginError(&s) == nil)
        #expect(beginError(&s) == .transmissionInProgress)
        s.received(.floor(FloorEvent(kind: .denied, cause: .busy, reason: "someone else is talking")))
        #expect(delegateCalls(s.takeOutputs()) == [.failedToBegin(channelID, ChannelError(.transmissionInProgress, "someone else is talking", floorCause: .busy))])
        // A full queue is the same code, told apart by its cause (waiting in the queue can't help).
        #expect(beginError(&s) == nil)
        s.received(.floor(FloorEvent(kind: .denied, cause: .queueFull, reason: "too many members are waiting to talk")))
        #expect(delegateCalls(s.takeOutputs()) == [.failedToBegin(channelID, ChannelError(.transmissionInProgress, "too many members are waiting to talk",
                                                                                           floorCause: .queueFull))])
        // A listen-only token maps to listenOnly mode.
        var l = joinedSession(canTalk: false)
        #expect(l.transmissionMode == .listenOnly)
        #expect(beginError(&l) == .transmissionNotAllowed)
        // Stop errors.
        s.stopTransmitting(channelID, source: .userRequest)
        #expect(delegateCalls(s.takeOutputs()) == [.failedToStop(channelID, ChannelError(.transmissionNotFound, "not transmitting"))])
        s.stopTransmitting(UUID(), source: .userRequest)
        #expect(delegateCalls(s.takeOutputs()).count == 1)
        // Setting a remote participant while transmitting (half duplex).
        _ = beginError(&s)
        s.received(.floor(FloorEvent(kind: .granted, burst: 1)))
        _ = s.takeOutputs()
        #expect(throws: ChannelError.self) { try s.setActiveRemoteParticipant(try Participant(name: "Bob"), channelID) }
        #expect(throws: ChannelError.self) { try s.setChannelDescriptor(descriptor, UUID()) }
    }

    @Test func aRemoteTalkerSetsTheParticipantThenActivatesAndIdleClearsThenDeactivates() {
        var s = joinedSession()
        s.received(.floor(FloorEvent(kind: .taken, slot: 2, burst: 3)))
        var out = s.takeOutputs()
        let bob = try! Participant(name: "Bob")
        let set = out.firstIndex(of: .event(.activeRemoteParticipant(bob)))!
        let activate = out.firstIndex(of: .delegate(.didActivate(AudioSession(isTransmitting: false, isReceiving: true))))!
        #expect(set < activate)
        s.received(.floor(FloorEvent(kind: .idle)))
        out = s.takeOutputs()
        #expect(out.firstIndex(of: .event(.activeRemoteParticipant(nil)))! < out.firstIndex(of: .delegate(.didDeactivate(AudioSession(isTransmitting: false, isReceiving: false))))!)
        #expect(s.activeRemoteParticipant == nil)
    }

    @Test func revocationEndsTheTransmissionWithSourceUnknown() {
        var s = joinedSession()
        s.beginTransmitting(channelID, source: .userRequest)
        s.received(.floor(FloorEvent(kind: .granted, burst: 2)))
        _ = s.takeOutputs()
        s.received(.floor(FloorEvent(kind: .revoked, cause: .preempted, reason: "pre-empted")))
        let out = s.takeOutputs()
        #expect(delegateCalls(out).first == .didEndTransmitting(channelID, .unknown))
        #expect(out.contains(.event(.transmissionRevoked(.preempted, "pre-empted"))))
        #expect(!sent(out).contains(.floorRelease), "the server already took the floor")
    }

    @Test func pushResultsWakeOrLeave() {
        var s = joinedSession()
        // Joined, a late push changes nothing: the live floor state says who talks, and a speaker
        // set from it would outlive the burst; a transmission goes on.
        s.beginTransmitting(channelID, source: .userRequest)
        s.received(.floor(FloorEvent(kind: .granted, burst: 2, request: 1)))
        _ = s.takeOutputs()
        s.pushResult(.activeRemoteParticipant(try! Participant(name: "Bob")), channelID)
        #expect(delegateCalls(s.takeOutputs()).isEmpty && s.activeRemoteParticipant == nil && s.transmit == .active(.userRequest, burst: 2))
        s.stopTransmitting(channelID, source: .userRequest)
        _ = s.takeOutputs()
        s.suspend()
        var out = s.takeOutputs()
        #expect(out.contains(.disconnect) && s.link == .suspended)
        s.pushResult(.activeRemoteParticipant(try! Participant(name: "Bob")), channelID)
        out = s.takeOutputs()
        #expect(out.contains(.connect(credentials)))
        #expect(delegateCalls(out) == [.didActivate(AudioSession(isTransmitting: false, isReceiving: true))])
        s.pushResult(.leaveChannel, channelID)
        out = s.takeOutputs()
        #expect(delegateCalls(out).last == .didLeave(channelID, .developerRequest))
        #expect(out.contains(.invalidatePushToken(Data([0xAB, 0xCD]))) && out.contains(.forgetRestoration))
        #expect(s.channel == nil)
    }

    @Test func serverRefusalsAndRemovals() {
        var s = ChannelSession()
        s.requestJoin(channelID, descriptor: descriptor, credentials: credentials, reason: .developerRequest)
        s.transportConnected()
        _ = s.takeOutputs()
        s.received(.refused(code: .tokenExpired, reason: "the participant token expired"))
        var out = s.takeOutputs()
        #expect(delegateCalls(out) == [.failedToJoin(channelID, ChannelError(.unknown, "the participant token expired", refusal: .tokenExpired))])
        #expect(out.contains(.event(.serviceStatus(.unavailable))) && s.channel == nil)
        var j = joinedSession()
        j.received(.refused(code: .removedByAdmin, reason: "removed"))
        out = j.takeOutputs()
        #expect(delegateCalls(out).last == .didLeave(channelID, .systemPolicy))
    }

    /// Replaced by another connection of the same user (a one-shot `walkie talk`, a second device):
    /// the session steps aside, keeping its channel, record and push token, neither leaving nor
    /// joining straight back (which would replace the other in turn); a push or a press brings it back.
    @Test func aSessionReplacedByAnotherConnectionStepsAsideAndKeepsItsChannel() {
        var s = joinedSession()
        s.received(.refused(code: .replaced, reason: "you joined this channel from another connection"))
        var out = s.takeOutputs()
        #expect(delegateCalls(out).isEmpty, "no didLeave")
        #expect(!out.contains(.forgetRestoration) && !out.contains(.invalidatePushToken(Data([0xAB, 0xCD]))))
        #expect(out.contains(.disconnect) && out.contains(.event(.suspended(true))) && s.link == .suspended)
        #expect(out.contains(.event(.serviceStatus(.unavailable))), "nothing is connected: not shown as ready")
        #expect(!out.contains { if case .connect = $0 { return true } else { return false } })
        #expect(s.channel == channelID)
        // The close that follows the refusal doesn't start a reconnect loop.
        s.transportFailed("replaced by a newer connection")
        out = s.takeOutputs()
        #expect(!out.contains { if case .scheduleReconnect = $0 { return true } else { return false } })
        // A press takes the channel back.
        s.beginTransmitting(channelID, source: .userRequest)
        #expect(s.takeOutputs().contains(.connect(credentials)))
    }
}
