import ChannelProtocol
import ChannelStore
import Foundation
import ParticipantTokens
import Testing
import Wire
@testable import ChannelHub

// The hub is sans-I/O: these tests drive it with links, bytes and time, and read what it wants sent.
// Token verification is the driver's job (tested in PTTServerTests); here `admit` stands for a token
// that checked out.

let ms: UInt64 = 1_000_000

/// A hub with one channel, a clock, and a recorder for the audio it sends.
final class Harness {
    let hub: ChannelHub
    let channel = ChannelRecord(id: UUID(), name: "Ops", maxBurstSeconds: 60)
    var now = WireInstant(nanoseconds: 1_000 * ms)
    let epoch = Date(timeIntervalSince1970: 1_800_000_000)
    var sent: [(link: Link, bytes: [UInt8])] = []
    var messages: [(link: Link, message: ServerMessage)] = []
    var closes: [(Link, CloseCode)] = []
    var stored: [StoreOperation] = []
    var other: [HubOutput] = []
    private var nextIndex: UInt32 = 0

    init(mode: TransmissionMode = .halfDuplex, configuration: HubConfiguration = HubConfiguration()) {
        hub = ChannelHub(configuration: configuration)
        var record = channel
        record.mode = mode
        hub.upsertChannel(record, at: time)
    }

    var time: HubTime { HubTime(instant: now, date: epoch.addingTimeInterval(Double(now.nanoseconds) / 1e9)) }

    func advance(_ nanoseconds: UInt64) {
        now = now + nanoseconds
        if let deadline = hub.nextDeadline, deadline <= now { hub.handleTimeout(at: time, send: record) }
        drain()
    }

    func record(_ packet: UnsafeRawBufferPointer, _ link: Link) -> Bool {
        sent.append((link, Array(packet)))
        return true
    }

    func drain() {
        for output in hub.takeOutputs() {
            switch output {
            case .send(let message, let links): for link in links { messages.append((link, message)) }
            case .close(let link, let code, _): closes.append((link, code))
            case .store(let operation): stored.append(operation)
            default: other.append(output)
            }
        }
    }

    /// Connects and admits a member; returns its link and slot.
    @discardableResult
    func join(_ user: String, capabilities: Set<Capability> = [.talk, .listen], priority: UInt8 = 0,
              channel: UUID? = nil, tokenID: String = UUID().uuidString, issuedAt: Date? = nil,
              expiresAt: Date? = nil) -> (link: Link, slot: UInt16) {
        nextIndex += 1
        let link = Link(index: nextIndex, generation: 1)
        hub.connected(link)
        let target = channel ?? self.channel.id
        send(.join(token: "t", channel: target, reason: .developerRequest), from: link)
        hub.admit(link, claims: ParticipantClaims(userID: user, name: user.capitalized, channel: target,
                                                  capabilities: capabilities, priority: priority, issuedAt: issuedAt ?? time.date,
                                                  expiresAt: expiresAt ?? epoch.addingTimeInterval(3600), tokenID: tokenID),
                  reason: .developerRequest, at: time)
        drain()
        for case .joined(_, let you, _, _) in messages(to: link) { return (link, you) }
        return (link, 0)
    }

    func send(_ message: ClientMessage, from link: Link) {
        hub.control(link, bytes: MessageCodec().encode(message), at: time)
        drain()
    }

    func audio(from link: Link, burst: UInt16, sequence: UInt16, payload: [UInt8], flags: AudioHeader.Flags = []) {
        let datagram = AudioHeader(flags: flags, burst: burst, sequence: sequence).datagram(payload: payload)
        _ = datagram.withUnsafeBytes { hub.receiveAudio(from: link, datagram: $0, at: time.instant, send: record) }
    }

    func messages(to link: Link) -> [ServerMessage] { messages.filter { $0.link == link }.map(\.message) }
    func lastMessage(to link: Link) -> ServerMessage? { messages(to: link).last }
    func floorEvents(to link: Link) -> [FloorEvent] {
        messages(to: link).compactMap { if case .floor(let event) = $0 { return event } else { return nil } }
    }
    func audio(to link: Link) -> [(header: AudioHeader, payload: [UInt8])] {
        sent.filter { $0.link == link }.map { packet in
            packet.bytes.withUnsafeBytes { (AudioHeader(parsing: $0)!, Array(packet.bytes[AudioHeader.size...])) }
        }
    }
    func grantedBurst(_ link: Link) -> UInt16? { floorEvents(to: link).last { $0.kind == .granted }?.burst }
}

@Suite struct ChannelHubTests {
    @Test func aTalkerBackWithAListenOnlyTokenLosesTheFloor() {
        let h = Harness()
        let ann = h.join("ann"), bob = h.join("bob")
        h.send(.floorRequest(), from: ann.link)
        let burst = try! #require(h.grantedBurst(ann.link))
        // Ann's phone rejoins on a new connection with a listen-only token, mid-burst.
        let again = h.join("ann", capabilities: [.listen])
        #expect(again.slot == ann.slot)
        // `joined` first, then the revocation, to the new connection.
        let toAnn = h.messages(to: again.link)
        let joinedAt = toAnn.firstIndex { if case .joined = $0 { return true } else { return false } }
        let revokedAt = toAnn.firstIndex { if case .floor(let e) = $0 { return e.kind == .revoked && e.cause == .notAllowed } else { return false } }
        #expect(joinedAt != nil && revokedAt != nil && joinedAt! < revokedAt!)
        #expect(h.floorEvents(to: bob.link).contains { $0.kind == .ended && $0.slot == ann.slot })
        // Its audio is no longer relayed.
        h.audio(from: again.link, burst: burst, sequence: 1, payload: [1, 2, 3])
        #expect(h.audio(to: bob.link).isEmpty)
        #expect(h.hub.counters.drops(.notFloorHolder) == 1)
        #expect(h.stored.contains { if case .logTransmission(let r) = $0 { return r.endReason == "notAllowed" } else { return false } })
    }

    /// Every answer about a member's place at the floor names its newest request, including the grant
    /// from the queue long after it and the answers of the rate limiter; requests without a number
    /// (older clients) get answers without one.
    @Test func floorAnswersNameTheRequestTheyAnswer() {
        func answer(_ h: Harness, _ member: (link: Link, slot: UInt16)) -> String {
            h.floorEvents(to: member.link).last.map { "\($0.kind) \($0.request.map(String.init) ?? "nil")" } ?? "none"
        }
        var configuration = HubConfiguration()
        configuration.controlMessagesPerSecond = 5
        configuration.controlMessageBurst = 10
        let h = Harness(configuration: configuration)
        let ann = h.join("ann"), bob = h.join("bob"), cy = h.join("cy", capabilities: [.listen])
        h.send(.floorRequest(request: 7), from: ann.link)
        #expect(answer(h, ann) == "granted 7")
        h.send(.floorRequest(request: 3), from: bob.link)
        #expect(answer(h, bob) == "queued 3")
        h.send(.floorRequest(request: 1), from: cy.link)
        #expect(answer(h, cy) == "denied 1")
        // Bob withdraws request 3 and asks again with 4: the grant that comes when Ann lets go names 4.
        h.send(.floorRelease, from: bob.link)
        h.send(.floorRequest(request: 4), from: bob.link)
        h.send(.floorRelease, from: ann.link)
        let grant = try! #require(h.floorEvents(to: bob.link).last)
        #expect(grant.kind == .granted && grant.request == 4)
        // Over the rate limit, the limiter's answer names the request it answers.
        h.advance(1_000 * ms)
        for n in UInt32(10)..<30 { h.send(.floorRequest(request: n), from: bob.link) }
        #expect(h.hub.counters.controlRateLimited > 0)
        #expect(answer(h, bob) == "granted 29")
        // The repeated grant gives the time left of the burst, not the channel's whole limit.
        #expect(h.floorEvents(to: bob.link).last?.maxBurstSeconds == h.channel.maxBurstSeconds - 1)
        // Not to others, and not unasked: `taken` and `ended` carry no number.
        #expect(h.floorEvents(to: cy.link).filter { $0.kind != .denied }.allSatisfy { $0.request == nil })
        h.send(.floorRequest(), from: ann.link)
        #expect(answer(h, ann) == "queued nil")
    }

