import ChannelProtocol
import ChannelStore
import Foundation
import ParticipantClaims
import Testing
import Wire
@testable import ChannelHub

/// Token lifetimes: expiry, warnings, renewals, and revocations that race a token check.
@Suite struct HubTokenTests {
    @Test func aSessionEndsWhenItsTokenExpires() {
        // Ann holds the floor without sending audio for 30 s: no silence limit here, so that the
        // expiry is what ends her burst.
        var configuration = HubConfiguration.unpaced
        configuration.talkerSilenceLimit = 0
        let h = Harness(configuration: configuration)
        let ann = h.join("ann", expiresAt: h.time.date.addingTimeInterval(30))
        let bob = h.join("bob")
        h.send(.floorRequest(), from: ann.link)
        #expect(h.grantedBurst(ann.link) != nil)
        h.advance(29_999 * ms)
        #expect(h.closes.isEmpty)
        h.advance(1 * ms)
        #expect(h.messages(to: ann.link).contains { if case .refused(.tokenExpired, _) = $0 { return true } else { return false } })
        #expect(h.closes.map(\.0) == [ann.link])
        #expect(h.hub.counters.tokenExpiries == 1)
        // The floor is free, the burst is logged, and ann stays a member, offline.
        #expect(h.floorEvents(to: bob.link).contains { $0.kind == .ended && $0.slot == ann.slot })
        #expect(h.floorEvents(to: bob.link).last?.kind == .idle)
        #expect(h.stored.contains { if case .logTransmission(let r) = $0 { return r.endReason == "tokenExpired" } else { return false } })
        #expect(h.hub.roster(of: h.channel.id).first { $0.userID == "ann" }?.connection == .offline)
        // Control messages on the closing connection count for nothing.
        let before = h.messages.count
        h.send(.floorRequest(), from: ann.link)
        #expect(h.messages.count == before)
    }

    @Test func aRejoinWithAFreshTokenOutlivesTheOldOnesExpiry() {
        let h = Harness()
        let first = h.join("ann", expiresAt: h.time.date.addingTimeInterval(30))
        h.advance(20_000 * ms)
        let second = h.join("ann", expiresAt: h.time.date.addingTimeInterval(3600))
        h.advance(20_000 * ms)  // past the first token's expiry
        #expect(h.closes.map(\.0) == [first.link])  // replaced, not expired
        #expect(!h.messages(to: second.link).contains { if case .refused = $0 { return true } else { return false } })
        #expect(h.hub.counters.tokenExpiries == 0)
        // A member that closed before its token expired is not "expired" later either.
        let cy = h.join("cy", expiresAt: h.time.date.addingTimeInterval(5))
        h.hub.closed(cy.link, at: h.time)
        h.advance(10_000 * ms)
        #expect(h.hub.counters.tokenExpiries == 0)
    }

    func claims(_ h: Harness, _ user: String, capabilities: Set<Capability> = [.talk, .listen], priority: UInt8 = 0,
                channel: UUID? = nil, expiresIn: TimeInterval, tokenID: String = UUID().uuidString) -> ParticipantClaims {
        ParticipantClaims(userID: user, name: user.capitalized, channel: channel ?? h.channel.id, capabilities: capabilities,
                          priority: priority, issuedAt: h.time.date, expiresAt: h.time.date.addingTimeInterval(expiresIn), tokenID: tokenID)
    }

    /// A token check reads the store's revocations off the loop. A revocation stored after that read
    /// and applied before the outcome comes back must still keep the member out (or the renewal
    /// refused), or a removed member would be let back in.
    @Test func aRevocationAppliedWhileATokenIsCheckedStillCounts() {
        let h = Harness()
        let ann = h.join("ann")
        let bob = Link(index: 900, generation: 1)
        h.hub.connected(bob)
        h.send(.join(token: "t", channel: h.channel.id, reason: .developerRequest), from: bob)
        let bobClaims = claims(h, "bob", expiresIn: 3600)
        h.advance(1 * ms)
        h.hub.apply(.member(channel: h.channel.id, user: "bob", at: h.time.date, reason: "gone"), at: h.time)
        h.hub.admit(bob, claims: bobClaims, reason: .developerRequest, at: h.time)
        h.drain()
        guard case .refused(.tokenRevoked, let why)? = h.lastMessage(to: bob) else {
            Issue.record("not refused: \(String(describing: h.lastMessage(to: bob)))"); return
        }
        #expect(why.contains("removed"))
        #expect(!h.hub.isMember(channel: h.channel.id, user: "bob"))
        #expect(!h.stored.contains { if case .upsertMember(let m) = $0 { m.userID == "bob" } else { false } })

        // A renewal whose new token is revoked (by id) while it is checked is refused; the session
        // carries on under the old token.
        h.send(.renewToken(token: "fresh"), from: ann.link)
        let fresh = claims(h, "ann", expiresIn: 7200, tokenID: "fresh-id")
        h.hub.apply(.token("fresh-id", channel: h.channel.id, user: "ann", expiresAt: fresh.expiresAt, at: h.time.date, reason: "lost"), at: h.time)
        h.hub.renew(ann.link, claims: fresh, at: h.time)
        h.drain()
        #expect(h.lastMessage(to: ann.link).map { if case .error(.tokenRevoked, _) = $0 { true } else { false } } == true,
                "\(String(describing: h.lastMessage(to: ann.link)))")
        #expect(h.hub.isMember(channel: h.channel.id, user: "ann"))

