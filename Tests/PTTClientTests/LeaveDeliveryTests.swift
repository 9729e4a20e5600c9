import ChannelProtocol
import Foundation
import Testing
import Wire
@testable import PTTClient

// Leaving while not joined: what the session asks for, and the delivery's own state machine. The
// end-to-end paths (a suspended leave, one delivered after a restart, one withdrawn by a rejoin) are
// in ChannelManagerTests against a real squelchd.

func owedLeaves(_ outputs: [SessionOutput]) -> [ChannelCredentials] {
    outputs.compactMap { if case .oweLeave(channelID, let credentials) = $0 { return credentials } else { return nil } }
}

@Suite struct LeaveDeliveryTests {
    @Test func aJoinedLeaveGoesOnTheConnectionAndOwesNothing() {
        var s = joinedSession()
        s.leave(channelID)
        let out = s.takeOutputs()
        #expect(sent(out) == [.leave] && owedLeaves(out).isEmpty)
    }

    @Test func aLeaveWhileSuspendedConnectingOrDownIsOwed() {
        var s = joinedSession()
        s.suspend()
        _ = s.takeOutputs()
        s.leave(channelID)
        var out = s.takeOutputs()
        #expect(sent(out).isEmpty && owedLeaves(out) == [credentials])
        #expect(delegateCalls(out) == [.didLeave(channelID, .developerRequest)] && s.channel == nil)

        // Joining: the join went out, its answer hasn't come.
        s.requestJoin(channelID, descriptor: descriptor, credentials: credentials, reason: .developerRequest)
        s.transportConnected()
        _ = s.takeOutputs()
        s.leave(channelID)
        #expect(owedLeaves(s.takeOutputs()) == [credentials])

        // The connection lost, the next attempt not yet due: no connection at all.
        s = joinedSession()
        s.transportFailed("no answer")
        #expect(s.link == .down)
        _ = s.takeOutputs()
        s.leave(channelID)
        out = s.takeOutputs()
        #expect(owedLeaves(out) == [credentials] && !out.contains(.disconnect))

        // A leave asked for by the app's answer to a push, while suspended, is owed the same way.
        s = joinedSession()
        s.suspend()
        _ = s.takeOutputs()
        s.pushResult(.leaveChannel, channelID)
        #expect(owedLeaves(s.takeOutputs()) == [credentials])
    }

    @Test func withAnExpiredTokenOnlyARenewalNotYetTakenCanCarryTheLeave() throws {
        var s = joinedSession()
        s.received(.refused(code: .tokenExpired, reason: "expired"))
        _ = s.takeOutputs()
        s.leave(channelID)
        var out = s.takeOutputs()
        #expect(owedLeaves(out).isEmpty, "the server refuses an expired token: nothing to deliver with")
        #expect(out.contains { if case .event(.notice(let text)) = $0 { return text.contains("administrator removes you") } else { return false } })

        s = joinedSession()
        s.received(.refused(code: .tokenExpired, reason: "expired"))
        try s.renewToken("t2", channelID)
        _ = s.takeOutputs()
        s.leave(channelID)
        out = s.takeOutputs()
        var renewed = credentials
        renewed.token = "t2"
        #expect(owedLeaves(out) == [renewed])
    }

    let leave = OwedLeave(channel: channelID, credentials: credentials, leftAt: Date(timeIntervalSince1970: 0))

