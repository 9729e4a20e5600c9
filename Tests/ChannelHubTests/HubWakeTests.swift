import ChannelProtocol
import ChannelStore
import Foundation
import Testing
import Wire
@testable import ChannelHub

/// Wake-ups: who a burst start asks to push, and who it keeps the burst for.
@Suite struct HubWakeTests {
    @Test func burstStartListsConnectedMembersWithTokensForTheLivenessCheck() throws {
        let h = Harness()
        let ann = h.join("ann"), bob = h.join("bob")
        h.send(.registerPushToken(token: "00ff", environment: .sandbox), from: bob.link)
        h.send(.registerPushToken(token: "0a0a", environment: .sandbox), from: ann.link)
        h.send(.floorRequest(), from: ann.link)
        // Nothing until the burst carries audio: a request and release in a loop wakes nobody.
        #expect(!h.other.contains { if case .burstStarted = $0 { return true } else { return false } })
        h.audio(from: ann.link, burst: try #require(h.grantedBurst(ann.link)), sequence: 0, payload: [0])
        h.drain()
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
        h.talk(ann.link)
        let wake = h.other.compactMap { if case .burstStarted(_, let talker, let wake, _) = $0 { return (talker, wake) } else { return nil } }
        #expect(wake.count == 1)
        #expect(wake.first?.0.userID == "ann")
        #expect(wake.first?.1.map(\.pushToken) == ["00ff"])
    }

    /// With pushes off (`--apns off`) nothing wakes an asleep member: its burst is neither pushed nor
    /// kept for it, though a member that dropped a moment ago is still owed it.
    @Test func withoutPushesAnAsleepMemberIsNeitherWokenNorOwedTheBurst() throws {
        var configuration = HubConfiguration.unpaced
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
            h.talk(ann.link)
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
        h.talk(ann.link, payload: [8])
        let wakes = h.other.compactMap { if case .burstStarted(_, _, let wake, _) = $0 { return wake } else { return nil } }
        #expect(wakes.allSatisfy { $0.isEmpty })
        // Subscribing again restores the relay.
        let bob2 = h.join("bob")
        h.send(.setSubscriptions(unheard: []), from: bob2.link)
        h.advance(0)
        let burst2 = h.grantedBurst(ann.link)!
        h.audio(from: ann.link, burst: burst2, sequence: 1, payload: [9])
        #expect(h.audio(to: bob2.link).map(\.payload) == [[9]])
    }
}
