import Testing
@testable import FloorControl

typealias Arbiter = FloorArbiter<String>
let second: UInt64 = 1_000_000_000

@Suite struct FloorArbiterTests {
    @Test func halfDuplexGrantsOneTalkerAndQueuesTheNext() {
        var floor = Arbiter()
        floor.request("ann", priority: 10, canTalk: true, now: 0)
        #expect(floor.takeEvents() == [.granted("ann", burst: 1, until: 60 * second), .taken(by: "ann", burst: 1, priority: 10)])
        floor.request("bob", priority: 10, canTalk: true, now: 1)
        #expect(floor.takeEvents() == [.queued("bob", position: 1)])
        #expect(floor.mayTalk("ann") && !floor.mayTalk("bob"))
        floor.release("ann", now: 5 * second)
        #expect(floor.takeEvents() == [.ended("ann", burst: 1, duration: 5 * second),
                                       .granted("bob", burst: 2, until: 65 * second), .taken(by: "bob", burst: 2, priority: 10)])
        floor.release("bob", now: 6 * second)
        #expect(floor.takeEvents() == [.ended("bob", burst: 2, duration: second), .idle])
        #expect(floor.currentTalkers.isEmpty)
    }

    @Test func listenOnlyMembersAreDeniedWithAReason() {
        var floor = Arbiter()
        floor.request("eve", priority: 255, canTalk: false, now: 0)
        #expect(floor.takeEvents() == [.denied("eve", .listenOnly)])
        #expect(!floor.mayTalk("eve"))
    }

    @Test func aHigherPriorityPreemptsWithAReason() {
        var floor = Arbiter()
        floor.request("crew", priority: 10, canTalk: true, now: 0)
        _ = floor.takeEvents()
        floor.request("dispatch", priority: 200, canTalk: true, now: 3 * second)
        #expect(floor.takeEvents() == [
            .revoked("crew", .preempted(by: "dispatch", priority: 200)),
            .ended("crew", burst: 1, duration: 3 * second),
            .granted("dispatch", burst: 2, until: 63 * second), .taken(by: "dispatch", burst: 2, priority: 200),
        ])
        // Equal priority doesn't pre-empt.
        floor.request("supervisor", priority: 200, canTalk: true, now: 4 * second)
        #expect(floor.takeEvents() == [.queued("supervisor", position: 1)])
    }

    @Test func withoutPreemptionOrQueueingABusyFloorIsDenied() {
        var floor = Arbiter(configuration: .init(maxQueue: 0, preemption: false))
        floor.request("a", priority: 1, canTalk: true, now: 0)
        floor.request("b", priority: 255, canTalk: true, now: 0)
        #expect(floor.takeEvents().last == .denied("b", .busy))
        var small = Arbiter(configuration: .init(maxQueue: 1))
        small.request("a", priority: 1, canTalk: true, now: 0)
        small.request("b", priority: 1, canTalk: true, now: 0)
        small.request("c", priority: 1, canTalk: true, now: 0)
        #expect(small.takeEvents().last == .denied("c", .queueFull))
    }

    /// A request that won't wait (`mayQueue` false: a one-shot announcement) is denied `busy` when
    /// it can't be granted, and so takes nobody's place in a full queue; it still pre-empts a lower
    /// priority, and a free slot still grants it.
    @Test func aRequestThatWontWaitIsDeniedRatherThanQueued() {
        var floor = Arbiter(configuration: .init(maxQueue: 1))
        floor.request("crew1", priority: 0, canTalk: true, now: 0)
        floor.request("crew2", priority: 0, canTalk: true, now: 1)
        _ = floor.takeEvents()
        floor.request("dispatch", priority: 5, canTalk: true, mayQueue: false, now: 2)
        #expect(floor.takeEvents().first == .revoked("crew1", .preempted(by: "dispatch", priority: 5)), "pre-empts as ever")
        floor.request("crew3", priority: 9, canTalk: true, mayQueue: false, now: 3)
        #expect(floor.takeEvents().first == .revoked("dispatch", .preempted(by: "crew3", priority: 9)))
        floor.request("crew4", priority: 9, canTalk: true, mayQueue: false, now: 4)
        #expect(floor.takeEvents() == [.denied("crew4", .busy)])
        #expect(floor.queuedMembers == ["crew2"], "the one waiting keeps its place")
        var free = Arbiter()
        free.request("a", priority: 0, canTalk: true, mayQueue: false, now: 0)
        #expect(free.currentTalkers == ["a"])
    }

    /// A member granted from the queue that sends nothing (it died while it waited) loses the floor
    /// after `firstAudioLimit`, not the whole silence limit; one whose audio came has the whole limit.
    @Test func aGrantThatBringsNoAudioEndsSooner() {
        var floor = Arbiter(configuration: .init(silenceLimit: 5 * second, firstAudioLimit: 2_500_000_000))
        floor.request("ann", priority: 0, canTalk: true, now: 0)
        floor.request("bob", priority: 0, canTalk: true, now: 0)
        floor.heard("ann", now: 100_000_000)
        floor.release("ann", now: second)
        _ = floor.takeEvents()
        #expect(floor.currentTalkers == ["bob"])
        floor.handleTimeout(now: second + 2_499_000_000)
        #expect(floor.currentTalkers == ["bob"])
        floor.handleTimeout(now: second + 2_500_000_000)
        #expect(floor.takeEvents().first == .revoked("bob", .silent))
        // Heard once, the whole limit counts.
        floor.request("cat", priority: 0, canTalk: true, now: 10 * second)
        floor.heard("cat", now: 10 * second + 20_000_000)
        floor.handleTimeout(now: 14 * second)
        #expect(floor.currentTalkers == ["cat"])
        floor.handleTimeout(now: 15 * second + 20_000_000)
        #expect(floor.currentTalkers.isEmpty)
    }

    @Test func aFullQueueLetsAHigherPriorityInAtItsTailsExpense() {
        var floor = Arbiter(configuration: .init(maxQueue: 2))
        floor.request("dispatch", priority: 5, canTalk: true, now: 0)
        floor.request("crew1", priority: 0, canTalk: true, now: 1)
        floor.request("crew2", priority: 0, canTalk: true, now: 2)
        _ = floor.takeEvents()
        // Another dispatcher can't pre-empt an equal priority, and must not be locked out by the crew.
        floor.request("dispatch2", priority: 5, canTalk: true, now: 3)
        #expect(floor.takeEvents() == [.denied("crew2", .outranked), .queued("dispatch2", position: 1), .queued("crew1", position: 2)])
        #expect(floor.queuedMembers == ["dispatch2", "crew1"])
        // Equal to the tail is not enough: arrival order stands.
        floor.request("crew3", priority: 0, canTalk: true, now: 4)
        #expect(floor.takeEvents() == [.denied("crew3", .queueFull)])
        #expect(floor.queuedMembers == ["dispatch2", "crew1"])
    }

    @Test func preemptionTakesADisconnectedTalkerFirstThenTheNewestOfTheLowest() {
        var floor = Arbiter(configuration: .fullDuplex(maxTalkers: 3))
        floor.request("b", priority: 0, canTalk: true, now: 0)
        floor.request("a", priority: 0, canTalk: true, now: 1)
        floor.request("c", priority: 0, canTalk: true, now: 2)
        floor.disconnected("a", now: 3)
        _ = floor.takeEvents()
        // A is gone (in its grace): it loses its place, not B or C, who are talking.
        floor.request("e", priority: 5, canTalk: true, now: 4)
        #expect(floor.takeEvents().first == .revoked("a", .preempted(by: "e", priority: 5)))
        // All connected and equal: the most recent grant goes, the conversation under way carries on.
        floor.request("f", priority: 5, canTalk: true, now: 5)
        #expect(floor.takeEvents().first == .revoked("c", .preempted(by: "f", priority: 5)))
        // A disconnected talker that outranks the newcomer is not the one taken.
        floor.disconnected("e", now: 6)
        floor.request("g", priority: 3, canTalk: true, now: 7)
        #expect(floor.takeEvents().first == .revoked("b", .preempted(by: "g", priority: 3)))
        #expect(Set(floor.currentTalkers) == ["e", "f", "g"])
    }

    @Test func theQueueIsOrderedByPriorityThenArrival() {
        var floor = Arbiter()
        floor.request("talker", priority: 255, canTalk: true, now: 0)
        floor.request("low", priority: 1, canTalk: true, now: 1)
        floor.request("mid1", priority: 50, canTalk: true, now: 2)
        floor.request("mid2", priority: 50, canTalk: true, now: 3)
        _ = floor.takeEvents()
        #expect(floor.queuedMembers == ["mid1", "mid2", "low"])
        floor.release("mid1", now: 4)  // gives up waiting
        #expect(floor.takeEvents() == [.queued("mid2", position: 1), .queued("low", position: 2)])
        floor.release("talker", now: 5)
        #expect(floor.currentTalkers == ["mid2"])
    }

    @Test func aBurstIsRevokedAtTheMaximumLength() {
        var floor = Arbiter(configuration: .init(maxBurst: 30 * second))
        floor.request("a", priority: 1, canTalk: true, now: 0)
        floor.request("b", priority: 1, canTalk: true, now: 1)
        _ = floor.takeEvents()
        #expect(floor.nextDeadline == 30 * second)
        floor.handleTimeout(now: 29 * second)
        #expect(floor.takeEvents().isEmpty)
        floor.handleTimeout(now: 30 * second)
        #expect(floor.takeEvents() == [.revoked("a", .maxBurstReached), .ended("a", burst: 1, duration: 30 * second),
                                       .granted("b", burst: 2, until: 60 * second), .taken(by: "b", burst: 2, priority: 1)])
    }

    @Test func aDisconnectedTalkerKeepsTheFloorForTheGracePeriod() {
        var floor = Arbiter()
        floor.request("a", priority: 1, canTalk: true, now: 0)
        _ = floor.takeEvents()
        floor.disconnected("a", now: 10 * second)
        #expect(floor.nextDeadline == 12 * second)
        floor.reconnected("a", now: 11 * second)  // a quick network change: the burst carries on
        floor.handleTimeout(now: 13 * second)
        #expect(floor.mayTalk("a"))
        floor.disconnected("a", now: 20 * second)
        floor.handleTimeout(now: 22 * second)
        #expect(floor.takeEvents() == [.revoked("a", .disconnected), .ended("a", burst: 1, duration: 22 * second), .idle])
    }

    @Test func aTalkerThatFallsSilentLosesTheFloor() {
        var floor = Arbiter(configuration: .init(silenceLimit: 5 * second))
        floor.request("a", priority: 1, canTalk: true, now: 0)
        floor.request("b", priority: 1, canTalk: true, now: 1)
        _ = floor.takeEvents()
        #expect(floor.nextDeadline == 5 * second, "counted from the grant")
        floor.heard("a", now: 4 * second)
        floor.heard("b", now: 4 * second + 1)  // not a talker: nothing to note
        #expect(floor.nextDeadline == 9 * second)
        floor.handleTimeout(now: 8 * second)
        #expect(floor.takeEvents().isEmpty && floor.mayTalk("a"))
        floor.handleTimeout(now: 9 * second)
        #expect(floor.takeEvents() == [.revoked("a", .silent), .ended("a", burst: 1, duration: 9 * second),
                                       .granted("b", burst: 2, until: 69 * second), .taken(by: "b", burst: 2, priority: 1)])
        // A disconnected talker is judged by the grace period, not by its silence.
        floor.disconnected("b", now: 13 * second)
        #expect(floor.nextDeadline == 15 * second)
        floor.reconnected("b", now: 14 * second)
        #expect(floor.nextDeadline == 19 * second, "back within the grace: a whole limit to send again")
        floor.request("b", priority: 1, canTalk: true, now: 18 * second)  // a repeated request counts too
        #expect(floor.nextDeadline == 23 * second)
        // Off (the default): only the maximum burst ends a silent burst.
        var quiet = Arbiter()
        quiet.request("a", priority: 1, canTalk: true, now: 0)
        #expect(quiet.nextDeadline == 60 * second)
    }

    @Test func fullDuplexAllowsSeveralTalkers() {
        var floor = Arbiter(configuration: .fullDuplex(maxTalkers: 3))
        for (i, name) in ["a", "b", "c", "d"].enumerated() { floor.request(name, priority: 1, canTalk: true, now: UInt64(i)) }
        #expect(floor.currentTalkers == ["a", "b", "c"])
        #expect(floor.queuedMembers == ["d"])
        floor.release("b", now: 10)
        #expect(floor.currentTalkers == ["a", "c", "d"])
    }

    @Test func aRepeatedRequestConfirmsTheGrantWithoutANewBurst() {
        var floor = Arbiter()
        floor.request("a", priority: 1, canTalk: true, now: 0)
        _ = floor.takeEvents()
        floor.request("a", priority: 1, canTalk: true, now: 100)
        #expect(floor.takeEvents() == [.confirmed("a", burst: 1, until: 60 * second)])
        #expect(floor.burstDeadline(of: "a") == 60 * second && floor.burstDeadline(of: "b") == nil)
    }

    /// A waiting member asking again hears its own place; the others hear nothing unless its higher
    /// priority moves it past them.
    @Test func aRepeatedRequestWhileWaitingAnswersOnlyTheRequester() {
        var floor = Arbiter()
        floor.request("a", priority: 1, canTalk: true, now: 0)
        floor.request("b", priority: 1, canTalk: true, now: 1)
        floor.request("c", priority: 1, canTalk: true, now: 2)
        _ = floor.takeEvents()
        floor.request("c", priority: 1, canTalk: true, now: 3)
        #expect(floor.takeEvents() == [.queued("c", position: 2)])
        floor.request("c", priority: 5, canTalk: true, now: 4)
        #expect(floor.takeEvents() == [.queued("c", position: 1), .queued("b", position: 2)])
    }

    @Test func aTokenWithoutTalkTakesTheFloorAndTheQueuePlaceAway() {
        var floor = Arbiter()
        floor.request("ann", priority: 1, canTalk: true, now: 0)
        floor.request("bob", priority: 1, canTalk: true, now: 1)
        floor.request("cy", priority: 1, canTalk: true, now: 2)
        _ = floor.takeEvents()
        // Cy rejoins listen-only while waiting: out of the queue, told why.
        floor.rightsChanged("cy", priority: 1, canTalk: false, now: 3)
        #expect(floor.takeEvents() == [.denied("cy", .listenOnly), .queued("bob", position: 1)])
        // Ann rejoins listen-only while talking: revoked, and the queue's head gets the floor.
        floor.rightsChanged("ann", priority: 1, canTalk: false, now: 4 * second)
        #expect(floor.takeEvents() == [
            .revoked("ann", .notAllowed), .ended("ann", burst: 1, duration: 4 * second),
            .granted("bob", burst: 2, until: 64 * second), .taken(by: "bob", burst: 2, priority: 1),
        ])
        #expect(floor.currentTalkers == ["bob"] && floor.queuedMembers.isEmpty)
        // The same rights again change nothing.
        floor.rightsChanged("bob", priority: 1, canTalk: true, now: 5 * second)
        floor.rightsChanged("nobody", priority: 9, canTalk: false, now: 5 * second)
        #expect(floor.takeEvents().isEmpty)
    }

    @Test func aNewPriorityCountsForTheFloorAlreadyHeld() {
        var floor = Arbiter()
        floor.request("dispatch", priority: 200, canTalk: true, now: 0)
        _ = floor.takeEvents()
        // Dispatch's new token has priority 10: a crew member at 50 now pre-empts it.
        floor.rightsChanged("dispatch", priority: 10, canTalk: true, now: 1)
        floor.request("crew", priority: 50, canTalk: true, now: 2)
        #expect(floor.takeEvents().first == .revoked("dispatch", .preempted(by: "crew", priority: 50)))
        // And a waiting member's new priority reorders the queue.
        floor.request("a", priority: 5, canTalk: true, now: 3)
        floor.request("b", priority: 5, canTalk: true, now: 4)
        _ = floor.takeEvents()
        floor.rightsChanged("b", priority: 9, canTalk: true, now: 5)
        #expect(floor.queuedMembers == ["b", "a"])
        // A talker whose priority drops below a waiting member's loses the floor to it at once.
        _ = floor.takeEvents()
        floor.rightsChanged("crew", priority: 1, canTalk: true, now: 6)
        #expect(floor.takeEvents().prefix(3) == [
            .revoked("crew", .preempted(by: "b", priority: 9)), .ended("crew", burst: 2, duration: 4),
            .granted("b", burst: 3, until: 6 + 60 * second),
        ])
        #expect(floor.currentTalkers == ["b"] && floor.queuedMembers == ["a"])
        // So does a waiting member whose priority rises above the talker's.
        floor.rightsChanged("a", priority: 10, canTalk: true, now: 7)
        #expect(floor.currentTalkers == ["a"])
    }

    @Test func switchingToHalfDuplexKeepsTheStrongestOldestTalker() {
        var floor = Arbiter(configuration: .fullDuplex(maxTalkers: 4))
        floor.request("a", priority: 1, canTalk: true, now: 0)
        floor.request("b", priority: 5, canTalk: true, now: 1)
        floor.request("c", priority: 1, canTalk: true, now: 2)
        _ = floor.takeEvents()
        floor.reconfigure(.halfDuplex, now: 10)
        #expect(floor.takeEvents() == [
            .revoked("c", .channelChanged), .ended("c", burst: 3, duration: 8),
            .revoked("a", .channelChanged), .ended("a", burst: 1, duration: 10),
        ])
        #expect(floor.currentTalkers == ["b"])
        floor.request("a", priority: 1, canTalk: true, now: 11)
        #expect(floor.takeEvents() == [.queued("a", position: 1)])
        // Back to full duplex: the waiting member is granted at once.
        floor.reconfigure(.fullDuplex(maxTalkers: 2), now: 12)
        #expect(floor.takeEvents() == [.granted("a", burst: 4, until: 12 + 60 * second), .taken(by: "a", burst: 4, priority: 1)])
        #expect(floor.currentTalkers == ["b", "a"])
    }

    @Test func switchingToHalfDuplexEndsADisconnectedTalkerFirst() {
        var floor = Arbiter(configuration: .fullDuplex(maxTalkers: 4))
        floor.request("a", priority: 1, canTalk: true, now: 0)
        floor.request("b", priority: 1, canTalk: true, now: 1 * second)
        _ = floor.takeEvents()
        floor.disconnected("a", now: 5 * second)
        floor.reconfigure(.halfDuplex, now: 6 * second)
        #expect(floor.takeEvents() == [.revoked("a", .channelChanged), .ended("a", burst: 1, duration: 6 * second)])
        floor.handleTimeout(now: 7 * second)
        #expect(floor.currentTalkers == ["b"], "the one talking carries on")
    }

    @Test func aShorterQueueDeniesItsTail() {
        var floor = Arbiter()
        for (i, name) in ["t", "q1", "q2", "q3"].enumerated() { floor.request(name, priority: 1, canTalk: true, now: UInt64(i)) }
        _ = floor.takeEvents()
        floor.reconfigure(.init(maxQueue: 1), now: 10)
        #expect(floor.takeEvents() == [.denied("q2", .queueFull), .denied("q3", .queueFull), .queued("q1", position: 1)])
        #expect(floor.queuedMembers == ["q1"])
        // A new maximum burst applies to the burst under way.
        floor.reconfigure(.init(maxBurst: 5 * second, maxQueue: 1), now: 11)
        #expect(floor.nextDeadline == 5 * second)
    }

    /// Random command sequences: the invariants hold whatever the order.
    @Test func invariantsHoldUnderRandomCommands() {
        var rng = SystemRandomNumberGenerator()
        for trial in 0..<200 {
            var maxTalkers = trial % 3 + 1
            var floor = Arbiter(configuration: .init(maxTalkers: maxTalkers, maxBurst: 5 * second, maxQueue: 3))
            var now: UInt64 = 0
            for _ in 0..<200 {
                now += UInt64.random(in: 0...second, using: &rng)
                let member = "m\(Int.random(in: 0..<6, using: &rng))"
                switch Int.random(in: 0..<7, using: &rng) {
                case 0, 1: floor.request(member, priority: UInt8.random(in: 0...3, using: &rng), canTalk: true, now: now)
                case 2: floor.release(member, now: now)
                case 3: floor.disconnected(member, now: now)
                case 4: floor.rightsChanged(member, priority: UInt8.random(in: 0...3, using: &rng), canTalk: Bool.random(using: &rng), now: now)
                case 5 where Int.random(in: 0..<10, using: &rng) == 0:
                    maxTalkers = Int.random(in: 1...3, using: &rng)
                    floor.reconfigure(.init(maxTalkers: maxTalkers, maxBurst: 5 * second, maxQueue: 3), now: now)
                default: floor.handleTimeout(now: now)
                }
                _ = floor.takeEvents()
                #expect(floor.currentTalkers.count <= maxTalkers)
                #expect(Set(floor.currentTalkers).isDisjoint(with: floor.queuedMembers))
                #expect(Set(floor.queuedMembers).count == floor.queuedMembers.count)
                #expect(floor.queuedMembers.count <= 3)
                // Nobody waits while there is room.
                #expect(floor.queuedMembers.isEmpty || floor.currentTalkers.count == maxTalkers)
            }
        }
    }
}
