import ChannelProtocol
import ChannelStore
import Foundation
import ParticipantClaims
import Testing
import Wire
@testable import ChannelHub

/// A hub on a cluster node serves a channel only while it holds the channel's lease: no grant, no
/// relayed packet after it, and members sent on their way when it is lost or the channel moves.
@Suite struct HubClusterTests {
    func clustered() -> HubConfiguration {
        var configuration = HubConfiguration.unpaced
        configuration.clustered = true
        return configuration
    }

    @Test func aChannelWithoutItsLeaseGrantsNothing() {
        let h = Harness(configuration: clustered())
        let ann = h.join("ann")
        h.send(.floorRequest(request: 1), from: ann.link)
        let denied = h.floorEvents(to: ann.link).last
        #expect(denied?.kind == .denied && denied?.cause == .serviceUnavailable && denied?.request == 1, "\(String(describing: denied))")
        h.hub.leaseHeld(h.channel.id, until: h.now + 5_000 * ms)
        h.send(.floorRequest(request: 2), from: ann.link)
        #expect(h.floorEvents(to: ann.link).last?.kind == .granted)
    }

    @Test func relayingStopsWhenTheLeaseRunsOutWithoutARenewal() throws {
        let h = Harness(configuration: clustered())
        h.hub.leaseHeld(h.channel.id, until: h.now + 2_000 * ms)
        let ann = h.join("ann"), bob = h.join("bob")
        h.send(.floorRequest(), from: ann.link)
        let burst = try #require(h.grantedBurst(ann.link))
        h.audio(from: ann.link, burst: burst, sequence: 0, payload: [1])
        #expect(h.audio(to: bob.link).count == 1)
        h.now = h.now + 2_000 * ms  // validity over: a paused node resuming here relays nothing
        h.audio(from: ann.link, burst: burst, sequence: 1, payload: [2])
        #expect(h.audio(to: bob.link).count == 1)
        #expect(h.hub.counters.drops(.notHome) == 1)
        // A renewal that arrives later (it counted from its send time) serves again.
        h.hub.leaseHeld(h.channel.id, until: h.now + 4_000 * ms)
        h.audio(from: ann.link, burst: burst, sequence: 2, payload: [3])
        #expect(h.audio(to: bob.link).count == 2)
    }

    @Test func aFencedChannelSendsItsMembersAwaySayingConnecting() {
        let h = Harness(configuration: clustered())
        h.hub.leaseHeld(h.channel.id, until: h.now + 5_000 * ms)
        let ann = h.join("ann"), bob = h.join("bob")
        h.hub.fence(h.channel.id, reason: "this node lost the channel's lease", at: h.time)
        h.drain()
        for member in [ann, bob] {
            #expect(h.messages(to: member.link).contains(.serviceStatus(.connecting, reason: "this node lost the channel's lease")))
            #expect(h.closes.contains { $0.0 == member.link && $0.1 == .goingAway })
        }
        #expect(!h.hub.serves(h.channel.id, at: h.now) && h.hub.channel(h.channel.id) == nil, "dropped until it is loaded again")
    }

    @Test func aJoinRedirectedIsToldTheHomeAndClosed() {
        let h = Harness(configuration: clustered())
        let link = Link(index: 99, generation: 1)
        h.hub.connected(link)
        h.send(.join(token: "t", channel: h.channel.id, reason: .developerRequest), from: link)
        let home = NodeAddress(node: "b", host: "10.0.0.2", port: 7702, epoch: 3)
        h.hub.redirect(link, to: home)
        h.drain()
        #expect(h.messages(to: link) == [.redirect(home: home)])
        #expect(h.closes.contains { $0.0 == link && $0.1 == .goingAway })
        // Whatever the connection sends next is not taken as a member's.
        h.send(.floorRequest(), from: link)
        #expect(h.floorEvents(to: link).isEmpty)
    }

    @Test func aMoveSendsEveryMemberToTheNewHomeAndEndsTheBurst() throws {
        let h = Harness(configuration: clustered())
        h.hub.leaseHeld(h.channel.id, until: h.now + 5_000 * ms)
        let ann = h.join("ann"), bob = h.join("bob")
        h.send(.floorRequest(), from: ann.link)
        _ = try #require(h.grantedBurst(ann.link))
        h.stored.removeAll()
        let home = NodeAddress(node: "c", host: "10.0.0.3", port: 7703, epoch: 9)
        h.hub.move(h.channel.id, to: home, at: h.time)
        h.drain()
        for member in [ann, bob] { #expect(h.messages(to: member.link).last == .move(home: home)) }
        #expect(h.stored.contains { if case .logTransmission(let r) = $0 { r.endReason == "moved" && r.userID == "ann" } else { false } })
    }

    @Test func aSingleNodeServesWithoutALease() throws {
        let h = Harness()
        let ann = h.join("ann")
        h.send(.floorRequest(), from: ann.link)
        #expect(h.grantedBurst(ann.link) != nil)
    }
}
