import APNs
import ChannelStore
import Foundation
@testable import PTTServer
import Logging
import NIOConcurrencyHelpers
import Prometheus
import SquelchTesting
import Testing

/// The push schedule as a state machine: time is a value the test moves, so intervals are exact.
@Suite struct PushScheduleTests {
    let channel = UUID()
    let t0 = ContinuousClock.now

    func member(_ user: String) -> MemberRecord {
        MemberRecord(channelID: channel, userID: user, displayName: user.capitalized, joinedAt: .distantPast,
                     lastSeen: .distantPast, pushToken: "\(user)-token")
    }

    func wake(_ user: String, by speaker: String = "Ann") -> PushSchedule.Job {
        .wake(channel: channel, speaker: speaker, member: member(user))
    }

    func at(_ ms: Int) -> ContinuousClock.Instant { t0 + .milliseconds(ms) }

    /// Hands out everything that can go at `now`, completing nothing.
    func drain(_ schedule: inout PushSchedule, at now: ContinuousClock.Instant) -> [PushSchedule.Job] {
        var sent: [PushSchedule.Job] = []
        while case .send(let job) = schedule.next(now: now) { sent.append(job) }
        return sent
    }

    @Test func jobsGoOutInTheOrderTheyCame() {
        var schedule = PushSchedule()
        for user in ["bob", "cat", "dan"] { #expect(schedule.enqueue(wake(user), now: at(0)) == .queued) }
        #expect(drain(&schedule, at: at(0)) == [wake("bob"), wake("cat"), wake("dan")])
        #expect(schedule.next(now: at(0)) == .idle)
    }

    @Test func aWaitingWakeIsReplacedByTheNewerSpeakerNotDuplicated() {
        var schedule = PushSchedule()
        #expect(schedule.enqueue(wake("bob", by: "Ann"), now: at(0)) == .queued)
        #expect(schedule.enqueue(wake("cat", by: "Ann"), now: at(0)) == .queued)
        #expect(schedule.enqueue(wake("bob", by: "Eve"), now: at(1)) == .replaced)
        #expect(schedule.waitingCount == 2)
        // Bob keeps his place in the queue and gets the newest speaker.
        #expect(drain(&schedule, at: at(1)) == [wake("bob", by: "Eve"), wake("cat", by: "Ann")])
    }

    @Test func wakesToOneMemberAreSpacedAndTheHeldOneCarriesTheLatestSpeaker() {
        var schedule = PushSchedule(wakeInterval: .seconds(1))
        _ = schedule.enqueue(wake("bob", by: "Ann"), now: at(0))
        #expect(drain(&schedule, at: at(0)) == [wake("bob", by: "Ann")])
        schedule.complete(wake("bob").key, now: at(100))

        // Two more bursts inside the second: held, then merged.
        #expect(schedule.enqueue(wake("bob", by: "Eve"), now: at(300)) == .queued)
        #expect(schedule.enqueue(wake("bob", by: "Fay"), now: at(600)) == .replaced)
        #expect(schedule.next(now: at(600)) == .wait(until: at(1000)))
        #expect(schedule.next(now: at(999)) == .wait(until: at(1000)))
        // At the end of the interval exactly one wake goes, with the newest speaker.
        #expect(drain(&schedule, at: at(1000)) == [wake("bob", by: "Fay")])
        #expect(schedule.next(now: at(1000)) == .idle)
    }

    /// Bob was woken at 0 (delivered by 10), and Eve's burst at 20 finds him inside the interval.
    func bobWokenThenHeld() -> PushSchedule {
        var schedule = PushSchedule(wakeInterval: .seconds(1))
        _ = schedule.enqueue(wake("bob"), now: at(0))
        _ = drain(&schedule, at: at(0))
        schedule.complete(wake("bob").key, now: at(10))
        _ = schedule.enqueue(wake("bob", by: "Eve"), now: at(20))
        return schedule
    }

    @Test func aHeldWakeDoesNotHoldUpOtherMembers() {
        var schedule = bobWokenThenHeld()
        _ = schedule.enqueue(wake("cat", by: "Eve"), now: at(20))
        #expect(drain(&schedule, at: at(20)) == [wake("cat", by: "Eve")])
    }

    @Test func aLeaveIsNeverHeldByTheIntervalAndReplacesAWaitingWake() {
        var schedule = bobWokenThenHeld()
        let leave = PushSchedule.Job.leave(channel: channel, member: member("bob"))
        #expect(schedule.enqueue(leave, now: at(30)) == .replaced)
        #expect(drain(&schedule, at: at(30)) == [leave])
    }

    @Test func aWakeAfterAWaitingLeaveIsDropped() {
        var schedule = PushSchedule(maxInFlight: 1)
        _ = schedule.enqueue(wake("cat"), now: at(0))
        let leave = PushSchedule.Job.leave(channel: channel, member: member("bob"))
        _ = schedule.enqueue(leave, now: at(0))
        #expect(schedule.enqueue(wake("bob", by: "Eve"), now: at(0)) == .superfluous)
        #expect(drain(&schedule, at: at(0)) == [wake("cat")])
        schedule.complete(wake("cat").key, now: at(5))
        #expect(drain(&schedule, at: at(5)) == [leave])
    }

    @Test func inFlightPushesAreCappedAndACompletionLetsTheNextGo() {
        var schedule = PushSchedule(maxInFlight: 2)
        for user in ["bob", "cat", "dan"] { _ = schedule.enqueue(wake(user), now: at(0)) }
        #expect(drain(&schedule, at: at(0)) == [wake("bob"), wake("cat")])
        #expect(schedule.next(now: at(0)) == .busy)
        schedule.complete(wake("cat").key, now: at(50))
        #expect(drain(&schedule, at: at(50)) == [wake("dan")])
        #expect(schedule.inFlightCount == 2)
    }

    @Test func oneMemberNeverHasTwoPushesInFlight() {
        // No interval, so only the push in flight holds the second one back.
        var schedule = PushSchedule(wakeInterval: .zero)
        _ = schedule.enqueue(wake("bob", by: "Ann"), now: at(0))
        _ = drain(&schedule, at: at(0))
        #expect(schedule.enqueue(wake("bob", by: "Eve"), now: at(10)) == .queued)
        #expect(schedule.next(now: at(10)) == .idle)
        schedule.complete(wake("bob").key, now: at(1500))
        #expect(drain(&schedule, at: at(1500)) == [wake("bob", by: "Eve")])
    }

    @Test func theQueueIsBoundedByMembersNotByJobs() {
        var schedule = PushSchedule(queueLimit: 2)
        #expect(schedule.enqueue(wake("bob"), now: at(0)) == .queued)
        #expect(schedule.enqueue(wake("cat"), now: at(0)) == .queued)
        #expect(schedule.enqueue(wake("dan"), now: at(0)) == .full)
        // A thousand more bursts for members already waiting cost nothing more.
        for index in 0..<1000 { #expect(schedule.enqueue(wake(index.isMultiple(of: 2) ? "bob" : "cat", by: "S\(index)"), now: at(0)) == .replaced) }
        #expect(schedule.waitingCount == 2)
        #expect(drain(&schedule, at: at(0)) == [wake("bob", by: "S998"), wake("cat", by: "S999")])
        #expect(schedule.enqueue(wake("dan"), now: at(1)) == .queued)
    }

    @Test func aLeaveIsQueuedEvenWhenWakesFillTheQueue() {
        var schedule = PushSchedule(queueLimit: 2)
        #expect(schedule.enqueue(wake("bob"), now: at(0)) == .queued)
        #expect(schedule.enqueue(wake("cat"), now: at(0)) == .queued)
        #expect(schedule.enqueue(wake("dan"), now: at(0)) == .full)
        // Dan was removed: his leave push is his phone's only way to learn it.
        let leave = PushSchedule.Job.leave(channel: channel, member: member("dan"))
        #expect(schedule.enqueue(leave, now: at(0)) == .queued)
        #expect(drain(&schedule, at: at(0)).contains(leave))
    }

    @Test func finishingSendsWhatIsWaitingAtOnceThenEnds() {
        var schedule = PushSchedule(wakeInterval: .seconds(1))
        _ = schedule.enqueue(wake("bob"), now: at(0))
        _ = drain(&schedule, at: at(0))
        _ = schedule.enqueue(wake("bob", by: "Eve"), now: at(10))
        schedule.finish(now: at(20))
        #expect(schedule.enqueue(wake("cat"), now: at(20)) == .closed)
        // Bob's first push is still in flight, so his held one waits for it, not for the interval.
        #expect(schedule.next(now: at(20)) == .idle)
        schedule.complete(wake("bob").key, now: at(30))
        #expect(drain(&schedule, at: at(30)) == [wake("bob", by: "Eve")])
        #expect(schedule.next(now: at(30)) == .idle)
        schedule.complete(wake("bob").key, now: at(40))
        #expect(schedule.next(now: at(40)) == .finished)
    }

    /// APNs was down: wakes piled up behind the in-flight limit. Those that waited past the age limit
    /// are dropped and counted, not sent minutes late; a leave never is, and a newer wake for the same
    /// member counts from its own time.
    @Test func wakesThatWaitedTooLongAreDroppedNotSent() {
        var schedule = PushSchedule(maxInFlight: 1, maxWakeAge: .seconds(30))  // shorter than the default, for the arithmetic
        _ = schedule.enqueue(wake("bob"), now: at(0))
        #expect(drain(&schedule, at: at(0)) == [wake("bob")])      // stuck in flight
        _ = schedule.enqueue(wake("cat"), now: at(1_000))
        _ = schedule.enqueue(.leave(channel: channel, member: member("dan")), now: at(1_000))
        _ = schedule.enqueue(wake("eve"), now: at(1_000))
        _ = schedule.enqueue(wake("eve", by: "Cy"), now: at(25_000))  // a newer burst's wake
        schedule.complete(wake("bob").key, now: at(40_000))
        var sent: [PushSchedule.Job] = []
        for _ in 0 ..< 3 {
            guard case .send(let job) = schedule.next(now: at(40_000)) else { break }
            sent.append(job)
            schedule.complete(job.key, now: at(40_000))
        }
        #expect(sent == [.leave(channel: channel, member: member("dan")), wake("eve", by: "Cy")], "cat's wake waited 39 s")
        #expect(schedule.takeStale() == 1)
        #expect(schedule.takeStale() == 0)
        #expect(schedule.next(now: at(40_000)) == .idle)
    }

    @Test func wakesToTheSameUserInTwoChannelsAreNotMerged() {
        var schedule = PushSchedule()
        let other = UUID()
        let there = PushSchedule.Job.wake(channel: other, speaker: "Ann",
                                          member: MemberRecord(channelID: other, userID: "bob", displayName: "Bob", pushToken: "t2"))
        _ = schedule.enqueue(wake("bob"), now: at(0))
        #expect(schedule.enqueue(there, now: at(0)) == .queued)
        #expect(drain(&schedule, at: at(0)).count == 2)
    }
}

/// The dispatcher's loop around the schedule, with a real APNs client aimed at a closed port.
@Suite(.timeLimit(.minutes(1))) struct PushDispatcherTests {
    @Test func aCancelledDispatcherStopsInsteadOfSpinning() async throws {
        let identity = try APNsProviderIdentity.load(p8Path: DevCertificates.p8, keyID: "DEVKEY0001", teamID: "DEVTEAM001")
        let client = try await APNsClient(configuration: APNsConfiguration(
            environment: .custom(host: "127.0.0.1", port: 1, caPath: DevCertificates.ca), identity: identity,
            topic: "org.squelch.walkie.voip-ptt", poolSize: 1))
        let dispatcher = PushDispatcher(route: APNsRoute(all: client), registry: PrometheusCollectorRegistry(),
                                        logger: Logger(label: "test")) { _, _, _ in }
        let run = Task { try await dispatcher.run() }
        let channel = UUID()
        dispatcher.wake(channel: channel, speaker: "Ann",
                        members: [MemberRecord(channelID: channel, userID: "bob", displayName: "Bob", pushToken: "b0b0")])
        try await Task.sleep(for: .milliseconds(200))
        // A cancelled task's doorbell returns nil at once: the loop must end there, not go round again.
        run.cancel()
        // Watched from outside, so that a dispatcher that never ends fails this test in 5 s instead of
        // holding it (a task group would wait for its child).
        let ended = NIOLockedValueBox(false)
        Task { _ = await run.result; ended.withLockedValue { $0 = true } }
        let deadline = ContinuousClock.now + .seconds(5)
        while !ended.withLockedValue({ $0 }), ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(20)) }
        #expect(ended.withLockedValue { $0 }, "the dispatcher went on after its task was cancelled")
    }
}