    @Test func anAttemptJoinsThenLeavesAndIsSettledByTheServersClose() {
        var attempt = LeaveDelivery(leave).attempt()
        #expect(attempt.join == .join(token: "t", channel: channelID, reason: .developerRequest))
        #expect(attempt.received(.roster([])) == nil)
        #expect(attempt.closed(.peer(code: CloseCode.normal.rawValue, reason: "bye", application: true)) != .delivered,
                "a close before the leave went out settles nothing")
        let joined = ServerMessage.joined(channel: ChannelInfo(id: channelID, name: "Ops", image: nil, mode: .halfDuplex, maxBurstSeconds: 60),
                                          you: 1, roster: [], talkers: [])
        #expect(attempt.received(joined) == .send(.leave))
        #expect(attempt.received(joined) == nil, "one leave per attempt")
        #expect(attempt.received(.floor(FloorEvent(kind: .taken, slot: 2, burst: 1))) == nil)
        #expect(attempt.received(.error(code: .rateLimited, reason: "slow down")) == nil, "after the leave, only the close matters")
        #expect(attempt.closed(.peer(code: CloseCode.normal.rawValue, reason: "left the channel", application: true)) == .delivered)
        #expect(attempt.closed(.peer(code: CloseCode.goingAway.rawValue, reason: "restarting", application: true)) != .delivered,
                "a server going down may not have handled it")
        #expect(attempt.closed(.idleTimeout) != .delivered)
    }

    @Test func anAttemptEndsOnARefusalOrAnErrorToItsJoin() {
        var attempt = LeaveDelivery(leave).attempt()
        #expect(attempt.received(.refused(code: .channelDeleted, reason: "gone")) == .end(.refused(.channelDeleted, "gone")))
        attempt = LeaveDelivery(leave).attempt()
        #expect(attempt.received(.error(code: .rateLimited, reason: "slow down")) == .end(.failed("the server answered the join with an error: slow down")))
    }

    @Test func outcomesAndBackoff() {
        var delivery = LeaveDelivery(leave)
        #expect(delivery.ended(.delivered) == .finished(.delivered))
        for code in [RefusalCode.removedByAdmin, .channelDeleted, .channelNotFound, .replaced] {
            #expect(delivery.ended(.refused(code, "why")) == .finished(.nothingToLeave("why")), "\(code)")
        }
        for code in [RefusalCode.tokenExpired, .tokenForged, .tokenMalformed, .tokenWrongChannel, .tokenWrongUser, .tokenRevoked] {
            #expect(delivery.ended(.refused(code, "why")) == .finished(.undeliverable("why")), "\(code)")
        }
        #expect(delivery.failures == 0, "a settled attempt is no failure")
        // Failures and passing refusals back off from 1 s, doubling, to at most a minute.
        var waits: [Int] = []
        for result in [LeaveDelivery.AttemptResult.failed("down"), .refused(.serverBusy, "busy"), .refused(.internalError, "db"),
                       .refused(.tokenNotYetValid, "clock"), .failed("down"), .failed("down"), .failed("down"), .failed("down")] {
            if case .retry(let wait) = delivery.ended(result) { waits.append(wait) }
        }
        #expect(waits == [1_000, 2_000, 4_000, 8_000, 16_000, 32_000, 60_000, 60_000])
    }

    @Test func owedLeavesSurviveOnDiskAndAnEmptyListRemovesTheFile() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("owed-\(UUID())").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let store = RestorationStore(directory: directory)
        #expect(try store.loadOwedLeaves().isEmpty)
        try store.saveOwedLeaves([leave])
        #expect(try store.loadOwedLeaves() == [leave])
        let mode = try FileManager.default.attributesOfItem(atPath: store.owedLeavesPath)[.posixPermissions] as? Int
        #expect(mode == 0o600, "it holds participant tokens")
        try store.saveOwedLeaves([])
        #expect(!FileManager.default.fileExists(atPath: store.owedLeavesPath))
        // A broken file is moved aside and said so, in words about leaves, not the saved channel.
        try Data("{".utf8).write(to: URL(fileURLWithPath: store.owedLeavesPath))
        do {
            _ = try store.loadOwedLeaves()
            Issue.record("a broken file was read")
        } catch {
            #expect(error.description.contains("leaves not yet delivered") && error.description.contains("moved to"))
        }
        #expect(!FileManager.default.fileExists(atPath: store.owedLeavesPath))
    }
}

/// One reason for one cause, however it arrives (issue 43): the user's own leave is `userRequest`,
/// the app's `developerRequest`, and an administrator's removal `systemPolicy` whether the server
/// says it live or by squelchd's leave push.
@Suite struct LeaveReasonTests {
    func leftReason(_ act: (inout ChannelSession) -> Void) -> ChannelLeaveReason? {
        var s = joinedSession()
        act(&s)
        for call in delegateCalls(s.takeOutputs()) { if case .didLeave(_, let reason) = call { return reason } }
        return nil
    }

    @Test func eachCauseHasOneReason() {
        #expect(leftReason { $0.leave(channelID, reason: .userRequest) } == .userRequest)
        #expect(leftReason { $0.leave(channelID) } == .developerRequest)
        #expect(leftReason { $0.pushResult(.leaveChannel, channelID, serverLeave: true) } == .systemPolicy)
        #expect(leftReason { $0.pushResult(.leaveChannel, channelID) } == .developerRequest, "the app's own choice on another push")
        #expect(leftReason { $0.received(.refused(code: .removedByAdmin, reason: "removed")) } == .systemPolicy)
    }
}
