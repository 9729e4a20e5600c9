import ChannelStore
import Foundation
import NIOCore

/// Which push goes out next, and when: the policy behind `PushDispatcher`, as a plain state machine
/// (jobs, completions and the time in; the next job, or the time to look again, out).
///
/// Three limits keep a busy or abused channel from turning into unbounded work:
/// - **One push per member waiting.** A wake for a member that already has one waiting replaces it (the
///   newer speaker is the one to show), and a leave replaces a waiting wake. So the queue holds at most
///   one job per member, and a member looping floor requests doesn't multiply the pushes to everyone.
/// - **Wakes to one member at least `wakeInterval` apart.** A wake that arrives sooner is held and sent at
///   the end of the interval with the newest speaker. APNs answers rapid pushes to one token with 429
///   `TooManyRequests` (which costs that token 30 s of silence), and a phone that was just woken is already
///   connecting. Leave pushes are never held back by this.
/// - **At most `maxInFlight` pushes at once**, and one per member: the rest wait their turn in order.
///   Wakes beyond `queueLimit` members are refused, and the caller counts them. Leaves are not: one
///   refused is lost for good (its token is deleted with the member, and `apns-expiration: 0` gives no
///   second chance), leaving the phone showing a channel it is no longer in; and there are only as many
///   as members removed, forgotten or leaving, not one per burst.
/// - **A wake that waited longer than `maxWakeAge` (90 s) is dropped**, not sent: when APNs was slow or
///   down, a backlog of wakes must not go out many minutes late, saying someone is talking. 90 s is the
///   default longest burst (60 s) and the server's missed-burst window (30 s after it): until then the
///   phone it wakes still has the burst to hear.
struct PushSchedule {
    /// One push per membership waits at a time.
    typealias Key = MemberKey

    enum Job: Sendable, Equatable {
        case wake(channel: UUID, speaker: String, member: MemberRecord)
        case leave(channel: UUID, member: MemberRecord)

        var key: Key {
            switch self {
            case .wake(let channel, _, let member), .leave(let channel, let member):
                Key(channel: channel, user: member.userID)
            }
        }

        var isLeave: Bool { if case .leave = self { true } else { false } }
    }

    enum Enqueued: Equatable {
        case queued
        /// It took the place of a job already waiting for the same member.
        case replaced
        /// It was dropped instead: a leave is waiting for the member, and a wake after it means nothing.
        case superfluous
        /// A wake, with `queueLimit` members already waiting (leaves are never refused).
        case full
        /// The schedule is finishing; no new jobs.
        case closed
    }

    enum Next: Equatable {
        case send(Job)
        /// `maxInFlight` pushes are out; look again when one completes.
        case busy
        /// Nothing can go yet; look again at this time (or sooner, when something is queued or completes).
        case wait(until: ContinuousClock.Instant)
        /// Nothing waiting.
        case idle
        /// Finishing, and nothing is waiting or in flight.
        case finished
    }

    private enum Waiting {
        case ready
        /// Held back by the wake interval or by a push to the same member in flight.
        case held
    }

    let queueLimit: Int
    let maxInFlight: Int
    let wakeInterval: Duration
    let maxWakeAge: Duration
    /// Wakes dropped for their age since the caller last asked (`takeStale`).
    private var stale = 0

    private var waiting: [Key: (job: Job, state: Waiting, queuedAt: ContinuousClock.Instant)] = [:]
    private var ready = CircularBuffer<Key>()
    private var heldCount = 0
    private var inFlight = Set<Key>()
    /// When each member was last handed a wake, while that is less than `wakeInterval` ago.
    private var lastWake: [Key: ContinuousClock.Instant] = [:]
    /// The same wakes in the order they were handed out. The interval is the same for all, so this is also
    /// the order in which members become free again: no sorting needed to find the next.
    private var recentWakes = CircularBuffer<(key: Key, at: ContinuousClock.Instant)>()
    private var finishing = false

    init(queueLimit: Int = 50_000, maxInFlight: Int = 1_000, wakeInterval: Duration = .seconds(1),
         maxWakeAge: Duration = .seconds(90)) {
        precondition(queueLimit > 0 && maxInFlight > 0 && wakeInterval >= .zero && maxWakeAge > .zero)
        self.queueLimit = queueLimit
        self.maxInFlight = maxInFlight
        self.wakeInterval = wakeInterval
        self.maxWakeAge = maxWakeAge
    }

    /// How many wakes were dropped for their age since the last call.
    mutating func takeStale() -> Int {
        defer { stale = 0 }
        return stale
    }

    /// Members with a job waiting (ready or held).
    var waitingCount: Int { waiting.count }
    var inFlightCount: Int { inFlight.count }

    mutating func enqueue(_ job: Job, now: ContinuousClock.Instant) -> Enqueued {
        guard !finishing else { return .closed }
        let key = job.key
        if let current = waiting[key] {
            if current.job.isLeave && !job.isLeave { return .superfluous }
            waiting[key]!.job = job
            waiting[key]!.queuedAt = now
            if current.state == .held { release(key, now: now) }
            return .replaced
        }
        guard waiting.count < queueLimit || job.isLeave else { return .full }
        waiting[key] = (job, .held, now)
        heldCount += 1
        release(key, now: now)
        return .queued
    }

    /// The next job to start, or what to wait for. A job handed out counts as in flight until `complete`.
    mutating func next(now: ContinuousClock.Instant) -> Next {
        expireWakes(now: now)
        guard inFlight.count < maxInFlight else { return .busy }
        while let key = ready.popFirst() {
            // A key leaves `ready` only here, and enters it only when its job turns ready, so this holds;
            // the guard keeps a broken invariant from handing out the wrong job.
            guard let entry = waiting[key], entry.state == .ready else { continue }
            waiting[key] = nil
            if !entry.job.isLeave && !finishing && now - entry.queuedAt > maxWakeAge {
                stale += 1
                continue
            }
            inFlight.insert(key)
            if !entry.job.isLeave && wakeInterval > .zero {
                lastWake[key] = now
                recentWakes.append((key, now))
            }
            return .send(entry.job)
        }
        if finishing && waiting.isEmpty && inFlight.isEmpty { return .finished }
        // Held jobs wait for a completion (which the caller reports) or for the interval to pass.
        if heldCount > 0, let first = recentWakes.first { return .wait(until: first.at + wakeInterval) }
        return .idle
    }

    /// The push for `key`'s job has ended, however it ended.
    mutating func complete(_ key: Key, now: ContinuousClock.Instant) {
        guard inFlight.remove(key) != nil else { return }
        release(key, now: now)
    }

    /// What is already waiting still goes out, without waiting out intervals; nothing new is taken.
    mutating func finish(now: ContinuousClock.Instant) {
        finishing = true
        for key in Array(waiting.keys) { release(key, now: now) }
    }

    private mutating func expireWakes(now: ContinuousClock.Instant) {
        while let first = recentWakes.first, finishing || first.at + wakeInterval <= now {
            recentWakes.removeFirst()
            // A later wake to the same member has its own, later entry.
            guard lastWake[first.key] == first.at else { continue }
            lastWake[first.key] = nil
            release(first.key, now: now)
        }
    }

    /// Turns `key`'s held job ready if nothing holds it back any more.
    private mutating func release(_ key: Key, now: ContinuousClock.Instant) {
        guard let entry = waiting[key], entry.state == .held, !inFlight.contains(key) else { return }
        if !entry.job.isLeave && !finishing, let last = lastWake[key], now < last + wakeInterval { return }
        waiting[key]!.state = .ready
        heldCount -= 1
        ready.append(key)
    }
}
