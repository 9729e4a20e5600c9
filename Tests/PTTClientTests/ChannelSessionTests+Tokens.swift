import ChannelProtocol
import Foundation
import ParticipantClaims
import ParticipantTokens
import Testing
@testable import PTTClient

extension ChannelSessionTests {
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
}
