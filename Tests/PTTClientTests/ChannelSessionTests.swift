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

func participant(_ slot: UInt16, _ name: String, talk: Bool = true) -> ChannelProtocol.Participant {
    ChannelProtocol.Participant(slot: slot, userID: name.lowercased(), name: name, canTalk: talk)
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

    func token(of s: ChannelSession) -> String? { s.credentials?.token }
    func saved(_ outputs: [SessionOutput]) -> [String] {
        outputs.compactMap { if case .save(let r) = $0 { return r.credentials.token } else { return nil } }
    }

    @Test func aTokenIsRenewedInSessionAndAnExpiredSessionWaitsForANewOne() throws {
        var s = joinedSession()
        let soon = Date(timeIntervalSince1970: 1_800_000_300), later = Date(timeIntervalSince1970: 1_800_043_200)
        s.received(.tokenExpiring(expiresAt: soon))
        #expect(s.takeOutputs() == [.event(.tokenExpiring(soon))])
        try s.renewToken("t2", channelID)
        var out = s.takeOutputs()
        #expect(sent(out) == [.renewToken(token: "t2")])
        // Not the session's token until the server takes it.
        #expect(saved(out).isEmpty && token(of: s) == "t")
        s.received(.tokenRenewed(expiresAt: later))
        out = s.takeOutputs()
        #expect(saved(out) == ["t2"] && token(of: s) == "t2" && s.pendingToken == nil)
        #expect(out.last == .event(.tokenRenewed(later)))
        #expect(throws: ChannelError.self) { try s.renewToken("t9", UUID()) }

        // The token runs out: the session ends, the channel stays (the server keeps the membership and
        // its push token), and nothing reconnects until a new token comes.
        s.received(.refused(code: .tokenExpired, reason: "your participant token expired"))
        out = s.takeOutputs()
        #expect(delegateCalls(out).isEmpty)
        #expect(out.contains(.disconnect) && out.contains(.event(.tokenExpired("your participant token expired"))))
        #expect(out.contains(.event(.serviceStatus(.unavailable))))
        #expect(!out.contains(.forgetRestoration) && !out.contains(.invalidatePushToken(Data([0xAB, 0xCD]))))
        #expect(s.channel == channelID && s.tokenExpired)
        // A push can't be heard now: no speaker, no audio held for nothing.
        s.pushResult(.activeRemoteParticipant(try Participant(name: "Ann")), channelID)
        out = s.takeOutputs()
        #expect(!out.contains { if case .connect = $0 { return true } else { return false } })
        #expect(s.activeRemoteParticipant == nil && delegateCalls(out).isEmpty)
        s.beginTransmitting(channelID, source: .userRequest)
        #expect(delegateCalls(s.takeOutputs()).contains { if case .failedToBegin(_, let e) = $0 { return e.message.contains("renewToken") } else { return false } })
        s.transportFailed("closed by the server")
        #expect(!s.takeOutputs().contains { if case .scheduleReconnect = $0 { return true } else { return false } })

        // A new token that is refused too: the channel waits again, it does not end.
        try s.renewToken("bad", channelID)
        var tried = credentials
        tried.token = "bad"
        #expect(s.takeOutputs().contains(.connect(tried)))
        s.transportConnected()
        #expect(sent(s.takeOutputs()) == [.join(token: "bad", channel: channelID, reason: .developerRequest)])
        s.received(.refused(code: .tokenForged, reason: "forged"))
        out = s.takeOutputs()
        #expect(delegateCalls(out).isEmpty && out.contains(.event(.tokenRenewalFailed(.tokenForged, "forged"))))
        #expect(!out.contains(.event(.tokenExpired("forged"))), "not an expiry, and not said to be one")
        #expect(s.tokenExpired && s.channel == channelID && saved(out).isEmpty)

        // A good one brings the channel back, and is what a restart restores.
        try s.renewToken("t3", channelID)
        tried.token = "t3"
        #expect(s.takeOutputs().contains(.connect(tried)))
        s.transportConnected()
        #expect(sent(s.takeOutputs()) == [.join(token: "t3", channel: channelID, reason: .developerRequest)])
        s.received(.joined(channel: ChannelInfo(id: channelID, name: "Ops", image: nil, mode: .halfDuplex, maxBurstSeconds: 60), you: 1,
                           roster: [participant(1, "Ann")], talkers: []))
        out = s.takeOutputs()
        #expect(saved(out) == ["t3"] && !s.tokenExpired && s.serviceStatus == .ready)
        #expect(!delegateCalls(out).contains(.didJoin(channelID, .developerRequest)))
    }

    @Test func aRefusedRenewalNeverReplacesTheTokenThatWorks() throws {
        var s = joinedSession()
        // Another user's token: refused, and the session's own token stays, for this session and the
        // next join (a join does not check the user, so taking it would make this device someone else).
        try s.renewToken("bobs", channelID)
        _ = s.takeOutputs()
        s.received(.error(code: .tokenWrongUser, reason: "not yours"))
        #expect(s.takeOutputs() == [.event(.tokenRenewalFailed(.tokenWrongUser, "not yours"))])
        #expect(token(of: s) == "t" && s.pendingToken == nil)
        s.transportReconnecting()
        s.transportConnected()
        #expect(sent(s.takeOutputs()) == [.join(token: "t", channel: channelID, reason: .developerRequest)])
        // Errors that are not the renewal's answer are notices.
        var j = joinedSession()
        j.received(.error(code: .notJoined, reason: "join first"))
        #expect(j.takeOutputs() == [.event(.notice("server: join first"))])
    }

    @Test func renewalsGoOneAtATimeAndSurviveWhatCanHappenToThem() throws {
        var s = joinedSession()
        try s.renewToken("t2", channelID)
        try s.renewToken("t3", channelID)  // while t2 is being checked: waits for t2's answer
        #expect(sent(s.takeOutputs()) == [.renewToken(token: "t2")])
        s.received(.tokenRenewed(expiresAt: Date(timeIntervalSince1970: 1_800_001_000)))
        var out = s.takeOutputs()
        #expect(token(of: s) == "t2" && sent(out) == [.renewToken(token: "t3")])
        // The server could not check t3 (its database): t3 stays pending, offered again after a reconnect.
        s.received(.error(code: .internalError, reason: "database failing"))
        out = s.takeOutputs()
        #expect(out == [.event(.tokenRenewalFailed(.internalError, "database failing"))] && s.pendingToken == "t3")
        s.transportReconnecting()
        s.transportConnected()
        _ = s.takeOutputs()
        s.received(.joined(channel: ChannelInfo(id: channelID, name: "Ops", image: nil, mode: .halfDuplex, maxBurstSeconds: 60), you: 1,
                           roster: [participant(1, "Ann")], talkers: []))
        #expect(sent(s.takeOutputs()).contains(.renewToken(token: "t3")))
        // An error about another message is not the renewal's answer.
        s.received(.error(code: .rateLimited, reason: "slow down"))
        #expect(sent(s.takeOutputs()).isEmpty && s.pendingToken == "t3")
        // The old token expires before t3's check comes back: t3 is tried at once, not given up on.
        s.received(.refused(code: .tokenExpired, reason: "expired"))
        out = s.takeOutputs()
        var renewed = credentials
        renewed.token = "t3"
        #expect(out.contains(.connect(renewed)) && !out.contains(.event(.tokenExpired("expired"))))
        #expect(!s.tokenExpired)
    }

    @Test func aTokenRenewedWhileJoiningIsNotLost() throws {
        // Renewed while the join (with the old token) is on its way: offered once joined.
        var s = joinedSession()
        s.transportReconnecting()
        s.transportConnected()
        #expect(sent(s.takeOutputs()) == [.join(token: "t", channel: channelID, reason: .developerRequest)])
        try s.renewToken("t2", channelID)
        #expect(sent(s.takeOutputs()).isEmpty)
        s.received(.joined(channel: ChannelInfo(id: channelID, name: "Ops", image: nil, mode: .halfDuplex, maxBurstSeconds: 60), you: 1,
                           roster: [participant(1, "Ann")], talkers: []))
        #expect(sent(s.takeOutputs()).contains(.renewToken(token: "t2")))

        // A restored channel whose saved token ran out, renewed before the refusal came: no failed join.
        var renewed = credentials
        renewed.token = "t2"
        var r = ChannelSession()
        r.requestJoin(channelID, descriptor: descriptor, credentials: credentials, reason: .channelRestoration)
        r.transportConnected()
        try r.renewToken("t2", channelID)
        _ = r.takeOutputs()
        r.received(.refused(code: .tokenExpired, reason: "expired"))
        let restored = r.takeOutputs()
        #expect(delegateCalls(restored).isEmpty && restored.contains(.connect(renewed)) && !restored.contains(.forgetRestoration))
        r.transportConnected()
        #expect(sent(r.takeOutputs()) == [.join(token: "t2", channel: channelID, reason: .channelRestoration)])
    }

    @Test func aTokenForAnotherUserIsNotEvenOffered() async throws {
        // Real tokens from a key of its own: the client reads them without verifying, so any key will do.
        let key = FileManager.default.temporaryDirectory.appendingPathComponent("squelch-sub-\(UUID()).pem").path
        defer { try? FileManager.default.removeItem(atPath: key) }
        let authority = try await TokenAuthority.loadOrCreate(at: key)
        func jwt(_ user: String) async throws -> String {
            try await authority.issue(ParticipantClaims(userID: user, name: user, channel: channelID, capabilities: [.talk, .listen],
                                                        issuedAt: Date(), expiresAt: Date().addingTimeInterval(3600), tokenID: UUID().uuidString))
        }
        let annToken = try await jwt("ann"), bobToken = try await jwt("bob"), annAgain = try await jwt("ann")
        var ann = credentials
        ann.token = annToken
        var s = ChannelSession()
        s.requestJoin(channelID, descriptor: descriptor, credentials: ann, reason: .developerRequest)
        s.transportConnected()
        s.received(.joined(channel: ChannelInfo(id: channelID, name: "Ops", image: nil, mode: .halfDuplex, maxBurstSeconds: 60), you: 1,
                           roster: [participant(1, "Ann")], talkers: []))
        _ = s.takeOutputs()
        #expect(ChannelSession.subject(of: bobToken) == "bob" && ChannelSession.subject(of: "t") == nil)
        #expect(throws: ChannelError.self) { try s.renewToken(bobToken, channelID) }
        do { try s.renewToken(bobToken, channelID) } catch { #expect(error.refusal == .tokenWrongUser && error.message.contains("'ann'")) }
        #expect(sent(s.takeOutputs()).isEmpty && s.pendingToken == nil)
        try s.renewToken(annAgain, channelID)
        #expect(sent(s.takeOutputs()) == [.renewToken(token: annAgain)])
    }

    @Test func aJoinRefusedForAPassingReasonIsTriedAgainNotLeft() {
        var s = joinedSession()
        s.transportReconnecting()
        s.transportConnected()
        _ = s.takeOutputs()
        s.received(.refused(code: .internalError, reason: "the server could not check the token; try again shortly"))
        let out = s.takeOutputs()
        #expect(delegateCalls(out).isEmpty && !out.contains(.forgetRestoration))
        #expect(out.contains { if case .scheduleReconnect = $0 { return true } else { return false } })
        #expect(s.channel == channelID && s.serviceStatus == .unavailable)
        s.reconnectDue()
        #expect(s.takeOutputs().contains(.connect(credentials)))
    }

    /// A restored channel is one the user is in: a refusal that ends only a session (the saved token
    /// ran out while the app was not running, the server briefly unable) keeps it, where a first join
    /// would fail. Before, a restart during a database fault forgot the channel for good.
    @Test func aRestoredChannelOutlivesAnExpiredTokenOrABusyServer() throws {
        func restored() -> ChannelSession {
            var r = ChannelSession()
            r.requestJoin(channelID, descriptor: descriptor, credentials: credentials, reason: .channelRestoration)
            r.transportConnected()
            _ = r.takeOutputs()
            return r
        }
        var r = restored()
        r.received(.refused(code: .tokenExpired, reason: "the participant token expired"))
        var out = r.takeOutputs()
        #expect(delegateCalls(out).isEmpty && !out.contains(.forgetRestoration), "\(out)")
        #expect(out.contains(.event(.tokenExpired("the participant token expired"))))
        #expect(r.channel == channelID && r.tokenExpired && r.serviceStatus == .unavailable)
        var renewed = credentials
        renewed.token = "t2"
        try r.renewToken("t2", channelID)
        #expect(r.takeOutputs().contains(.connect(renewed)))
        r.transportConnected()
        r.received(.joined(channel: ChannelInfo(id: channelID, name: "Ops", image: nil, mode: .halfDuplex, maxBurstSeconds: 60), you: 1,
                           roster: [participant(1, "Ann")], talkers: []))
        out = r.takeOutputs()
        #expect(delegateCalls(out) == [.didJoin(channelID, .channelRestoration)])
        #expect(out.contains { if case .save(let record) = $0 { return record.credentials.token == "t2" } else { return false } })

        var busy = restored()
        busy.received(.refused(code: .serverBusy, reason: "the server is full; try again shortly"))
        out = busy.takeOutputs()
        #expect(delegateCalls(out).isEmpty && !out.contains(.forgetRestoration))
        #expect(out.contains { if case .scheduleReconnect = $0 { return true } else { return false } })

        // A refusal that ends the membership still ends it.
        var removed = restored()
        removed.received(.refused(code: .removedByAdmin, reason: "an administrator removed you from the channel"))
        out = removed.takeOutputs()
        #expect(out.contains(.forgetRestoration) && removed.channel == nil)
    }

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
        s.received(.participant(ChannelProtocol.Participant(slot: 1, userID: "ann", name: "Ann", muted: true)))
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