    /// A request that won't wait (`queue` false, as `walkie talk` without --wait sends) is denied
    /// busy, with the talker named by the roster, and waits nowhere: the member already waiting
    /// keeps its place.
    @Test func aRequestThatWontWaitIsDeniedBusyAndLeavesTheQueueAlone() throws {
        let h = Harness()
        let ann = h.join("ann"), bob = h.join("bob"), cy = h.join("cy")
        h.send(.floorRequest(), from: ann.link)
        h.send(.floorRequest(), from: bob.link)
        #expect(h.floorEvents(to: bob.link).last?.kind == .queued)
        // The admin API's live roster shows who waits, and where.
        #expect(h.hub.liveRoster(of: h.channel.id).map { "\($0.participant.userID) \($0.queuePosition.map(String.init) ?? "-")" }
                == ["ann -", "bob 1", "cy -"])
        h.send(.floorRequest(request: 5, queue: false), from: cy.link)
        let answer = try #require(h.floorEvents(to: cy.link).last)
        #expect(answer.kind == .denied && answer.cause == .busy && answer.request == 5)
        #expect(h.hub.counters.floorDenials == 1)
        h.send(.floorRelease, from: ann.link)
        #expect(h.floorEvents(to: bob.link).last?.kind == .granted)
        #expect(h.floorEvents(to: cy.link).last?.kind != .granted)
    }

    /// Slots are 16 bits: a channel with 65,535 members refuses the next newcomer as busy (the search
    /// for a free slot used to loop forever on the shared event loop), stored members past the limit
    /// stay out of the hub, and a member already in keeps its slot.
    @Test func aFullChannelRefusesNewcomersInsteadOfHanging() {
        let h = Harness()
        let big = ChannelRecord(name: "Big")
        let members = (0 ..< Int(UInt16.max) + 5).map {
            MemberRecord(channelID: big.id, userID: "u\($0)", displayName: "U\($0)")
        }
        h.hub.upsertChannel(big, members: members, at: h.time)
        let roster = h.hub.roster(of: big.id)
        #expect(roster.count == Int(UInt16.max))
        #expect(Set(roster.map(\.slot)).count == Int(UInt16.max) && !roster.contains { $0.slot == 0 }, "no slot given twice, none 0")
        let late = h.join("newcomer", channel: big.id)
        #expect(h.lastMessage(to: late.link).map { if case .refused(.serverBusy, let why) = $0 { why.contains("65,535") } else { false } } == true)
        let known = h.join("u7", channel: big.id)
        #expect(known.slot == roster.first { $0.userID == "u7" }?.slot)
    }

    @Test func switchingAFullDuplexChannelToHalfDuplexLeavesOneTalker() {
        let h = Harness(mode: .fullDuplex)
        let ann = h.join("ann"), bob = h.join("bob"), cy = h.join("cy", capabilities: [.listen])
        h.send(.floorRequest(), from: ann.link)
        h.advance(10 * ms)
        h.send(.floorRequest(), from: bob.link)
        let bobBurst = try! #require(h.grantedBurst(bob.link))
        var record = h.channel
        record.mode = .halfDuplex
        h.hub.upsertChannel(record, at: h.time)
        h.drain()
        // Bob, granted last, loses the floor; everyone hears of the new mode first.
        #expect(h.floorEvents(to: bob.link).last { $0.kind == .revoked }?.cause == .channelChanged)
        #expect(h.floorEvents(to: ann.link).last { $0.kind == .revoked } == nil)
        let toCy = h.messages(to: cy.link)
        let descriptorAt = toCy.firstIndex { if case .descriptor(let info) = $0 { return info.mode == .halfDuplex } else { return false } }
        let endedAt = toCy.firstIndex { if case .floor(let e) = $0 { return e.kind == .ended && e.slot == bob.slot } else { return false } }
        #expect(descriptorAt != nil && endedAt != nil && descriptorAt! < endedAt!)
        h.audio(from: bob.link, burst: bobBurst, sequence: 0, payload: [9])
        #expect(h.audio(to: cy.link).isEmpty)
        // And a new request now waits, as in any half-duplex channel.
        h.send(.floorRequest(), from: bob.link)
        #expect(h.floorEvents(to: bob.link).last?.kind == .queued)
    }

    @Test func aSessionEndsWhenItsTokenExpires() {
        // Ann holds the floor without sending audio for 30 s: no silence limit here, so that the
        // expiry is what ends her burst.
        var configuration = HubConfiguration()
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

    @Test func joinedMemberGetsChannelRosterAndOthersHearOfIt() {
        let h = Harness()
        let ann = h.join("ann")
        guard case .joined(let info, let you, let roster, let talkers)? = h.lastMessage(to: ann.link) else {
            Issue.record("no joined message"); return
        }
        #expect(info.name == "Ops" && info.id == h.channel.id && you == ann.slot)
        #expect(roster.map(\.userID) == ["ann"] && talkers.isEmpty)
        let bob = h.join("bob", capabilities: [.listen])
        #expect(h.messages(to: ann.link).contains(.participant(Participant(
            slot: bob.slot, userID: "bob", name: "Bob", canTalk: false, canListen: true))))
        guard case .joined(_, _, let roster2, _)? = h.lastMessage(to: bob.link) else { Issue.record("no joined"); return }
        #expect(roster2.map(\.userID) == ["bob", "ann"], "the joiner's own entry first, then the rest in slot order")
        #expect(h.stored.contains { if case .upsertMember(let m) = $0 { return m.userID == "bob" } else { return false } })
        #expect(h.hub.counters.joins == 2)
    }

    @Test func audioFromTheFloorHolderReachesEveryListenerButTheTalkerByteForByte() {
        let h = Harness()
        let ann = h.join("ann"), bob = h.join("bob"), cat = h.join("cat", capabilities: [.listen])
        let deaf = h.join("dan", capabilities: [.talk])  // may talk, may not listen
        h.send(.floorRequest(), from: ann.link)
        let burst = try! #require(h.grantedBurst(ann.link))
        #expect(h.floorEvents(to: bob.link).last == FloorEvent(kind: .taken, slot: ann.slot, burst: burst))
        let payload = (0..<80).map { UInt8($0) }
        h.audio(from: ann.link, burst: burst, sequence: 0, payload: payload)
        #expect(h.audio(to: ann.link).isEmpty)
        #expect(h.audio(to: deaf.link).isEmpty)
        for listener in [bob, cat] {
            let got = h.audio(to: listener.link)
            #expect(got.count == 1)
            #expect(got.first?.payload == payload)
            #expect(got.first?.header == AudioHeader(slot: ann.slot, burst: burst, sequence: 0))
        }
        #expect(h.hub.counters.packetsOut == 2)
    }

    @Test func audioFromAnyoneElseIsDroppedAndCounted() {
        let h = Harness()
        let ann = h.join("ann"), bob = h.join("bob")
        h.send(.floorRequest(), from: ann.link)
        let burst = h.grantedBurst(ann.link)!
        h.audio(from: bob.link, burst: burst, sequence: 0, payload: [1, 2, 3])
        h.audio(from: ann.link, burst: burst &+ 1, sequence: 0, payload: [1])
        h.audio(from: Link(index: 99, generation: 1), burst: burst, sequence: 0, payload: [1])
        _ = [0x00, 0x41].withUnsafeBytes { h.hub.receiveAudio(from: ann.link, datagram: $0, at: h.time.instant, send: h.record) }
        #expect(h.sent.isEmpty)
        #expect(h.hub.counters.drops(.notFloorHolder) == 1)
        #expect(h.hub.counters.drops(.staleBurst) == 1)
        #expect(h.hub.counters.drops(.notJoined) == 1)
        #expect(h.hub.counters.drops(.malformed) == 1)
    }

    @Test func contentionQueuesThenGrantsOnRelease() {
        let h = Harness()
        let ann = h.join("ann"), bob = h.join("bob")
        h.send(.floorRequest(), from: ann.link)
        h.send(.floorRequest(), from: bob.link)
        #expect(h.floorEvents(to: bob.link).last == FloorEvent(kind: .queued, slot: bob.slot, position: 1))
        h.send(.floorRelease, from: ann.link)
        #expect(h.floorEvents(to: bob.link).last?.kind == .granted)
        #expect(h.floorEvents(to: ann.link).suffix(2).map(\.kind) == [.ended, .taken])
        #expect(h.stored.contains { if case .logTransmission(let t) = $0 { return t.userID == "ann" && t.endReason == "released" } else { return false } })
    }

    @Test func aBurstCutShortByLeavingIsStillLogged() {
        let h = Harness()
        let ann = h.join("ann"), bob = h.join("bob")
        h.send(.floorRequest(), from: ann.link)
        #expect(h.grantedBurst(ann.link) != nil)
        h.send(.leave, from: ann.link)
        let logged = h.stored.compactMap { if case .logTransmission(let t) = $0, t.endReason != TransmissionRecord.inProgress { return t } else { return nil } }
        #expect(logged.map(\.userID) == ["ann"] && logged.first?.endReason == "left", "\(logged)")
        // The burst was logged as it started too, with the same start: the end replaces that record.
        let started = h.stored.compactMap { if case .logTransmission(let t) = $0, t.endReason == TransmissionRecord.inProgress { return t } else { return nil } }
        #expect(started.map(\.startedAt) == logged.map(\.startedAt) && started.first?.userID == "ann", "\(started)")
        #expect(h.floorEvents(to: bob.link).contains { $0.kind == .ended && $0.slot == ann.slot })
    }

    /// A burst going on has its length written every second (the driver asks once a second), so a
    /// server killed during it leaves its length in the log to within about a second, not 0; the
    /// end replaces it.
    @Test func aLongBurstHasItsLengthSoFarLoggedEverySecond() {
        var configuration = HubConfiguration()
        configuration.talkerSilenceLimit = 0  // no audio in this test
        let h = Harness(configuration: configuration)
        let ann = h.join("ann")
        _ = h.join("bob")
        h.send(.floorRequest(), from: ann.link)
        #expect(h.grantedBurst(ann.link) != nil)
        func progress() -> [TransmissionRecord] {
            h.stored.compactMap { if case .logTransmission(let t) = $0, t.endReason == TransmissionRecord.inProgress { t } else { nil } }
        }
        for _ in 0 ..< 12 {
            h.advance(1_000 * ms)
            h.hub.logBurstProgress(at: h.time)
            h.drain()
        }
        let written = progress()
        #expect(written.map(\.durationMilliseconds) == (0...12).map { $0 * 1_000 }, "the start, then each second: \(written)")
        #expect(Set(written.map(\.startedAt)).count == 1 && written.allSatisfy { $0.userID == "ann" })
        h.send(.floorRelease, from: ann.link)
        h.hub.logBurstProgress(at: h.time)
        h.drain()
        #expect(progress().count == 13, "nothing more once it ended")
        #expect(h.stored.contains { if case .logTransmission(let t) = $0 { t.endReason == "released" && t.durationMilliseconds == 12_000 } else { false } })
    }

    /// A hub allowing 20 control messages a second, in bursts of 40.
    func rateLimitedHarness() -> Harness {
        var configuration = HubConfiguration()
        configuration.controlMessagesPerSecond = 20
        configuration.controlMessageBurst = 40
        return Harness(configuration: configuration)
    }

    @Test func aConnectionThatFloodsControlMessagesIsHeldToItsRate() {
        let h = rateLimitedHarness()
        let ann = h.join("ann"), bob = h.join("bob")
        // The join was one message; 39 more fit the burst, then every message is over the rate.
        for _ in 0..<30 {
            h.send(.floorRequest(), from: ann.link)
            h.send(.floorRelease, from: ann.link)
        }
        // The requests over the rate are dropped; releases are always taken.
        #expect(h.hub.counters.controlRateLimited == 10)
        let annEvents = h.floorEvents(to: ann.link)
        #expect(annEvents.filter { $0.kind == .granted }.count == 20)
        #expect(annEvents.filter { $0.kind == .denied && $0.cause == .rateLimited }.count == 10, "each dropped request is denied")
        #expect(h.floorEvents(to: bob.link).filter { $0.kind == .taken }.count == 20, "the others hear only what was let through")
        #expect(h.floorEvents(to: bob.link).filter { $0.kind == .ended }.count == 20, "and every burst that was let through ended")
        // Other messages over the rate get one error a second, not one each.
        for _ in 0..<5 { h.send(.setMuted(true), from: ann.link) }
        let errors = h.messages.filter { if $0.link == ann.link, case .error(.rateLimited, _) = $0.message { return true } else { return false } }
        #expect(errors.count == 1)
        // The allowance refills with time: 100 ms is two more messages.
        h.advance(100 * ms)
        h.send(.floorRequest(), from: ann.link)
        #expect(h.floorEvents(to: ann.link).last?.kind == .granted)
        // Another connection has its own allowance.
        h.send(.floorRequest(), from: bob.link)
        #expect(h.floorEvents(to: bob.link).last?.kind == .queued)
    }

    /// A request over the rate from a member that already talks or waits is answered as things stand:
    /// a denial would end the client's request while the floor still counts it.
    @Test func aRequestOverTheRateFromATalkerOrAWaiterIsNotDenied() {
        let h = rateLimitedHarness()
        let ann = h.join("ann"), bob = h.join("bob"), dan = h.join("dan")
        h.send(.floorRequest(), from: ann.link)
        h.send(.floorRequest(), from: bob.link)
        h.send(.floorRequest(), from: dan.link)
        #expect(h.floorEvents(to: bob.link).last?.kind == .queued)
        for _ in 0..<60 { h.send(.setMuted(true), from: ann.link); h.send(.setMuted(true), from: bob.link) }
        #expect(h.hub.counters.controlRateLimited > 0)
        let denials = h.hub.counters.floorDenials
        let toOthers = h.messages(to: dan.link).count
        h.send(.floorRequest(), from: ann.link)
        #expect(h.floorEvents(to: ann.link).last?.kind == .granted, "confirmed: \(h.floorEvents(to: ann.link).suffix(2))")
        h.send(.floorRequest(), from: bob.link)
        let bobLast = h.floorEvents(to: bob.link).last
        #expect(bobLast?.kind == .queued && bobLast?.position == 1, "\(String(describing: bobLast))")
        #expect(h.hub.counters.floorDenials == denials)
        // Answered to the requester alone: the others waiting are not told their places again.
        #expect(h.messages(to: dan.link).count == toOthers)
        // A new request over the rate is still denied, and counted as a denial.
        let cat = h.join("cat")
        for _ in 0..<60 { h.send(.setMuted(true), from: cat.link) }
        h.send(.floorRequest(), from: cat.link)
        let last = h.floorEvents(to: cat.link).last
        #expect(last?.kind == .denied && last?.cause == .rateLimited, "\(String(describing: last))")
        #expect(h.hub.counters.floorDenials == denials + 1)
    }

    /// A talker whose button bounced (or whose app looped) has spent its allowance: its release still
    /// frees the floor, and its leave still leaves, rather than hold everyone up until the maximum
    /// burst length.
    @Test func releaseAndLeaveAreTakenOverTheRate() {
        let h = rateLimitedHarness()
        let ann = h.join("ann"), bob = h.join("bob")
        h.send(.floorRequest(), from: ann.link)
        #expect(h.grantedBurst(ann.link) != nil)
        for index in 0..<60 { h.send(.setMuted(index % 2 == 0), from: ann.link) }
        #expect(h.hub.counters.controlRateLimited > 0)
        h.send(.floorRelease, from: ann.link)
        #expect(h.floorEvents(to: bob.link).suffix(2).map(\.kind) == [.ended, .idle], "the release freed the floor")
        h.send(.floorRequest(), from: bob.link)
        #expect(h.floorEvents(to: bob.link).last?.kind == .granted)
        for _ in 0..<60 { h.send(.setMuted(true), from: bob.link) }
        h.send(.leave, from: bob.link)
        #expect(h.closes.contains { $0.0 == bob.link && $0.1 == .normal }, "the leave was taken")
        #expect(h.hub.roster(of: h.channel.id).map(\.userID) == ["ann"])
        #expect(h.floorEvents(to: ann.link).suffix(2).map(\.kind) == [.ended, .idle], "and ended bob's burst")
        // A connection that never joined gets no exemption: one error a second, not one per leave.
        let stranger = Link(index: 999, generation: 1)
        h.hub.connected(stranger)
        for _ in 0..<100 { h.send(.leave, from: stranger) }
        let errors = h.messages(to: stranger).filter { if case .error = $0 { return true } else { return false } }
        #expect(errors.count == 41, "\(errors.count) errors: the 40 within the budget and one notice")
    }

    /// A connection that never joins is refused and closed once the join deadline has passed since
    /// a sweep first saw it: the handshake doesn't authenticate clients, and each open connection
    /// pins transport and hub state. One that joins is left alone.
    @Test func aConnectionThatNeverJoinsIsClosedAfterTheDeadline() {
        let h = Harness()
        let ann = h.join("ann")
        let idle = Link(index: 900, generation: 1), late = Link(index: 901, generation: 1)
        h.hub.connected(idle)
        h.hub.connected(late)
        h.hub.sweepLiveness(at: h.time) { _ in true }
        h.advance(5_000_000_000)
        h.send(.join(token: "t", channel: h.channel.id, reason: .developerRequest), from: late)  // joining, if late
        h.hub.sweepLiveness(at: h.time) { _ in true }
        h.drain()
        #expect(!h.closes.contains { $0.0 == idle }, "5 s is within the deadline")
        h.advance(5_000_000_000)
        h.hub.sweepLiveness(at: h.time) { _ in true }
        h.drain()
        #expect(h.closes.contains { $0.0 == idle && $0.1 == .refused })
        #expect(h.messages(to: idle).contains { if case .refused(.notJoined, let why) = $0 { return why.contains("10 s") } else { return false } })
        #expect(!h.closes.contains { $0.0 == late || $0.0 == ann.link }, "joining and joined connections stay")
        // Closed by the transport afterwards: nothing is left of it.
        h.hub.closed(idle, at: h.time)
        #expect(h.hub.unjoined.isEmpty)
    }

    /// Burst numbers start where the configuration says, per channel, and wrap in the header's 16 bits.
    @Test func burstNumbersStartWhereConfiguredAndWrap() throws {
        var configuration = HubConfiguration()
        configuration.firstBurst = { _ in 65_535 }
        let h = Harness(configuration: configuration)
        let ann = h.join("ann"), bob = h.join("bob")
        h.send(.floorRequest(), from: ann.link)
        #expect(h.grantedBurst(ann.link) == 65_535)
        h.send(.floorRelease, from: ann.link)
        h.send(.floorRequest(), from: ann.link)
        let wrapped = try #require(h.grantedBurst(ann.link))
        #expect(wrapped == 0)
        h.audio(from: ann.link, burst: wrapped, sequence: 0, payload: [1, 2, 3])
        #expect(h.audio(to: bob.link).map(\.payload) == [[1, 2, 3]], "audio of the wrapped burst is relayed")
    }

    /// Slots wrap past 65535 to 1: slot 0 is never a member's, and the last slot is used.
    @Test func slotsWrapWithoutZero() {
        let h = Harness()
        h.hub.channels[h.channel.id]!.nextSlot = 65_534
        let ann = h.join("ann"), bob = h.join("bob"), cat = h.join("cat")
        #expect([ann.slot, bob.slot, cat.slot] == [65_534, 65_535, 1])
        // A slot still held is skipped.
        h.hub.channels[h.channel.id]!.nextSlot = 65_535
        #expect(h.join("dan").slot == 2, "65535 (bob) and 1 (cat) are taken")
    }

    @Test func higherPriorityPreemptsWithAReason() {
        let h = Harness()
        let ann = h.join("ann", priority: 1), chief = h.join("chief", priority: 200)
        h.send(.floorRequest(), from: ann.link)
        h.send(.floorRequest(), from: chief.link)
        let revoked = h.floorEvents(to: ann.link).first { $0.kind == .revoked }
        #expect(revoked?.cause == .preempted)
        #expect(revoked?.reason?.contains("Chief") == true)
        #expect(h.floorEvents(to: chief.link).last?.kind == .granted)
        #expect(h.stored.contains { if case .logTransmission(let t) = $0 { return t.endReason == "preempted" } else { return false } })
    }

    @Test func listenOnlyMemberIsDeniedWithNotAllowed() {
        let h = Harness()
        let cat = h.join("cat", capabilities: [.listen])
        h.send(.floorRequest(), from: cat.link)
        #expect(h.floorEvents(to: cat.link).last == FloorEvent(kind: .denied, slot: cat.slot, cause: .notAllowed,
                                                               reason: "your token allows listening only"))
        #expect(h.hub.counters.floorDenials == 1)
    }

    @Test func maximumBurstRevokes() {
        var configuration = HubConfiguration()
        configuration.disconnectGrace = 2_000 * ms
        let h = Harness(configuration: configuration)
        var record = h.channel
        record.maxBurstSeconds = 5
        h.hub.upsertChannel(record, at: h.time)
        let ann = h.join("ann")
        h.send(.floorRequest(), from: ann.link)
        h.audio(from: ann.link, burst: h.grantedBurst(ann.link)!, sequence: 0, payload: [1])
        h.advance(4_999 * ms)
        #expect(h.floorEvents(to: ann.link).last?.kind == .granted)
        h.advance(1 * ms)
        #expect(h.floorEvents(to: ann.link).contains { $0.kind == .revoked && $0.cause == .maxBurstReached })
    }

    @Test func aMaximumBurstOutOfRangeFromTheDatabaseIsClampedNotTrapped() {
        // A row edited in the sqlite3 shell skips the store's validation.
        let h = Harness()
        for (seconds, expected) in [(-1, 1), (0, 1), (Int.max, 600)] {
            var record = h.channel
            record.maxBurstSeconds = seconds
            h.hub.upsertChannel(record, at: h.time)
            let ann = h.join("ann\(seconds)")
            h.send(.floorRequest(), from: ann.link)
            let granted = h.floorEvents(to: ann.link).last { $0.kind == .granted }
            #expect(granted?.maxBurstSeconds == expected, "\(seconds)")
            h.send(.floorRelease, from: ann.link)
        }
    }

    @Test func lateJoinerGetsTheBurstFromItsFirstPacketThenLive() {
        let h = Harness()
        let ann = h.join("ann"), bob = h.join("bob")
        h.send(.floorRequest(), from: ann.link)
        let burst = h.grantedBurst(ann.link)!
        for sequence in 0..<40 { h.audio(from: ann.link, burst: burst, sequence: UInt16(sequence), payload: [UInt8(sequence)]) }
        let late = h.join("late")
        guard case .joined(_, _, _, let talkers)? = h.lastMessage(to: late.link) else { Issue.record("no joined"); return }
        #expect(talkers == [Talker(slot: ann.slot, burst: burst)])
        // Live packets while catching up go into the recording, not straight to the late joiner.
        h.audio(from: ann.link, burst: burst, sequence: 40, payload: [40])
        #expect(h.audio(to: late.link).isEmpty)
        h.advance(0)  // the first catch-up batch is due at once
        #expect(h.audio(to: late.link).count == 25)
        for _ in 0..<3 { h.advance(10 * ms) }
        h.audio(from: ann.link, burst: burst, sequence: 41, payload: [41])
        let got = h.audio(to: late.link)
        #expect(got.map(\.header.sequence) == (0...41).map { UInt16($0) })
        #expect(got.prefix(41).allSatisfy { $0.header.flags.contains(.catchUp) })
        #expect(!got.last!.header.flags.contains(.catchUp))
        #expect(got.map(\.payload) == (0...41).map { [UInt8($0)] })
        #expect(h.audio(to: bob.link).count == 42)
        // Catch-up has counters of its own; the live ones count the relay alone.
        #expect(h.hub.counters.catchUpPacketsOut == 41 && h.hub.counters.catchUpBytesOut == 41 * (AudioHeader.size + 1))
        #expect(h.hub.counters.packetsOut == 42 + 1 && h.hub.counters.bytesOut == 43 * (AudioHeader.size + 1))
    }

    /// A burst that starts while a late joiner is still being replayed the previous one reaches it
    /// from its first packet, after the replay, and then live: nothing of it is skipped.
    @Test func aBurstStartedDuringAReplayIsReplayedFromItsFirstPacketToo() throws {
        let h = Harness()
        let ann = h.join("ann"), bob = h.join("bob"), cy = h.join("cy")
        h.send(.floorRequest(), from: ann.link)
        let first = h.grantedBurst(ann.link)!
        for sequence in 0..<100 { h.audio(from: ann.link, burst: first, sequence: UInt16(sequence), payload: [1, UInt8(sequence)]) }
        let late = h.join("late")
        h.advance(0)
        #expect(h.audio(to: late.link).count == 25, "the first batch of the replay")
        h.send(.floorRelease, from: ann.link)
        // Bob takes the floor while the late joiner is 75 packets short of the end of ann's burst; a
        // catch-up tick passes before his first packet (his recording is empty until then).
        h.send(.floorRequest(), from: bob.link)
        let second = try #require(h.grantedBurst(bob.link))
        h.advance(10 * ms)
        for sequence in 0..<5 { h.audio(from: bob.link, burst: second, sequence: UInt16(sequence), payload: [2, UInt8(sequence)]) }
        #expect(h.audio(to: cy.link).filter { $0.payload.first == 2 }.count == 5, "members on the fan-out hear bob at once")
        for _ in 0..<9 { h.advance(10 * ms) }
        for sequence in 5..<8 { h.audio(from: bob.link, burst: second, sequence: UInt16(sequence), payload: [2, UInt8(sequence)]) }
        let got = h.audio(to: late.link)
        let ann1 = got.filter { $0.payload.first == 1 }, bob2 = got.filter { $0.payload.first == 2 }
        #expect(ann1.map(\.header.sequence) == (0..<100).map { UInt16($0) }, "ann's burst whole")
        #expect(bob2.map(\.header.sequence) == (0..<8).map { UInt16($0) }, "bob's from its first packet, no gap, no duplicate")
        #expect(got.firstIndex { $0.payload.first == 2 }! > got.lastIndex { $0.payload.first == 1 }!, "bob's after ann's")
        #expect(bob2.prefix(5).allSatisfy { $0.header.flags.contains(.catchUp) } && bob2.prefix(5).allSatisfy { $0.header.slot == bob.slot })
        #expect(!bob2.last!.header.flags.contains(.catchUp), "then live")
        #expect(h.audio(to: bob.link).filter { $0.payload.first == 2 }.isEmpty, "never back to the talker")
    }

    /// Full duplex, two bursts live when a member joins: it is replayed both, and the packets of the
    /// one it caught up with first keep reaching it while the other is replayed; then both live.
    @Test func aReplayOfTwoLiveBurstsLosesNothingOfEither() throws {
        let h = Harness(mode: .fullDuplex)
        let ann = h.join("ann"), cy = h.join("cy")
        h.send(.floorRequest(), from: ann.link)
        h.send(.floorRequest(), from: cy.link)
        let a = try #require(h.grantedBurst(ann.link)), c = try #require(h.grantedBurst(cy.link))
        for sequence in 0..<10 { h.audio(from: ann.link, burst: a, sequence: UInt16(sequence), payload: [1, UInt8(sequence)]) }
        for sequence in 0..<60 { h.audio(from: cy.link, burst: c, sequence: UInt16(sequence), payload: [3, UInt8(sequence)]) }
        let late = h.join("late")
        var annNext: UInt16 = 10, cyNext: UInt16 = 60
        for _ in 0..<12 {
            h.advance(10 * ms)
            h.audio(from: ann.link, burst: a, sequence: annNext, payload: [1, UInt8(truncatingIfNeeded: annNext)])
            h.audio(from: cy.link, burst: c, sequence: cyNext, payload: [3, UInt8(truncatingIfNeeded: cyNext)])
            annNext += 1
            cyNext += 1
        }
        let got = h.audio(to: late.link)
        #expect(got.filter { $0.payload.first == 1 }.map(\.header.sequence) == (0..<annNext).map { $0 }, "ann's burst without a gap")
        #expect(got.filter { $0.payload.first == 3 }.map(\.header.sequence) == (0..<cyNext).map { $0 }, "cy's burst without a gap")
        #expect(!got.last!.header.flags.contains(.catchUp), "live by the end")
        #expect(h.hub.catchingUp.isEmpty)
    }

    @Test func aFinishedBurstIsLetGoWhenItsLastReplayEndsEarly() throws {
        let h = Harness()
        let ann = h.join("ann")
        h.send(.floorRequest(), from: ann.link)
        let burst = try #require(h.grantedBurst(ann.link))
        for sequence in 0 ..< 200 as Range<UInt16> { h.audio(from: ann.link, burst: burst, sequence: sequence, payload: [UInt8](repeating: 7, count: 80)) }
        let late = h.join("late")
        h.send(.floorRelease, from: ann.link)
        let channel = try #require(h.hub.channels[h.channel.id])
        #expect(channel.recordings.count == 1, "the late joiner is still reading it")
        h.hub.closed(late.link, at: h.time)
        h.drain()
        // Its replay was cut short, so it is owed the burst for the missed-burst window; then the
        // recording goes back even though no later burst comes to recycle it.
        #expect(channel.recordings.count == 1)
        h.advance(HubConfiguration().missedBurstWindow)
        #expect(channel.recordings.isEmpty, "nobody reads it or is owed it any more")
        #expect(channel.spareRecordings.count == 1)
    }

    /// Ann says three words while Bob's phone is asleep; the push wakes it, and by the time his app
    /// has joined, the burst is over. He still hears it, once, from its first packet.
    @Test func aMemberWhoMissedABurstThatEndedIsReplayedItOnJoining() throws {
        let h = Harness()
        let ann = h.join("ann"), bob = h.join("bob"), cy = h.join("cy")
        h.send(.registerPushToken(token: "b0b0b0", environment: .production), from: bob.link)
        h.hub.closed(bob.link, at: h.time)
        h.advance(3_000 * ms)  // past the grace: Bob is offline, and a burst would wake him
        h.send(.floorRequest(), from: ann.link)
        let burst = try #require(h.grantedBurst(ann.link))
        for sequence in 0 ..< 3 as Range<UInt16> { h.audio(from: ann.link, burst: burst, sequence: sequence, payload: [1, UInt8(sequence)]) }
        h.advance(60 * ms)
        h.send(.floorRelease, from: ann.link)
        h.advance(2_000 * ms)
        let woken = h.join("bob")
        h.advance(10 * ms)
        let got = h.audio(to: woken.link)
        #expect(got.map(\.header.sequence) == [0, 1, 2])
        #expect(got.allSatisfy { $0.header.flags.contains(.catchUp) && $0.header.slot == ann.slot && $0.header.burst == burst })
        #expect(got.map(\.payload) == [[1, 0], [1, 1], [1, 2]], "byte for byte")
        #expect(h.hub.counters.missedBurstReplays == 1)
        // Cy heard it live: a rejoin replays nothing. Nor does Bob's second join.
        h.hub.closed(cy.link, at: h.time)
        let cyAgain = h.join("cy")
        h.hub.closed(woken.link, at: h.time)
        let bobAgain = h.join("bob")
        h.advance(10 * ms)
        #expect(h.audio(to: cyAgain.link).isEmpty && h.audio(to: bobAgain.link).isEmpty)
        #expect(h.hub.channels[h.channel.id]!.recordings.isEmpty, "nobody is owed it: the recording is recycled")
    }

    /// Offline for long without a push token, nothing will bring the member back within the window:
    /// the burst isn't kept for it. The member owed a burst that leaves lets it go at once.
    @Test func onlyMembersWhoMayBeBackSoonAreOwedABurst() throws {
        let h = Harness()
        let ann = h.join("ann"), dan = h.join("dan"), eve = h.join("eve")
        h.send(.registerPushToken(token: "e0e0e0", environment: .production), from: eve.link)
        h.hub.closed(dan.link, at: h.time)
        h.hub.closed(eve.link, at: h.time)
        h.advance(3_000 * ms)
        h.send(.floorRequest(), from: ann.link)
        let burst = try #require(h.grantedBurst(ann.link))
        h.audio(from: ann.link, burst: burst, sequence: 0, payload: [1])
        h.send(.floorRelease, from: ann.link)
        let channel = try #require(h.hub.channels[h.channel.id])
        #expect(channel.recordings.count == 1 && channel.recordings[0].missed == [eve.slot], "Dan has no token to be woken by")
        h.hub.removeMember(channel: h.channel.id, user: "eve", at: h.time)
        h.drain()
        #expect(channel.recordings.isEmpty, "nobody is owed it any more")
    }

    /// Ann and Bob join; Bob registers a push token and his connection closes (a phone asleep); Ann
    /// sends `packets` packets and releases. Bob is owed the burst.
    func burstMissedByBob(_ h: Harness, packets: UInt16) throws -> UInt16 {
        let ann = h.join("ann"), bob = h.join("bob")
        h.send(.registerPushToken(token: "b0b0b0", environment: .production), from: bob.link)
        h.hub.closed(bob.link, at: h.time)
        h.send(.floorRequest(), from: ann.link)
        let burst = try #require(h.grantedBurst(ann.link))
        for sequence in 0 ..< packets {
            h.audio(from: ann.link, burst: burst, sequence: sequence, payload: [1, UInt8(truncatingIfNeeded: sequence)])
        }
        h.send(.floorRelease, from: ann.link)
        return burst
    }

    /// Partway through the replay, the same user joins from a new connection (a phone that changed
    /// networks right after its wake): the new connection gets the whole burst.
    @Test func aMemberReplacedMidReplayGetsTheMissedBurstAgain() throws {
        let h = Harness()
        _ = try burstMissedByBob(h, packets: 100)
        let first = h.join("bob")
        h.advance(0)
        #expect(h.audio(to: first.link).count < 100, "still being replayed")
        let second = h.join("bob")
        for _ in 0 ..< 20 { h.advance(10 * ms) }
        #expect(h.audio(to: second.link).map(\.header.sequence) == (0 ..< 100).map { UInt16($0) })
    }

    /// A replay cut off late in the window (the phone dropped again 25 s after the burst ended) keeps
    /// the burst for a whole window from then: the phone's next join still gets it.
    @Test func aReplayCutOffLateInTheWindowKeepsTheBurstForAnotherWindow() throws {
        let h = Harness()
        _ = try burstMissedByBob(h, packets: 140)  // the talker's rate limit lets 150 through at once
        h.advance(25_000 * ms)
        let first = h.join("bob")
        h.advance(0)
        #expect(h.audio(to: first.link).count < 140)
        h.hub.closed(first.link, at: h.time)
        h.advance(10_000 * ms)  // 35 s after the end
        let second = h.join("bob")
        for _ in 0 ..< 30 { h.advance(10 * ms) }
        #expect(h.audio(to: second.link).map(\.header.sequence) == (0 ..< 140).map { UInt16($0) })

    }

    /// A phone that drops mid-replay again and again doesn't keep the burst for good: twice the
    /// window from the end at most.
    @Test func aReplayCutOffAgainAndAgainIsKeptTwiceTheWindowAtMost() throws {
        let h = Harness()
        _ = try burstMissedByBob(h, packets: 140)
        h.advance(25_000 * ms)
        for _ in 0 ..< 4 {  // cut off at 25, 34, 43 and 52 s after the end
            let again = h.join("bob")
            h.advance(0)
            h.hub.closed(again.link, at: h.time)
            h.advance(9_000 * ms)
        }
        // 61 s after the end: past twice the window, though the last drop was 9 s ago.
        let late = h.join("bob")
        h.advance(10 * ms)
        #expect(h.audio(to: late.link).isEmpty)
        #expect(h.hub.channels[h.channel.id]!.recordings.isEmpty)
    }

    @Test func aMemberDroppedDuringABurstGetsItWholeOnRejoiningAfterItEnded() throws {
        let h = Harness()
        let ann = h.join("ann"), bob = h.join("bob")
        h.send(.floorRequest(), from: ann.link)
        let burst = try #require(h.grantedBurst(ann.link))
        for sequence in 0 ..< 5 as Range<UInt16> { h.audio(from: ann.link, burst: burst, sequence: sequence, payload: [1, UInt8(sequence)]) }
        h.hub.closed(bob.link, at: h.time)  // his network went mid-burst
        for sequence in 5 ..< 10 as Range<UInt16> { h.audio(from: ann.link, burst: burst, sequence: sequence, payload: [1, UInt8(sequence)]) }
        h.send(.floorRelease, from: ann.link)
        h.advance(5_000 * ms)
        let back = h.join("bob")
        h.advance(10 * ms)
        #expect(h.audio(to: back.link).map(\.header.sequence) == (0 ..< 10).map { UInt16($0) })
    }

    @Test func aMissedBurstIsKeptOnlyForTheWindowAndOnlyTheNewestFew() throws {
        var configuration = HubConfiguration()
        configuration.maxMissedBursts = 2
        let h = Harness(configuration: configuration)
        let ann = h.join("ann"), bob = h.join("bob")
        h.hub.closed(bob.link, at: h.time)
        var bursts: [UInt16] = []
        for word in 0 ..< 3 as Range<UInt8> {
            h.send(.floorRequest(), from: ann.link)
            let burst = try #require(h.grantedBurst(ann.link))
            bursts.append(burst)
            h.audio(from: ann.link, burst: burst, sequence: 0, payload: [word])
            h.send(.floorRelease, from: ann.link)
            h.advance(100 * ms)
        }
        let channel = try #require(h.hub.channels[h.channel.id])
        #expect(channel.recordings.count == 2, "the oldest went past the limit")
        // Within the window: the two newest, in order.
        let back = h.join("bob")
        h.advance(10 * ms)
        #expect(h.audio(to: back.link).map(\.header.burst) == Array(bursts.suffix(2)))

        // Past the window, nothing is kept, and a member who missed the burst hears nothing of it.
        h.hub.closed(back.link, at: h.time)
        h.send(.floorRequest(), from: ann.link)
        let late = try #require(h.grantedBurst(ann.link))
        h.audio(from: ann.link, burst: late, sequence: 0, payload: [9])
        h.send(.floorRelease, from: ann.link)
        #expect(channel.recordings.count == 1)
        h.advance(HubConfiguration().missedBurstWindow)
        #expect(channel.recordings.isEmpty)
        let tooLate = h.join("bob")
        h.advance(10 * ms)
        #expect(h.audio(to: tooLate.link).isEmpty)
    }

    /// A member that rejoins on a new connection while it is being replayed is served once, not twice.
    @Test func aRejoinDuringTheReplayIsServedOnce() throws {
        let h = Harness()
        let ann = h.join("ann"), bob = h.join("bob")
        h.send(.floorRequest(), from: ann.link)
        let first = try #require(h.grantedBurst(ann.link))
        for sequence in 0..<100 { h.audio(from: ann.link, burst: first, sequence: UInt16(sequence), payload: [1, UInt8(sequence)]) }
        _ = h.join("late")
        h.advance(0)
        let again = h.join("late")  // the same user from another connection: the first is replaced
        #expect(h.hub.catchingUp.filter { $0.slot == again.slot }.count == 1)
        h.send(.floorRelease, from: ann.link)
        h.send(.floorRequest(), from: bob.link)
        let second = try #require(h.grantedBurst(bob.link))
        for sequence in 0..<5 { h.audio(from: bob.link, burst: second, sequence: UInt16(sequence), payload: [2, UInt8(sequence)]) }
        for _ in 0..<12 { h.advance(10 * ms) }
        let got = h.audio(to: again.link)
        #expect(got.filter { $0.payload.first == 1 }.map(\.header.sequence) == (0..<100).map { UInt16($0) })
        #expect(got.filter { $0.payload.first == 2 }.map(\.header.sequence) == (0..<5).map { UInt16($0) }, "bob's burst once")
    }

    @Test func aTalkerSendingFasterThanAnyOpusSenderIsHeldToItsRate() {
        let h = Harness()
        let ann = h.join("ann"), bob = h.join("bob")
        h.send(.floorRequest(), from: ann.link)
        let burst = h.grantedBurst(ann.link)!
        // 150 at once (a second and a half of packets the network held up) pass; the next doesn't.
        for sequence in 0..<151 { h.audio(from: ann.link, burst: burst, sequence: UInt16(sequence), payload: [1]) }
        #expect(h.audio(to: bob.link).count == 150)
        #expect(h.hub.counters.drops(.overRate) == 1)
        #expect(h.hub.channels[h.channel.id]!.recordings.first?.count == 150, "dropped packets are not recorded either")
        // Then 150 a second: 100 ms buys 15.
        h.advance(100 * ms)
        for sequence in 151..<171 { h.audio(from: ann.link, burst: burst, sequence: UInt16(sequence), payload: [1]) }
        #expect(h.audio(to: bob.link).count == 165)
        #expect(h.hub.counters.drops(.overRate) == 6)
        // A real-time talker (10 ms frames, the shortest) is never touched.
        for sequence in 171..<471 {
            h.advance(10 * ms)
            h.audio(from: ann.link, burst: burst, sequence: UInt16(sequence), payload: [1])
        }
        #expect(h.audio(to: bob.link).count == 465)
        #expect(h.hub.counters.drops(.overRate) == 6)
    }

    @Test func releasingAndRequestingAgainDoesNotRefillTheTalkersBudget() {
        let h = Harness()
        let ann = h.join("ann"), bob = h.join("bob")
        // Ten bursts of 150 packets within 100 ms: only the first burst's packets (and the 15 the
        // 100 ms refill) may pass, not 1,500.
        for round in 0..<10 {
            h.send(.floorRequest(), from: ann.link)
            let burst = h.grantedBurst(ann.link)!
            for sequence in 0..<150 { h.audio(from: ann.link, burst: burst, sequence: UInt16(sequence), payload: [1]) }
            h.send(.floorRelease, from: ann.link)
            if round < 9 { h.advance(10 * ms) }
        }
        #expect(h.audio(to: bob.link).count <= 150 + 14)
        #expect(h.hub.counters.drops(.overRate) >= 1_500 - 164)
    }

    @Test func aRecordingStopsAtItsByteLimitWhileTheRelayGoesOn() {
        var configuration = HubConfiguration()
        configuration.maxRecordedBytes = 1_000
        let h = Harness(configuration: configuration)
        let ann = h.join("ann"), bob = h.join("bob")
        h.send(.floorRequest(), from: ann.link)
        let burst = h.grantedBurst(ann.link)!
        // Full-size packets: three fit in 1,000 bytes, the fourth would not.
        for sequence in 0..<10 { h.audio(from: ann.link, burst: burst, sequence: UInt16(sequence), payload: [UInt8](repeating: UInt8(sequence), count: 300)) }
        #expect(h.audio(to: bob.link).count == 10)
        #expect(h.hub.channels[h.channel.id]!.recordings.first?.count == 3)
        let late = h.join("late")
        h.advance(0)
        h.audio(from: ann.link, burst: burst, sequence: 10, payload: [10])
        // What was kept, then live: a gap, but never more memory than the limit.
        #expect(h.audio(to: late.link).map(\.header.sequence) == [0, 1, 2, 10])
        // Packet 10 would have fitted, but a recording with holes would replay words missing.
        #expect(h.hub.channels[h.channel.id]!.recordings.first?.count == 3)
    }

    @Test func aSpareRecordingGivesBackTheMemoryOfALongBurst() {
        var configuration = HubConfiguration()
        configuration.spareRecordingCapacity = 4_096
        let h = Harness(configuration: configuration)
        let ann = h.join("ann")
        _ = h.join("bob")
        func burst(packets: Int, size: Int) {
            h.send(.floorRequest(), from: ann.link)
            let burst = h.grantedBurst(ann.link)!
            for sequence in 0..<packets { h.audio(from: ann.link, burst: burst, sequence: UInt16(sequence), payload: [UInt8](repeating: 1, count: size)) }
            h.send(.floorRelease, from: ann.link)
        }
        burst(packets: 10, size: 100)
        let kept = h.hub.channels[h.channel.id]!.spareRecordings
        #expect(kept.count == 1 && kept[0].capacityBytes >= 1_000, "a short burst's buffers are kept for the next")
        burst(packets: 40, size: 500)
        let spare = h.hub.channels[h.channel.id]!.spareRecordings
        #expect(spare.count == 1 && spare[0].capacityBytes == 0)
        // And it records again, into new storage.
        burst(packets: 5, size: 100)
        let again = h.hub.channels[h.channel.id]!.spareRecordings
        #expect(again.count == 1 && again[0].capacityBytes >= 500)
    }

    @Test func talkerWhoDropsKeepsTheFloorForTheGraceThenLosesIt() {
        let h = Harness()
        let ann = h.join("ann"), bob = h.join("bob")
        h.send(.floorRequest(), from: ann.link)
        h.hub.closed(ann.link, at: h.time)
        h.drain()
        #expect(h.messages(to: bob.link).last == .participant(Participant(slot: ann.slot, userID: "ann", name: "Ann",
                                                                           connection: .reconnecting, talking: true)))
        h.advance(1_999 * ms)
        #expect(!h.floorEvents(to: bob.link).contains { $0.kind == .ended })
        h.advance(1 * ms)
        #expect(h.floorEvents(to: bob.link).suffix(2).map(\.kind) == [.ended, .idle])
        #expect(h.hub.roster(of: h.channel.id).first { $0.userID == "ann" }?.connection == .offline)
    }

    /// A client that closes its connection on purpose (the app quit, `walkie talk` done) is offline
    /// at once, and its floor goes to the next in the queue now, not after the grace period.
    @Test func aDeliberateCloseIsOfflineAtOnceAndFreesTheFloor() throws {
        let h = Harness()
        let ann = h.join("ann"), bob = h.join("bob"), cat = h.join("cat")
        h.send(.floorRequest(), from: ann.link)
        h.send(.floorRequest(), from: bob.link)
        h.send(.floorRequest(), from: cat.link)
        #expect(h.floorEvents(to: cat.link).last?.position == 2)
        // Bob, waiting, quits: out of the queue at once.
        h.hub.closed(bob.link, deliberately: true, at: h.time)
        h.drain()
        #expect(h.floorEvents(to: cat.link).last?.position == 1)
        #expect(h.hub.roster(of: h.channel.id).first { $0.userID == "bob" }?.connection == .offline)
        // Ann, talking for 3 s, quits: Cat has the floor without waiting out the grace, and the
        // log has Ann's 3 s (not less the grace a dropped talker's length gives back).
        h.audio(from: ann.link, burst: h.grantedBurst(ann.link)!, sequence: 0, payload: [1])
        h.advance(2_000 * ms)
        h.audio(from: ann.link, burst: h.grantedBurst(ann.link)!, sequence: 1, payload: [1])
        h.advance(1_000 * ms)
        h.hub.closed(ann.link, deliberately: true, at: h.time)
        h.drain()
        #expect(h.floorEvents(to: cat.link).last?.kind == .granted)
        #expect(h.messages(to: cat.link).contains(.participant(Participant(slot: ann.slot, userID: "ann", name: "Ann", connection: .offline))))
        #expect(!h.messages(to: cat.link).contains { if case .participant(let p) = $0 { p.connection == .reconnecting } else { false } })
        #expect(h.stored.contains { if case .logTransmission(let t) = $0 { t.userID == "ann" && t.endReason == "closed" && t.durationMilliseconds == 3_000 } else { false } },
                "\(h.stored)")
    }

    @Test func aMemberWhoseConnectionGoesSilentShowsReconnectingUntilHeardAgain() {
        let h = Harness()
        let ann = h.join("ann"), bob = h.join("bob"), cat = h.join("cat")
        func annSeenBy(_ link: Link) -> ConnectionState? {
            h.messages(to: link).compactMap { if case .participant(let p) = $0, p.userID == "ann" { return p.connection } else { return nil } }.last
        }
        // Everyone heard lately: nothing changes, nothing is sent.
        let before = h.messages.count
        h.hub.sweepLiveness(at: h.time) { _ in true }
        h.drain()
        #expect(h.messages.count == before)

        // Ann's phone dies: her connection stays open, but nothing comes from it.
        h.hub.sweepLiveness(at: h.time) { $0 != ann.link }
        h.drain()
        #expect(annSeenBy(bob.link) == .reconnecting && annSeenBy(cat.link) == .reconnecting)
        #expect(h.hub.roster(of: h.channel.id).first { $0.userID == "ann" }?.connection == .reconnecting)
        #expect(h.hub.counters.silentMembers == 1)
        // Told once, not at every sweep.
        let told = h.messages.count
        h.hub.sweepLiveness(at: h.time) { $0 != ann.link }
        h.drain()
        #expect(h.messages.count == told)
        // Only the roster changed: she still hears the channel.
        h.send(.floorRequest(), from: bob.link)
        h.audio(from: bob.link, burst: h.grantedBurst(bob.link)!, sequence: 0, payload: [1, 2, 3])
        #expect(h.audio(to: ann.link).count == 1)

        // Heard again at the next sweep.
        h.hub.sweepLiveness(at: h.time) { _ in true }
        h.drain()
        #expect(annSeenBy(bob.link) == .connected && annSeenBy(ann.link) == .connected)

        // Silent again, then a control message: back at once, without waiting for a sweep.
        h.hub.sweepLiveness(at: h.time) { $0 != ann.link }
        h.drain()
        #expect(annSeenBy(cat.link) == .reconnecting)
        h.send(.setMuted(true), from: ann.link)
        #expect(annSeenBy(cat.link) == .connected)
        #expect(h.hub.roster(of: h.channel.id).first { $0.userID == "ann" }?.muted == true)

        // A closed connection is the close's business: the sweep leaves it to the grace.
        h.hub.closed(ann.link, at: h.time)
        h.drain()
        h.hub.sweepLiveness(at: h.time) { _ in true }
        h.drain()
        #expect(annSeenBy(bob.link) == .reconnecting)
    }

    /// A radio that died for good is not shown as about to come back until the transport's idle
    /// timeout, minutes later: silent for `silentOffline` after the sweep found it so, it shows
    /// `offline`, keeps its session (and hears the channel, should it be only deaf to us one way),
    /// and shows `connected` the moment it is heard again.
    @Test func aMemberSilentForLongShowsOfflineAndKeepsItsSession() {
        let h = Harness()
        let ann = h.join("ann"), bob = h.join("bob")
        func annSeenBy(_ link: Link) -> [ConnectionState] {
            h.messages(to: link).compactMap { if case .participant(let p) = $0, p.userID == "ann" { return p.connection } else { return nil } }
        }
        h.hub.sweepLiveness(at: h.time) { $0 != ann.link }
        h.drain()
        #expect(annSeenBy(bob.link).last == .reconnecting)
        h.advance(29_999 * ms)
        h.hub.sweepLiveness(at: h.time) { $0 != ann.link }
        h.drain()
        #expect(annSeenBy(bob.link).last == .reconnecting)
        h.advance(1 * ms)
        h.hub.sweepLiveness(at: h.time) { $0 != ann.link }
        h.hub.sweepLiveness(at: h.time) { $0 != ann.link }
        h.drain()
        #expect(annSeenBy(bob.link).suffix(2) == [.reconnecting, .offline], "told once: \(annSeenBy(bob.link))")
        #expect(h.hub.roster(of: h.channel.id).first { $0.userID == "ann" }?.connection == .offline)
        h.send(.floorRequest(), from: bob.link)
        h.audio(from: bob.link, burst: h.grantedBurst(bob.link)!, sequence: 0, payload: [7])
        #expect(h.audio(to: ann.link).count == 1)
        h.send(.floorRelease, from: bob.link)

        // Heard again: connected at once, and the clock starts over the next time.
        h.hub.sweepLiveness(at: h.time) { _ in true }
        h.drain()
        #expect(annSeenBy(bob.link).last == .connected)
        h.hub.sweepLiveness(at: h.time) { $0 != ann.link }
        h.advance(10_000 * ms)
        h.hub.sweepLiveness(at: h.time) { $0 != ann.link }
        h.drain()
        #expect(annSeenBy(bob.link).last == .reconnecting)

        // Offline, then the idle timeout closes the connection: no flicker back to reconnecting.
        h.advance(20_000 * ms)
        h.hub.sweepLiveness(at: h.time) { $0 != ann.link }
        h.drain()
        let told = annSeenBy(bob.link).count
        #expect(annSeenBy(bob.link).last == .offline)
        h.hub.closed(ann.link, at: h.time)
        h.advance(3_000 * ms)
        #expect(annSeenBy(bob.link).count == told)
        #expect(h.hub.roster(of: h.channel.id).first { $0.userID == "ann" }?.connection == .offline)
    }

    /// A join's check may read a channel the hub has not loaded (made by the CLI): it is loaded then.
    /// One the hub deleted meanwhile stays deleted, and one it knows is not overwritten by the
    /// check's copy.
    @Test func aChannelSeenByAJoinCheckIsLoadedUnlessDeletedOrKnown() {
        let h = Harness()
        let fresh = ChannelRecord(name: "New", mode: .fullDuplex, maxBurstSeconds: 20)
        h.hub.channelSeenByCheck(fresh, at: h.time)
        #expect(h.hub.channelIDs.contains(fresh.id))
        var stale = h.channel
        stale.name = "Old name"
        h.hub.channelSeenByCheck(stale, at: h.time)
        #expect(h.hub.channels[h.channel.id]?.record.name == h.channel.name)
        h.hub.deleteChannel(fresh.id, at: h.time)
        h.hub.channelSeenByCheck(fresh, at: h.time)
        #expect(!h.hub.channelIDs.contains(fresh.id))
    }

    /// A phone gone quiet in the background resumes its session (no new join): the bursts it was
    /// noted missing while silent are replayed from their first packet, as a join would get them,
    /// whether it comes back by the sweep or by a control message.
    @Test func aSilentMemberHeardAgainIsReplayedWhatItMissed() throws {
        let h = Harness()
        let ann = h.join("ann"), bob = h.join("bob"), cat = h.join("cat")
        h.hub.sweepLiveness(at: h.time) { $0 != bob.link }
        h.drain()
        h.send(.floorRequest(), from: ann.link)
        let burst = try #require(h.grantedBurst(ann.link))
        for sequence in UInt16(0) ..< 30 { h.audio(from: ann.link, burst: burst, sequence: sequence, payload: [1, UInt8(sequence)]) }
        let live = h.audio(to: bob.link).count
        h.hub.sweepLiveness(at: h.time) { _ in true }
        for _ in 0 ..< 10 { h.advance(10 * ms) }
        let replayed = h.audio(to: bob.link).dropFirst(live)
        #expect(replayed.map(\.header.sequence) == (0 ..< 30).map { UInt16($0) } && replayed.allSatisfy { $0.header.flags.contains(.catchUp) },
                "\(replayed.map(\.header.sequence))")
        // Then live again, once.
        h.audio(from: ann.link, burst: burst, sequence: 30, payload: [1, 30])
        #expect(h.audio(to: bob.link).last.map { $0.header.sequence == 30 && !$0.header.flags.contains(.catchUp) } == true)
        #expect(h.audio(to: bob.link).filter { $0.header.sequence == 30 }.count == 1)
        h.send(.floorRelease, from: ann.link)

        // Silent when a burst started and back by a control message after it ended.
        h.hub.sweepLiveness(at: h.time) { $0 != cat.link }
        h.drain()
        h.send(.floorRequest(), from: ann.link)
        let second = try #require(h.grantedBurst(ann.link))
        for sequence in UInt16(0) ..< 5 { h.audio(from: ann.link, burst: second, sequence: sequence, payload: [2, UInt8(sequence)]) }
        h.send(.floorRelease, from: ann.link)
        let before = h.audio(to: cat.link).count
        h.send(.setMuted(false), from: cat.link)
        for _ in 0 ..< 3 { h.advance(10 * ms) }
        let again = h.audio(to: cat.link).dropFirst(before)
        #expect(again.filter { $0.header.burst == second }.map(\.header.sequence) == [0, 1, 2, 3, 4], "\(again.map(\.header))")
        // Replayed once: a later sweep that hears it changes nothing.
        h.hub.sweepLiveness(at: h.time) { _ in true }
        h.advance(10 * ms)
        #expect(h.audio(to: cat.link).count == before + again.count)

        // Back with an unsubscription as its first word: Ann's burst is not replayed.
        h.hub.sweepLiveness(at: h.time) { $0 != cat.link }
        h.drain()
        h.send(.floorRequest(), from: ann.link)
        let third = try #require(h.grantedBurst(ann.link))
        for sequence in UInt16(0) ..< 40 { h.audio(from: ann.link, burst: third, sequence: sequence, payload: [3, UInt8(sequence)]) }
        h.send(.floorRelease, from: ann.link)
        let quiet = h.audio(to: cat.link).count
        h.send(.setSubscriptions(unheard: ["ann"]), from: cat.link)
        for _ in 0 ..< 10 { h.advance(10 * ms) }
        #expect(h.audio(to: cat.link).count == quiet, "replayed a talker it unsubscribed from")
    }

    /// The server's own network went: everyone is silent in the same sweep. One `roster` message per
    /// member says so, not one `participant` per silent member to every member.
    @Test func aSweepThatFindsManySilentSendsThemAsOneRoster() {
        let h = Harness()
        let members = (0..<6).map { h.join("m\($0)") }
        let before = h.messages.count
        // Right after a stall of the server itself, silence proves nothing.
        h.hub.sweepLiveness(mayMarkSilent: false, at: h.time) { _ in false }
        h.drain()
        #expect(h.messages.count == before)
        h.hub.sweepLiveness(at: h.time) { _ in false }
        h.drain()
        let sent = h.messages[before...]
        #expect(sent.count == members.count, "one message per member")
        for member in members {
            guard case .roster(let entries)? = h.messages(to: member.link).last else { Issue.record("no roster"); continue }
            #expect(entries.count == members.count && entries.allSatisfy { $0.connection == .reconnecting })
        }
        // And back, the same way, even when the stall guard is on: being heard is never in doubt.
        h.hub.sweepLiveness(mayMarkSilent: false, at: h.time) { _ in true }
        h.drain()
        guard case .roster(let back)? = h.messages(to: members[0].link).last else { Issue.record("no roster"); return }
        #expect(back.count == members.count && back.allSatisfy { $0.connection == .connected })
    }

    @Test func talkerWhoRejoinsWithinTheGraceKeepsTheFloor() {
        let h = Harness()
        let ann = h.join("ann")
        h.send(.floorRequest(), from: ann.link)
        let burst = h.grantedBurst(ann.link)!
        h.audio(from: ann.link, burst: burst, sequence: 0, payload: [1])
        h.hub.closed(ann.link, at: h.time)
        h.advance(500 * ms)
        let again = h.join("ann")
        #expect(again.slot == ann.slot)
        guard case .joined(_, _, _, let talkers)? = h.lastMessage(to: again.link) else { Issue.record("no joined"); return }
        #expect(talkers == [Talker(slot: ann.slot, burst: burst)])
        h.advance(3_000 * ms)
        #expect(!h.floorEvents(to: again.link).contains { $0.kind == .revoked })
    }

    @Test func aTalkerWhoseAudioStopsLosesTheFloorAndTheNextIsGranted() {
        let h = Harness()
        let ann = h.join("ann"), bob = h.join("bob")
        h.send(.floorRequest(), from: ann.link)
        let burst = h.grantedBurst(ann.link)!
        h.send(.floorRequest(), from: bob.link)
        #expect(h.floorEvents(to: bob.link).last?.kind == .queued)
        // Audio every 20 ms for 6 s keeps the floor...
        for sequence in 0 ..< 300 as Range<UInt16> {
            h.advance(20 * ms)
            h.audio(from: ann.link, burst: burst, sequence: sequence, payload: [1, 2, 3])
        }
        #expect(h.floorEvents(to: ann.link).last?.kind == .granted)
        // ...then Ann's phone dies: no close, just silence.
        h.advance(4_999 * ms)
        #expect(!h.floorEvents(to: ann.link).contains { $0.kind == .revoked })
        h.advance(1 * ms)
        let revoked = h.floorEvents(to: ann.link).last { $0.kind == .revoked }
        #expect(revoked?.cause == .disconnected && revoked?.reason == "no audio arrived from you for 5 s")
        #expect(h.floorEvents(to: bob.link).last?.kind == .granted)
        // Logged as long as Ann was heard (6 s of audio), not with the 5 s it took to notice.
        let silent = h.stored.compactMap { if case .logTransmission(let t) = $0, t.endReason == "silent" { return t } else { return nil } }
        #expect(silent.map(\.durationMilliseconds) == [6_000], "\(silent)")
    }

    func lossTold(_ h: Harness, _ link: Link) -> [Int] {
        h.messages(to: link).compactMap { if case .receptionLoss(let percent) = $0 { return percent } else { return nil } }
    }

    @Test func theTalkerIsToldTheWorstLossAmongItsListeners() {
        let h = Harness()
        let ann = h.join("ann"), bob = h.join("bob"), cat = h.join("cat")
        // Reported before anyone talks: kept, and told with the next grant.
        h.send(.receptionReport(lossPercent: 8), from: bob.link)
        #expect(lossTold(h, ann.link).isEmpty)
        h.send(.floorRequest(), from: ann.link)
        #expect(h.floorEvents(to: ann.link).last?.kind == .granted)
        #expect(h.lastMessage(to: ann.link) == .receptionLoss(lossPercent: 8))
        // A better listener changes nothing; the worse one recovering leaves the next worst.
        h.send(.receptionReport(lossPercent: 3), from: cat.link)
        #expect(lossTold(h, ann.link) == [8])
        h.send(.receptionReport(lossPercent: 0), from: bob.link)
        #expect(lossTold(h, ann.link) == [8, 3])
        // A listener that drops takes its figure along; listeners never hear about it.
        h.hub.closed(cat.link, at: h.time)
        h.drain()
        #expect(lossTold(h, ann.link) == [8, 3, 0])
        #expect(lossTold(h, bob.link).isEmpty && lossTold(h, cat.link).isEmpty)
        #expect(h.hub.counters.receptionReports == 3)
        // The same figure again is no change, and a member who may not listen doesn't count, though its
        // figure is kept for when a new token lets it listen.
        h.send(.receptionReport(lossPercent: 0), from: bob.link)
        let dan = h.join("dan", capabilities: [.talk])
        h.send(.receptionReport(lossPercent: 40), from: dan.link)
        #expect(lossTold(h, ann.link) == [8, 3, 0])
        #expect(h.hub.counters.receptionReports == 4)
    }

    /// What an operator's roster shows: each connected listener's last figure, none for a member who
    /// may not listen or is not connected, and a new session's figure starts again at 0.
    @Test func theOperatorsRosterShowsEachConnectedListenersLoss() {
        let h = Harness()
        h.join("ann")
        let bob = h.join("bob"), dan = h.join("dan", capabilities: [.talk])
        h.send(.receptionReport(lossPercent: 14), from: bob.link)
        h.send(.receptionReport(lossPercent: 30), from: dan.link)
        func loss() -> [String: Int?] {
            Dictionary(uniqueKeysWithValues: h.hub.liveRoster(of: h.channel.id).map { ($0.participant.userID, $0.receptionLoss) })
        }
        #expect(loss() == ["ann": 0, "bob": 14, "dan": nil])
        #expect(h.hub.liveRoster(of: h.channel.id).map(\.participant) == h.hub.roster(of: h.channel.id))
        h.hub.closed(bob.link, at: h.time)
        h.drain()
        #expect(loss() == ["ann": 0, "bob": nil, "dan": nil], "bob is reconnecting: no figure")
        _ = h.join("bob")
        #expect(loss()["bob"] == 0)
        #expect(h.hub.liveRoster(of: UUID()).isEmpty)
    }

    @Test func eachTalkerHearsOnlyOfItsOwnListenersAndASessionStartsAtZero() {
        let h = Harness(mode: .fullDuplex)
        let ann = h.join("ann"), bob = h.join("bob"), cat = h.join("cat")
        h.send(.setSubscriptions(unheard: ["bob"]), from: cat.link)
        h.send(.receptionReport(lossPercent: 20), from: cat.link)
        h.send(.floorRequest(), from: ann.link)
        h.send(.floorRequest(), from: bob.link)
        // Cat, the lossy one, hears Ann but not Bob: only Ann's encoder needs FEC for her.
        #expect(lossTold(h, ann.link) == [20])
        #expect(lossTold(h, bob.link).isEmpty)
        // Ann's connection drops and she rejoins within the grace, still talking: her new session
        // starts at 0 on both sides, so she is told again.
        h.hub.closed(ann.link, at: h.time)
        h.drain()
        let again = h.join("ann")
        #expect(lossTold(h, again.link) == [20])
        // A listener that drops takes its figure along, and comes back at 0.
        h.hub.closed(cat.link, at: h.time)
        h.drain()
        _ = h.join("cat")
        #expect(lossTold(h, again.link) == [20, 0])
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
        var entries: [Participant] = []
        for message in sent {
            switch message {
            case .joined(_, _, let roster, _), .roster(let roster):
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
            if case .joined(_, _, let roster, _) = message { entries += roster.map(\.userID) }
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
        guard case .joined(_, let you, let roster, let talkers)? = h.messages(to: last.link).first(where: { if case .joined = $0 { true } else { false } }) else {
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

    @Test func aRepeatedRequestFromTheTalkerIsTheSameBurst() {
        let h = Harness()
        let ann = h.join("ann")
        h.send(.floorRequest(), from: ann.link)
        h.advance(1_000 * ms)
        h.send(.floorRequest(), from: ann.link)
        #expect(h.hub.counters.bursts == 1 && h.hub.counters.floorGrants == 1)
        #expect(h.hub.channels[h.channel.id]!.recordings.count == 1)
        h.advance(1_000 * ms)
        h.send(.floorRelease, from: ann.link)
        let logged = h.stored.compactMap { if case .logTransmission(let t) = $0, t.endReason != TransmissionRecord.inProgress { return t } else { return nil } }
        #expect(logged.map(\.durationMilliseconds) == [2_000])
        #expect(h.hub.channels[h.channel.id]!.recordings.isEmpty)
    }

    @Test func fullDuplexAllowsSeveralTalkers() {
        let h = Harness(mode: .fullDuplex)
        let members = (0..<5).map { h.join("m\($0)") }
        for member in members { h.send(.floorRequest(), from: member.link) }
        #expect(members.prefix(4).allSatisfy { h.grantedBurst($0.link) != nil })
        #expect(h.floorEvents(to: members[4].link).last?.kind == .queued)
    }

    @Test func descriptorUpdateReachesConnectedMembers() {
        let h = Harness()
        let ann = h.join("ann")
        var record = h.channel
        record.name = "Ops North"
        h.hub.upsertChannel(record, at: h.time)
        h.drain()
        #expect(h.lastMessage(to: ann.link) == .descriptor(ChannelInfo(id: record.id, name: "Ops North", image: nil,
                                                                       mode: .halfDuplex, maxBurstSeconds: 60)))
    }

    @Test func deletingTheChannelRemovesEveryoneWithAReason() {
        let h = Harness()
        let ann = h.join("ann")
        h.send(.registerPushToken(token: "ABCD", environment: .sandbox), from: ann.link)
        #expect(h.lastMessage(to: ann.link) == .pushTokenRegistered)
        h.hub.deleteChannel(h.channel.id, at: h.time)
        h.drain()
        #expect(h.lastMessage(to: ann.link) == .refused(code: .channelDeleted, reason: "the channel was deleted by an administrator"))
        #expect(h.closes.contains { $0.0 == ann.link && $0.1 == .removed })
        #expect(h.other.contains { if case .memberGone(_, let m) = $0 { return m.pushToken == "abcd" } else { return false } })
    }

    @Test func anAdministratorsRemovalEndsTheSessionAndQueuesTheRowsDeletionAfterItsWrite() {
        let h = Harness()
        let ann = h.join("ann"), bob = h.join("bob")
        #expect(h.hub.isMember(channel: h.channel.id, user: "bob"))
        #expect(!h.hub.isMember(channel: h.channel.id, user: "carol"))
        #expect(!h.hub.isMember(channel: UUID(), user: "bob"))
        h.hub.removeMember(channel: h.channel.id, user: "bob", at: h.time)
        h.drain()
        #expect(h.lastMessage(to: bob.link) == .refused(code: .removedByAdmin, reason: "an administrator removed you from the channel"))
        #expect(h.closes.contains { $0.0 == bob.link && $0.1 == .removed })
        #expect(h.messages(to: ann.link).last == .participantLeft(slot: bob.slot, userID: "bob"))
        #expect(!h.hub.isMember(channel: h.channel.id, user: "bob"))
        // The join's row and its deletion go to the store writer in that order, so a row written late
        // is deleted after it, not before.
        let joined = h.stored.lastIndex { if case .upsertMember(let m) = $0 { m.userID == "bob" } else { false } }
        let removed = h.stored.lastIndex(of: .removeMember(channel: h.channel.id, user: "bob"))
        #expect(joined != nil && removed != nil && joined! < removed!, "\(h.stored)")
    }

    /// A burst cut short by a removal or a revocation says so in the transmission log, not "left".
    @Test func aRemovedTalkersBurstIsLoggedWithTheReason() {
        let h = Harness()
        let ann = h.join("ann"), bob = h.join("bob")
        h.send(.floorRequest(), from: ann.link)
        h.hub.removeMember(channel: h.channel.id, user: "ann", at: h.time)
        h.send(.floorRequest(), from: bob.link)
        h.hub.removeMember(channel: h.channel.id, user: "bob", at: h.time, code: .tokenRevoked, reason: "lost phone")
        h.drain()
        let logged = h.stored.compactMap { if case .logTransmission(let t) = $0, t.endReason != TransmissionRecord.inProgress { return t } else { return nil } }
        #expect(logged.map(\.userID) == ["ann", "bob"])
        #expect(logged.map(\.endReason) == ["removedByAdmin", "tokenRevoked"])
    }

    @Test func leaveForgetsTheMemberAndItsToken() {
        let h = Harness()
        let ann = h.join("ann"), bob = h.join("bob")
        h.send(.registerPushToken(token: "beef", environment: .production), from: bob.link)
        h.send(.leave, from: bob.link)
        #expect(h.messages(to: ann.link).last == .participantLeft(slot: bob.slot, userID: "bob"))
        #expect(h.stored.last == .removeMember(channel: h.channel.id, user: "bob"))
        #expect(h.closes.contains { $0.0 == bob.link && $0.1 == .normal })
        #expect(!h.other.contains { if case .memberGone = $0 { return true } else { return false } },
                "a member who left by itself gets no leave push")
        h.send(.floorRequest(), from: ann.link)
        #expect(!h.other.contains { if case .burstStarted = $0 { return true } else { return false } }, "its token is gone")
    }

    @Test func registeringTheSameTokenAgainIsWrittenAtMostEveryTenMinutes() {
        let h = Harness()
        let bob = h.join("bob")
        func tokenWrites() -> [StoreOperation] { h.stored.filter { if case .setPushToken = $0 { true } else { false } } }
        h.send(.registerPushToken(token: "00FF", environment: .production), from: bob.link)
        h.advance(1_000 * ms)
        h.send(.registerPushToken(token: "00ff", environment: .production), from: bob.link)
        #expect(h.lastMessage(to: bob.link) == .pushTokenRegistered, "still acknowledged")
        #expect(tokenWrites().count == 1)
        // The registration time still moves on in memory: APNs' Unregistered compares against it.
        #expect(h.hub.channels[h.channel.id]!.members[bob.slot]!.pushRegisteredAt == h.time.date)
        h.advance(600_000 * ms)
        h.send(.registerPushToken(token: "00ff", environment: .production), from: bob.link)
        #expect(tokenWrites().count == 2, "ten minutes on, written again")
        // A new token, or the same one in the other environment, is written at once.
        h.send(.registerPushToken(token: "00ff", environment: .sandbox), from: bob.link)
        h.send(.registerPushToken(token: "0a0a", environment: .sandbox), from: bob.link)
        #expect(tokenWrites().count == 4)
    }

    @Test func aRejectedPushTokenIsForgottenUnlessReplaced() {
        let h = Harness()
        let ann = h.join("ann"), bob = h.join("bob")
        h.send(.registerPushToken(token: "00ff", environment: .production), from: bob.link)
        h.hub.pushTokenRejected(channel: h.channel.id, user: "bob", token: "00aa")
        h.drain()
        #expect(!h.stored.contains(.clearPushToken(channel: h.channel.id, user: "bob")), "a stale rejection keeps the new token")
        h.hub.pushTokenRejected(channel: h.channel.id, user: "bob", token: "00FF")
        h.drain()
        #expect(h.stored.last == .clearPushToken(channel: h.channel.id, user: "bob"))
        h.send(.floorRequest(), from: ann.link)
        #expect(!h.other.contains { if case .burstStarted = $0 { return true } else { return false } })
    }

    @Test func burstStartListsConnectedMembersWithTokensForTheLivenessCheck() {
        let h = Harness()
        let ann = h.join("ann"), bob = h.join("bob")
        h.send(.registerPushToken(token: "00ff", environment: .sandbox), from: bob.link)
        h.send(.registerPushToken(token: "0a0a", environment: .sandbox), from: ann.link)
        h.send(.floorRequest(), from: ann.link)
        let started = h.other.compactMap { if case .burstStarted(_, _, let wake, let connected) = $0 { return (wake, connected) } else { return nil } }
        #expect(started.count == 1)
        #expect(started.first?.0.isEmpty == true)
        #expect(started.first?.1 == [WakeCandidate(member: started.first!.1[0].member, link: bob.link)], "never the talker itself")
        #expect(started.first?.1.first?.member.pushToken == "00ff")
    }

    @Test func burstStartAsksToWakeOfflineMembersWithPushTokens() {
        let h = Harness()
        let ann = h.join("ann"), bob = h.join("bob")
        h.send(.registerPushToken(token: "00ff", environment: .production), from: bob.link)
        h.hub.closed(bob.link, at: h.time)
        h.drain()
        h.send(.floorRequest(), from: ann.link)
        let wake = h.other.compactMap { if case .burstStarted(_, let talker, let wake, _) = $0 { return (talker, wake) } else { return nil } }
        #expect(wake.count == 1)
        #expect(wake.first?.0.userID == "ann")
        #expect(wake.first?.1.map(\.pushToken) == ["00ff"])
    }

    /// With pushes off (`--apns off`) nothing wakes an asleep member: its burst is neither pushed nor
    /// kept for it, though a member that dropped a moment ago is still owed it.
    @Test func withoutPushesAnAsleepMemberIsNeitherWokenNorOwedTheBurst() throws {
        var configuration = HubConfiguration()
        configuration.wakesByPush = false
        let h = Harness(configuration: configuration)
        let ann = h.join("ann"), bob = h.join("bob"), cat = h.join("cat")
        h.send(.registerPushToken(token: "00ff", environment: .production), from: bob.link)
        h.hub.closed(bob.link, at: h.time)
        h.advance(3_000 * ms)
        h.hub.closed(cat.link, at: h.time)
        h.drain()
        h.send(.floorRequest(), from: ann.link)
        let burst = try #require(h.grantedBurst(ann.link))
        h.audio(from: ann.link, burst: burst, sequence: 0, payload: [1])
        h.send(.floorRelease, from: ann.link)
        #expect(!h.other.contains { if case .burstStarted = $0 { return true } else { return false } })
        let channel = try #require(h.hub.channels[h.channel.id])
        #expect(channel.recordings.count == 1 && channel.recordings[0].missed == [cat.slot],
                "Bob, asleep, won't be woken; Cat, dropped within the grace, may be back")
    }

    /// A member whose token expired is still woken for a while (its app may renew), but not for good.
    @Test func anExpiredMemberIsWokenOnlyForAWhileAfterItsTokenExpired() {
        let h = Harness()
        let day: UInt64 = 86_400_000_000_000
        let ann = h.join("ann", expiresAt: h.epoch.addingTimeInterval(30 * 86_400))
        let bob = h.join("bob", expiresAt: h.epoch.addingTimeInterval(60))
        h.send(.registerPushToken(token: "00ff", environment: .production), from: bob.link)
        h.hub.closed(bob.link, at: h.time)
        h.drain()
        func woken() -> [String] {
            h.other.removeAll()
            h.send(.floorRequest(), from: ann.link)
            h.send(.floorRelease, from: ann.link)
            return h.other.flatMap { if case .burstStarted(_, _, let wake, _) = $0 { return wake.map(\.userID) } else { return [] } }
        }
        #expect(woken() == ["bob"], "before the token expired")
        h.advance(6 * day)
        #expect(woken() == ["bob"], "six days after: the app may still renew")
        h.advance(2 * day)
        #expect(woken().isEmpty, "eight days after: left alone")
        // A join with a new token makes it wakeable again.
        let again = h.join("bob", expiresAt: h.time.date.addingTimeInterval(3_600))
        h.hub.closed(again.link, at: h.time)
        h.drain()
        #expect(woken() == ["bob"])
    }

    @Test func unsubscribedTalkersAreNeitherRelayedNorReplayedNorWakeTheListener() {
        let h = Harness()
        let ann = h.join("ann"), bob = h.join("bob"), cat = h.join("cat")
        h.send(.setSubscriptions(unheard: ["ann"]), from: bob.link)
        #expect(h.lastMessage(to: bob.link) == .subscriptions(unheard: ["ann"]))
        #expect(h.stored.last == .setSubscriptions(channel: h.channel.id, user: "bob", unheard: ["ann"]))
        // The same list again (a client says it after every join) is answered, not written again.
        let writes = h.stored.count
        h.send(.setSubscriptions(unheard: ["ann"]), from: bob.link)
        #expect(h.lastMessage(to: bob.link) == .subscriptions(unheard: ["ann"]) && h.stored.count == writes)
        h.send(.floorRequest(), from: ann.link)
        let burst = h.grantedBurst(ann.link)!
        h.audio(from: ann.link, burst: burst, sequence: 0, payload: [0])
        #expect(h.audio(to: bob.link).isEmpty)
        #expect(h.audio(to: cat.link).count == 1)
        // Cat unsubscribes mid-burst and rejoins: no catch-up of Ann either.
        h.send(.setSubscriptions(unheard: ["ann"]), from: cat.link)
        h.audio(from: ann.link, burst: burst, sequence: 1, payload: [1])
        #expect(h.audio(to: cat.link).count == 1)
        h.hub.closed(cat.link, at: h.time)
        h.drain()
        let cat2 = h.join("cat")
        h.advance(0)
        #expect(h.audio(to: cat2.link).isEmpty)
        h.send(.floorRelease, from: ann.link)
        // Offline with a token, but not listening to Ann: no wake for her next burst.
        h.send(.registerPushToken(token: "00ff", environment: .production), from: bob.link)
        h.hub.closed(bob.link, at: h.time)
        h.drain()
        h.other.removeAll()
        h.send(.floorRequest(), from: ann.link)
        let wakes = h.other.compactMap { if case .burstStarted(_, _, let wake, _) = $0 { return wake } else { return nil } }
        #expect(wakes.allSatisfy { $0.isEmpty })
        // Subscribing again restores the relay.
        let bob2 = h.join("bob")
        h.send(.setSubscriptions(unheard: []), from: bob2.link)
        h.advance(0)
        let burst2 = h.grantedBurst(ann.link)!
        h.audio(from: ann.link, burst: burst2, sequence: 0, payload: [9])
        #expect(h.audio(to: bob2.link).map(\.payload) == [[9]])
    }

    @Test func badControlMessagesGetAnErrorNotACrash() {
        let h = Harness()
        let ann = h.join("ann")
        for junk: [UInt8] in [[], [0xff, 0xfe], Array("{\"type\":\"nope\"}".utf8), Array("[1,2]".utf8),
                              Array("{\"type\":\"setMuted\"}".utf8), [UInt8](repeating: 0x20, count: 70_000)] {
            h.hub.control(ann.link, bytes: junk, at: h.time)
            h.drain()
            guard case .error(.protocolError, _)? = h.lastMessage(to: ann.link) else { Issue.record("no error for \(junk.prefix(8))"); continue }
        }
        #expect(h.hub.counters.controlErrors == 6)
        let stranger = Link(index: 500, generation: 1)
        h.hub.connected(stranger)
        h.send(.floorRequest(), from: stranger)
        #expect(h.lastMessage(to: stranger) == .error(code: .notJoined, reason: "join a channel first"))
    }

    @Test func aRevokedTokenRemovesItsLiveMemberWithTheReason() {
        let h = Harness()
        let ann = h.join("ann", tokenID: "ann-1"), bob = h.join("bob", tokenID: "bob-1")
        h.hub.apply(.token("nobody's", channel: h.channel.id, user: nil, expiresAt: nil, at: h.time.date, reason: "leaked"), at: h.time)
        h.hub.apply(.token("bob-1", channel: UUID(), user: nil, expiresAt: nil, at: h.time.date, reason: "leaked"), at: h.time)
        h.drain()
        #expect(h.hub.roster(of: h.channel.id).count == 2, "a token nobody holds, or one of another channel, removes nobody")

        h.hub.apply(.token("bob-1", channel: h.channel.id, user: "bob", expiresAt: nil, at: h.time.date, reason: "phone lost"), at: h.time)
        h.drain()
        guard case .refused(.tokenRevoked, let reason)? = h.lastMessage(to: bob.link) else {
            Issue.record("bob was not told: \(h.messages(to: bob.link))"); return
        }
        #expect(reason.contains("phone lost"))
        #expect(h.closes.contains { $0.0 == bob.link && $0.1 == .removed })
        #expect(h.messages(to: ann.link).contains(.participantLeft(slot: bob.slot, userID: "bob")))
        #expect(h.hub.roster(of: h.channel.id).map(\.userID) == ["ann"])
        #expect(h.stored.last == .removeMember(channel: h.channel.id, user: "bob"))
        // Whatever bob's connection sends before it closes is ignored.
        let count = h.messages(to: bob.link).count
        h.send(.floorRequest(), from: bob.link)
        #expect(h.messages(to: bob.link).count == count && h.floorEvents(to: ann.link).isEmpty)
    }

    @Test func aStoredMemberComesBackWithItsRightsAndItsTokenCanBeRevoked() {
        // After a restart: members loaded from the store, offline, with what their last token allowed.
        let hub = ChannelHub()
        let channel = ChannelRecord(id: UUID(), name: "Ops", maxBurstSeconds: 60)
        let date = Date(timeIntervalSince1970: 1_800_000_000)
        let time = HubTime(instant: WireInstant(nanoseconds: 1_000 * ms), date: date)
        func grant(_ id: String, talk: Bool, listen: Bool) -> MemberGrant {
            MemberGrant(canTalk: talk, canListen: listen, role: "crew", priority: 7, tokenID: id,
                        tokenIssuedAt: date.addingTimeInterval(-60), tokenExpiresAt: date.addingTimeInterval(3600))
        }
        let stored = [
            MemberRecord(channelID: channel.id, userID: "ann", displayName: "Ann", pushToken: "aa", pushEnvironment: .sandbox,
                         grant: grant("ann-1", talk: true, listen: true)),
            MemberRecord(channelID: channel.id, userID: "tom", displayName: "Tom", pushToken: "bb", pushEnvironment: .sandbox,
                         grant: grant("tom-1", talk: true, listen: false)),
            MemberRecord(channelID: channel.id, userID: "old", displayName: "Old", pushToken: "cc", pushEnvironment: .sandbox),
            MemberRecord(channelID: channel.id, userID: "sue", displayName: "Sue", pushToken: "dd", pushEnvironment: .sandbox,
                         grant: grant("sue-1", talk: true, listen: true), unheard: ["cy"]),
        ]
        hub.upsertChannel(channel, members: stored, at: time)
        let roster = Dictionary(uniqueKeysWithValues: hub.roster(of: channel.id).map { ($0.userID, $0) })
        #expect(roster["ann"]?.role == "crew" && roster["ann"]?.priority == 7 && roster["ann"]?.canTalk == true)
        #expect(roster["tom"]?.canListen == false)
        #expect(roster["old"]?.canTalk == false && roster["old"]?.canListen == true && roster["old"]?.role == nil)

        // A talk burst wakes only members that may listen, and want to hear the talker: not talk-only
        // Tom, nor Sue, who unsubscribed from Cy before the restart.
        let link = Link(index: 1, generation: 1)
        hub.connected(link)
        hub.control(link, bytes: MessageCodec().encode(.join(token: "t", channel: channel.id, reason: .developerRequest)), at: time)
        hub.admit(link, claims: ParticipantClaims(userID: "cy", name: "Cy", channel: channel.id, capabilities: [.talk, .listen],
                                                  issuedAt: date, expiresAt: date.addingTimeInterval(60), tokenID: "cy-1"),
                  reason: .developerRequest, at: time)
        hub.control(link, bytes: MessageCodec().encode(.floorRequest()), at: time)
        let woken = hub.takeOutputs().compactMap { output -> [String]? in
            if case .burstStarted(_, _, let wake, _) = output { return wake.map(\.userID).sorted() } else { return nil }
        }
        #expect(woken == [["ann", "old"]])

        // Revoking ann's token by id removes her although she has not joined since the restart, and
        // tells her device to leave.
        hub.apply(.token("ann-1", channel: channel.id, user: nil, expiresAt: nil, at: date, reason: "phone lost"), at: time)
        let outputs = hub.takeOutputs()
        #expect(!hub.isMember(channel: channel.id, user: "ann"))
        #expect(outputs.contains { if case .memberGone(_, let m) = $0 { return m.userID == "ann" } else { return false } })
        #expect(outputs.contains(.store(.removeMember(channel: channel.id, user: "ann"))))
        #expect(hub.isMember(channel: channel.id, user: "tom"))
    }

    /// Members away since before the cut-off are forgotten: offline ones only, whatever the store
    /// says of the others; everyone connected hears they left, their rows go, and a device with a
    /// push token is told to leave. A member that came back stays.
    @Test func membersAwayTooLongAreForgotten() {
        let h = Harness()
        let day = 86_400.0
        let channel = ChannelRecord(id: UUID(), name: "Field", maxBurstSeconds: 60)
        func stored(_ user: String, daysAgo: Double, pushToken: String? = nil) -> MemberRecord {
            MemberRecord(channelID: channel.id, userID: user, displayName: user.capitalized, lastSeen: h.epoch.addingTimeInterval(-daysAgo * day),
                         pushToken: pushToken, pushEnvironment: pushToken == nil ? nil : .sandbox)
        }
        h.hub.upsertChannel(channel, members: [stored("gone", daysAgo: 40, pushToken: "aa"), stored("quiet", daysAgo: 40),
                                               stored("recent", daysAgo: 10), stored("back", daysAgo: 40)], at: h.time)
        let watcher = h.join("watcher", channel: channel.id)
        let back = h.join("back", channel: channel.id)
        h.hub.closed(back.link, at: h.time)  // reconnecting, not offline
        _ = h.hub.takeOutputs()
        #expect(h.hub.forgetIdleMembers(seenBefore: h.epoch.addingTimeInterval(-30 * day), limit: 1, at: h.time) == 1, "one at a time if asked")
        #expect(h.hub.forgetIdleMembers(seenBefore: h.epoch.addingTimeInterval(-30 * day), limit: 20, at: h.time) == 1)
        let outputs = h.hub.takeOutputs()
        #expect(Set(h.hub.roster(of: channel.id).map(\.userID)) == ["recent", "back", "watcher"])
        #expect(outputs.contains(.store(.removeMember(channel: channel.id, user: "gone"))))
        #expect(outputs.contains(.store(.removeMember(channel: channel.id, user: "quiet"))))
        #expect(outputs.contains { if case .send(.participantLeft(_, "gone"), let links) = $0 { return links.contains(watcher.link) } else { return false } })
        let gone = outputs.compactMap { if case .memberGone(_, let m) = $0 { return m.userID } else { return nil } }
        #expect(gone == ["gone"])
        // The one that came back was seen just now: kept even once offline, until it is away long enough.
        h.advance(h.hub.configuration.disconnectGrace + 1_000_000_000)
        #expect(h.hub.forgetIdleMembers(seenBefore: h.epoch.addingTimeInterval(-30 * day), limit: 20, at: h.time) == 0)
        // A join being checked may be one of them coming back: its channel waits for the next round.
        let checking = Link(index: 999, generation: 1)
        h.hub.connected(checking)
        h.send(.join(token: "t", channel: channel.id, reason: .developerRequest), from: checking)
        #expect(h.hub.forgetIdleMembers(seenBefore: h.time.date.addingTimeInterval(1), limit: 20, at: h.time) == 0)
        h.hub.closed(checking, at: h.time)
        #expect(h.hub.forgetIdleMembers(seenBefore: h.time.date.addingTimeInterval(1), limit: 20, at: h.time) == 2, "recent and back, both offline now")
        #expect(h.hub.roster(of: channel.id).map(\.userID) == ["watcher"])
    }

    /// A member whose token runs out goes offline as of then, not as of its join; the hourly chore
    /// writes the last-seen times of the members still connected.
    @Test func lastSeenFollowsExpiryAndConnectedMembersAreTouched() {
        let h = Harness()
        let ann = h.join("ann", expiresAt: h.epoch.addingTimeInterval(3_600))
        _ = h.join("bob", expiresAt: h.epoch.addingTimeInterval(86_400))
        h.advance(3_601 * 1_000_000_000)
        #expect(h.messages(to: ann.link).contains { if case .refused(.tokenExpired, _) = $0 { true } else { false } })
        #expect(h.hub.forgetIdleMembers(seenBefore: h.epoch.addingTimeInterval(3_000), limit: 20, at: h.time) == 0, "seen at the expiry, not the join")
        #expect(h.hub.forgetIdleMembers(seenBefore: h.time.date.addingTimeInterval(1), limit: 20, at: h.time) == 1)
        #expect(h.hub.connectedMembers == [MemberKey(channel: h.channel.id, user: "bob")])
    }

    @Test func aJoinStoresWhatTheTokenAllows() {
        let h = Harness()
        h.join("ann", capabilities: [.listen], priority: 9, tokenID: "ann-7")
        let upsert = h.stored.compactMap { if case .upsertMember(let m) = $0 { return m } else { return nil } }.last
        #expect(upsert?.grant?.tokenID == "ann-7" && upsert?.grant?.priority == 9)
        #expect(upsert?.grant?.canTalk == false && upsert?.grant?.canListen == true)
        #expect(upsert?.grant?.tokenExpiresAt == h.epoch.addingTimeInterval(3600))
    }

    @Test func aMemberRevocationSparesATokenIssuedAfterIt() {
        let h = Harness()
        let cut = h.time.date
        let ann = h.join("ann", issuedAt: cut.addingTimeInterval(5))  // rejoined with a fresh token
        let bob = h.join("bob", issuedAt: cut.addingTimeInterval(-5))
        h.hub.apply(.member(channel: h.channel.id, user: "ann", at: cut, reason: "removed"), at: h.time)
        h.hub.apply(.member(channel: h.channel.id, user: "bob", at: cut, reason: "removed"), at: h.time)
        h.drain()
        #expect(h.lastMessage(to: bob.link) == .refused(code: .removedByAdmin, reason: "an administrator removed you from the channel"))
        #expect(!h.messages(to: ann.link).contains { if case .refused = $0 { true } else { false } })
        #expect(h.hub.roster(of: h.channel.id).map(\.userID) == ["ann"])
    }

    @Test func nothingCountsDuringTheRefusalDelay() {
        let h = Harness()
        let link = Link(index: 900, generation: 1)
        h.hub.connected(link)
        h.send(.join(token: "bad", channel: h.channel.id, reason: .developerRequest), from: link)
        h.hub.refuse(link, code: .tokenForged, reason: "forged")
        h.drain()
        let verifies = h.other.filter { if case .verify = $0 { true } else { false } }.count
        let messages = h.messages(to: link).count
        // A second join before the close lands must not be verified (and admitted) on this connection.
        h.send(.join(token: "good", channel: h.channel.id, reason: .developerRequest), from: link)
        h.send(.floorRequest(), from: link)
        // Nor is garbage answered, or a flood (it used to get one `error` per message).
        for _ in 0 ..< 100 { h.hub.control(link, bytes: Array("{not json".utf8), at: h.time) }
        for _ in 0 ..< 100 { h.send(.floorRequest(), from: link) }
        h.drain()
        #expect(h.other.filter { if case .verify = $0 { true } else { false } }.count == verifies)
        #expect(h.messages(to: link).count == messages)
        #expect(h.hub.counters.refusals == 1)
    }

    /// A connection that never joined (no token needed) flooding floor requests gets the capped
    /// `error`, at most one a second, not a `denied` per message.
    @Test func anUnjoinedFloodIsAnsweredOnceASecond() {
        let h = Harness()
        let link = Link(index: 901, generation: 1)
        h.hub.connected(link)
        for _ in 0 ..< 500 { h.send(.floorRequest(request: 1), from: link) }
        let answers = h.messages(to: link)
        let limited = answers.filter { if case .error(.rateLimited, _) = $0 { true } else { false } }.count
        #expect(limited == 1, "\(answers.count) answers")
        #expect(!answers.contains { if case .floor = $0 { true } else { false } })
        #expect(answers.count <= Int(HubConfiguration().controlMessageBurst) + 1)
    }

    @Test func joinToAMissingChannelIsRefused() {
        let h = Harness()
        let ghost = h.join("ann", channel: UUID())
        guard case .refused(.channelNotFound, _)? = h.lastMessage(to: ghost.link) else { Issue.record("not refused"); return }
        #expect(h.closes.contains { $0.0 == ghost.link && $0.1 == .refused })
    }
}
