import ChannelProtocol
import ChannelStore
import Foundation
import Testing
import Wire
@testable import ChannelHub

/// Control messages: the rate limit, the join deadline, bad input, and nothing counting during a refusal.
@Suite struct HubControlTests {
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

    /// A hub allowing 20 control messages a second, in bursts of 40.
    func rateLimitedHarness() -> Harness {
        var configuration = HubConfiguration.unpaced
        configuration.controlMessagesPerSecond = 20
        configuration.controlMessageBurst = 40
        return Harness(configuration: configuration)
    }
}