        // A renewal refused for another user's token ends its own check only: a second renewal
        // still in its check still sees a revocation applied meanwhile.
        h.send(.renewToken(token: "bob's"), from: ann.link)
        h.send(.renewToken(token: "later"), from: ann.link)
        h.hub.renew(ann.link, claims: claims(h, "bob", expiresIn: 3600), at: h.time)
        let later = claims(h, "ann", expiresIn: 7200, tokenID: "later-id")
        h.hub.apply(.token("later-id", channel: h.channel.id, user: "ann", expiresAt: later.expiresAt, at: h.time.date, reason: "lost"), at: h.time)
        h.hub.renew(ann.link, claims: later, at: h.time)
        h.drain()
        #expect(h.lastMessage(to: ann.link).map { if case .error(.tokenRevoked, _) = $0 { true } else { false } } == true,
                "\(String(describing: h.lastMessage(to: ann.link)))")

        // Revocations before a check began are the store's to report: a join after them, with a
        // token issued after them, gets in, and nothing is kept once no check is under way.
        h.advance(1 * ms)
        let cat = h.join("cat")
        #expect(h.messages(to: cat.link).contains { if case .joined = $0 { true } else { false } })
        #expect(h.hub.revocationsDuringChecks.isEmpty && h.hub.tokenChecks.isEmpty)
    }

    func expiringNotices(_ h: Harness, _ link: Link) -> [Date] {
        h.messages(to: link).compactMap { if case .tokenExpiring(let at) = $0 { return at } else { return nil } }
    }

    @Test func aMemberIsWarnedBeforeItsTokenExpiresAndARenewalCarriesTheSessionOn() {
        let h = Harness()
        let expiry = h.time.date.addingTimeInterval(600)
        let ann = h.join("ann", expiresAt: expiry)
        let bob = h.join("bob", expiresAt: h.time.date.addingTimeInterval(86_400))
        h.advance(299_999 * ms)
        #expect(expiringNotices(h, ann.link).isEmpty)
        h.advance(1 * ms)  // five minutes before the end
        #expect(expiringNotices(h, ann.link) == [expiry])
        #expect(expiringNotices(h, bob.link).isEmpty)
        h.advance(60_000 * ms)
        #expect(expiringNotices(h, ann.link).count == 1, "said once")

        // The renewal is checked by the driver, as a join is.
        h.send(.renewToken(token: "fresh"), from: ann.link)
        #expect(h.other.last == .verifyRenewal(ann.link, token: "fresh", channel: h.channel.id))
        let fresh = claims(h, "ann", expiresIn: 3600)
        let storedBefore = h.stored.count, messagesBefore = h.messages.count
        h.hub.renew(ann.link, claims: fresh, at: h.time)
        h.drain()
        #expect(h.lastMessage(to: ann.link) == .tokenRenewed(expiresAt: fresh.expiresAt))
        #expect(h.hub.counters.tokenRenewals == 1)
        // The new token is written with the member, so a restart keeps it.
        let written = h.stored[storedBefore...].compactMap { if case .upsertMember(let m) = $0 { return m } else { return nil } }
        #expect(written.map(\.grant?.tokenID) == [fresh.tokenID])
        #expect(written.first?.grant?.tokenExpiresAt == fresh.expiresAt)
        // Nothing the others see of ann changed, so they hear nothing.
        #expect(!h.messages[messagesBefore...].contains { $0.link == bob.link })

        h.advance(300_000 * ms)  // past the old token's expiry
        #expect(h.closes.isEmpty && h.hub.counters.tokenExpiries == 0)
        h.advance(3_000_000 * ms)  // 55 minutes after the renewal: the new token's notice
        #expect(expiringNotices(h, ann.link) == [expiry, fresh.expiresAt])
        h.advance(300_000 * ms)
        #expect(h.closes.map(\.0) == [ann.link] && h.hub.counters.tokenExpiries == 1)
    }

    @Test func aTokenWithLessThanTheNoticeLeftIsAnnouncedWithTheJoin() {
        let h = Harness()
        let expiry = h.time.date.addingTimeInterval(90)
        let ann = h.join("ann", expiresAt: expiry)
        let toAnn = h.messages(to: ann.link)
        let joinedAt = toAnn.firstIndex { if case .joined = $0 { return true } else { return false } }
        let noticeAt = toAnn.firstIndex { if case .tokenExpiring = $0 { return true } else { return false } }
        #expect(joinedAt != nil && noticeAt != nil && joinedAt! < noticeAt!)
        #expect(expiringNotices(h, ann.link) == [expiry])
        h.advance(89_000 * ms)
        #expect(expiringNotices(h, ann.link).count == 1 && h.closes.isEmpty)
        h.advance(1_000 * ms)
        #expect(h.closes.map(\.0) == [ann.link])
    }

    @Test func aRenewedTokenBringsItsRightsAtOnce() {
        let h = Harness()
        let ann = h.join("ann"), bob = h.join("bob")
        h.send(.floorRequest(), from: ann.link)
        let burst = try! #require(h.grantedBurst(ann.link))
        h.audio(from: ann.link, burst: burst, sequence: 0, payload: [0])
        #expect(h.audio(to: bob.link).map(\.payload) == [[0]])
        // Bob's new token drops `listen`: ann's burst stops reaching him at once.
        h.hub.renew(bob.link, claims: claims(h, "bob", capabilities: [.talk], expiresIn: 3600), at: h.time)
        h.drain()
        h.audio(from: ann.link, burst: burst, sequence: 1, payload: [1])
        #expect(h.audio(to: bob.link).map(\.payload) == [[0]])
        #expect(h.hub.roster(of: h.channel.id).first { $0.userID == "bob" }?.canListen == false)
        // Ann's new token lets her listen only, with a role: she loses the floor, and everyone (ann too)
        // gets her new entry.
        var listenOnly = claims(h, "ann", capabilities: [.listen], expiresIn: 3600)
        listenOnly.role = "observer"
        h.hub.renew(ann.link, claims: listenOnly, at: h.time)
        h.drain()
        #expect(h.floorEvents(to: ann.link).last { $0.kind == .revoked }?.cause == .notAllowed)
        for link in [ann.link, bob.link] {
            let entry = h.messages(to: link).compactMap { if case .participant(let p) = $0, p.userID == "ann" { return p } else { return nil } }.last
            #expect(entry?.canTalk == false && entry?.role == "observer" && entry?.talking == false)
        }
        h.send(.floorRequest(), from: bob.link)
        let bobBurst = try! #require(h.grantedBurst(bob.link))
        h.audio(from: bob.link, burst: bobBurst, sequence: 0, payload: [2])
        #expect(h.audio(to: ann.link).map(\.payload) == [[2]])
        // A higher priority pre-empts at once.
        h.send(.floorRequest(), from: ann.link)
        #expect(h.floorEvents(to: ann.link).last?.kind == .denied)
        h.hub.renew(ann.link, claims: claims(h, "ann", priority: 9, expiresIn: 3600), at: h.time)
        h.drain()
        h.send(.floorRequest(), from: ann.link)
        #expect(h.floorEvents(to: bob.link).last { $0.kind == .revoked }?.cause == .preempted)
        #expect(h.grantedBurst(ann.link) != nil)
    }

    @Test func aRenewalThatIsNotTheMembersIsRefusedAndTheSessionCarriesOn() {
        let h = Harness()
        let ann = h.join("ann", expiresAt: h.time.date.addingTimeInterval(3600))
        h.hub.renew(ann.link, claims: claims(h, "bob", expiresIn: 7200), at: h.time)
        h.drain()
        guard case .error(.tokenWrongUser, let reason)? = h.lastMessage(to: ann.link) else {
            Issue.record("no tokenWrongUser error: \(String(describing: h.lastMessage(to: ann.link)))"); return
        }
        #expect(reason.contains("bob") && reason.contains("ann"))
        h.hub.renew(ann.link, claims: claims(h, "ann", channel: UUID(), expiresIn: 7200), at: h.time)
        h.drain()
        #expect(h.lastMessage(to: ann.link).map { if case .error(.tokenWrongChannel, _) = $0 { return true } else { return false } } == true)
        // What the driver found wrong with the token goes back as it is.
        h.hub.renewalRefused(ann.link, code: .tokenRevoked, reason: "revoked: lost phone")
        h.drain()
        #expect(h.lastMessage(to: ann.link) == .error(code: .tokenRevoked, reason: "revoked: lost phone"))
        #expect(h.hub.counters.tokenRenewalsRefused == 3 && h.hub.counters.tokenRenewals == 0)
        #expect(h.closes.isEmpty)
        #expect(h.hub.roster(of: h.channel.id).map(\.userID) == ["ann"])
        // The old token still ends the session.
        h.advance(3_600_000 * ms)
        #expect(h.closes.map(\.0) == [ann.link] && h.hub.counters.tokenExpiries == 1)
    }

    /// An administrator cuts ann to listen-only by issuing her a new token. The older token, which
    /// let her talk, is refused from then on, at a rejoin and at a renewal; a token from the same
    /// second as her newest still passes. The newest issue time is stored with her grant, from which
    /// a restarted server (or another node taking the channel) restores it.
    @Test func anOlderTokenThanTheMembersNewestIsRefused() {
        let h = Harness()
        let talking = h.time.date
        h.advance(60_000 * ms)
        let listening = h.join("ann", capabilities: [.listen], issuedAt: h.time.date)
        h.hub.closed(listening.link, at: h.time)
        h.drain()
        let stale = h.join("ann", capabilities: [.talk, .listen], issuedAt: talking)
        guard case .refused(.tokenRevoked, let reason)? = h.lastMessage(to: stale.link) else {
            Issue.record("the older token was let in: \(String(describing: h.lastMessage(to: stale.link)))"); return
        }
        #expect(reason.contains("older than the one you last joined with") && reason.contains("newest token"))
        #expect(h.hub.roster(of: h.channel.id).first { $0.userID == "ann" }?.canTalk == false)
        // The same second as the newest (iat is whole seconds) is not older.
        let again = h.join("ann", capabilities: [.listen], issuedAt: h.time.date.addingTimeInterval(0.5))
        #expect(again.slot == listening.slot)
        // A renewal with the older token is refused too, and the session carries on as it was.
        h.hub.renew(again.link, claims: ParticipantClaims(userID: "ann", name: "Ann", channel: h.channel.id, capabilities: [.talk, .listen],
                                                          issuedAt: talking, expiresAt: h.time.date.addingTimeInterval(3600)), at: h.time)
        h.drain()
        #expect(h.lastMessage(to: again.link).map { if case .error(.tokenRevoked, _) = $0 { return true } else { return false } } == true)
        #expect(h.hub.roster(of: h.channel.id).first { $0.userID == "ann" }?.canTalk == false)
        // The floor is what was stored: the member's grant carries the newest token's issue time.
        let stored = h.stored.compactMap { if case .upsertMember(let m) = $0 { return m.grant?.tokenIssuedAt } else { return nil } }.last
        #expect(stored.map { Int($0.timeIntervalSince1970) } == Int(h.time.date.addingTimeInterval(0.5).timeIntervalSince1970))
    }

    @Test func aRenewalCheckedAfterTheSessionEndedChangesNothing() {
        let h = Harness()
        let ann = h.join("ann")
        h.send(.renewToken(token: "fresh"), from: ann.link)
        h.hub.closed(ann.link, at: h.time)
        h.drain()
        let before = h.messages.count
        h.hub.renew(ann.link, claims: claims(h, "ann", capabilities: [.listen], expiresIn: 7200), at: h.time)
        h.hub.renewalRefused(ann.link, code: .tokenForged, reason: "forged")
        h.drain()
        #expect(h.messages.count == before)
        #expect(h.hub.counters.tokenRenewals == 0 && h.hub.counters.tokenRenewalsRefused == 0)
        #expect(h.hub.roster(of: h.channel.id).first?.canTalk == true)
        // And before joining there is nothing to renew.
        let link = Link(index: 99, generation: 1)
        h.hub.connected(link)
        h.send(.renewToken(token: "x"), from: link)
        #expect(h.lastMessage(to: link).map { if case .error(.notJoined, _) = $0 { return true } else { return false } } == true)
    }
}
