/// Floor control for one channel, as a sans-I/O state machine after 3GPP MCPTT (TS 24.380): requests,
/// releases, disconnects and time go in; grants, denials, queue positions, revocations and "floor
/// idle" come out as events, and `nextDeadline` says when to call `handleTimeout`.
///
/// Half duplex is one talker at a time; full duplex allows up to `maxTalkers`. A higher priority
/// pre-empts a lower-priority talker (`weakestTalker` says which); equal priorities wait in a queue
/// ordered by priority, then arrival, and a full queue lets a higher priority in at its tail's expense. A talk burst has a maximum length, and a talker that disconnects keeps the floor for a
/// short grace period so that a quick reconnect (a phone changing networks) doesn't cut the burst.
/// A talker that stops sending audio without disconnecting loses the floor after `silenceLimit`.
///
/// Times are nanoseconds on any monotonic clock the caller chooses. Not Sendable by design: one
/// channel's floor belongs to one event loop or actor.
public struct FloorArbiter<Member: Hashable & Sendable> {
    public struct Configuration: Sendable, Equatable {
        /// 1 for half duplex; full-duplex channels allow more (default 4).
        public var maxTalkers: Int
        /// A burst is revoked after this long (default 60 s).
        public var maxBurst: UInt64
        /// How long a disconnected talker keeps the floor (default 2 s).
        public var disconnectGrace: UInt64
        /// Requests that find the floor busy wait in a queue of at most this many (0: deny at once).
        public var maxQueue: Int
        /// Whether a higher priority takes the floor from a lower one.
        public var preemption: Bool
        /// A talker the caller has not reported `heard` for this long loses the floor (0: never).
        /// A phone that dies, loses its network or is killed mid-burst closes nothing: its transport
        /// notices only at the idle timeout, minutes later, and until then the floor would stay held
        /// in silence. A sender keeps sending while the button is down (no DTX), so seconds of
        /// silence mean it is gone.
        public var silenceLimit: UInt64
        /// Before a burst's first audio, the silence limit is this, when shorter (0: `silenceLimit`).
        /// A client sends as soon as it is granted, so a grant that brings nothing within a couple of
        /// seconds went to a client that is gone: above all one granted from the queue, which may
        /// have died while it waited, and would hold everyone behind it in silence for the whole limit.
        public var firstAudioLimit: UInt64

        public init(maxTalkers: Int = 1, maxBurst: UInt64 = 60_000_000_000, disconnectGrace: UInt64 = 2_000_000_000,
                    maxQueue: Int = 16, preemption: Bool = true, silenceLimit: UInt64 = 0, firstAudioLimit: UInt64 = 0) {
            self.maxTalkers = max(1, maxTalkers)
            self.maxBurst = maxBurst
            self.disconnectGrace = disconnectGrace
            self.maxQueue = max(0, maxQueue)
            self.preemption = preemption
            self.silenceLimit = silenceLimit
            self.firstAudioLimit = firstAudioLimit
        }

        public static var halfDuplex: Configuration { Configuration() }
        public static func fullDuplex(maxTalkers: Int = 4) -> Configuration { Configuration(maxTalkers: maxTalkers) }
    }

    /// Why a request was denied. Raw values are TS 24.380's Floor Deny reject causes.
    public enum DenyReason: UInt8, Sendable, Equatable {
        /// Another member has the floor and the queue is off (cause 1).
        case busy = 1
        /// The member may listen but not talk (cause 5, receive only).
        case listenOnly = 5
        /// The queue is full (cause 7).
        case queueFull = 7
        /// The member was waiting in a full queue and gave its place up to a request of higher
        /// priority. Not a TS 24.380 cause: it goes to the member as `queueFull`, with its own words.
        case outranked = 107
    }

    /// Why the floor was taken away from a talker.
    public enum RevokeReason: Sendable, Equatable {
        /// A member with a higher priority asked for it.
        case preempted(by: Member, priority: UInt8)
        /// The burst reached the channel's maximum length.
        case maxBurstReached
        /// The talker stayed disconnected past the grace period.
        case disconnected
        /// The talker joined again with a token that does not allow talking (`rightsChanged`).
        case notAllowed
        /// The channel now allows fewer simultaneous talkers (an administrator switched it from full to
        /// half duplex), and this talker was the weakest: disconnected, or the lowest priority, then the most recently granted.
        case channelChanged
        /// Nothing was heard from the talker for `silenceLimit` while its connection still seemed up.
        case silent
    }

    public enum Event: Sendable, Equatable {
        /// `member` may talk now; `burst` numbers the talk burst (for the catch-up buffer and the log),
        /// and `until` is when it will be revoked for length.
        case granted(Member, burst: UInt64, until: UInt64)
        /// The talker asked again (its grant was lost, or it rejoined within the grace period): the
        /// same burst goes on; tell the talker again, nobody else.
        case confirmed(Member, burst: UInt64, until: UInt64)
        /// Tell everyone else who is talking.
        case taken(by: Member, burst: UInt64, priority: UInt8)
        case denied(Member, DenyReason)
        /// Waiting, at `position` (1 is next). Sent for every waiting member whenever the queue changes.
        case queued(Member, position: Int)
        case revoked(Member, RevokeReason)
        /// The talker finished (released, revoked or gone); `duration` is how long it held the floor.
        case ended(Member, burst: UInt64, duration: UInt64)
        /// Nobody is talking.
        case idle
    }

    // Visible to inlinable code: the calls made for every talker packet (`burst(of:)`, `heard`) are
    // inlined into the caller and specialised for its member type. Unspecialised, their generic
    // comparisons and metadata lookups were 5 % of the relay's CPU at 20 listeners.
    @usableFromInline
    struct Talker: Equatable {
        @usableFromInline var member: Member
        var priority: UInt8
        @usableFromInline var burst: UInt64
        var since: UInt64
        var disconnectedAt: UInt64?
        /// When the talker was last heard (audio in its burst), or granted, confirmed or back.
        @usableFromInline var lastHeard: UInt64
        /// Whether any audio of the burst has been heard (`Configuration.firstAudioLimit`).
        @usableFromInline var heardAudio = false
    }

    struct Waiting: Equatable {
        var member: Member
        var priority: UInt8
        var order: UInt64
    }

    /// May change while the floor is in use (an admin edits the channel's maximum burst): the new
    /// values apply from the next command or timeout.
    public var configuration: Configuration
    @usableFromInline var talkers: [Talker] = []
    var queue: [Waiting] = []
    var nextBurst: UInt64 = 1
    var arrivals: UInt64 = 0
    var pending: [Event] = []

    /// - Parameter firstBurst: the number of the first burst granted; each grant after it takes the next.
    public init(configuration: Configuration = .halfDuplex, firstBurst: UInt64 = 1) {
        self.configuration = configuration
        nextBurst = firstBurst
    }

    /// Members holding the floor, oldest grant first.
    public var currentTalkers: [Member] { talkers.map(\.member) }
    /// Members waiting, next first.
    public var queuedMembers: [Member] { queue.map(\.member) }

    /// Whether audio from `member` is relayed. Audio from anyone else is dropped.
    @inlinable
    public func mayTalk(_ member: Member) -> Bool { talkers.contains { $0.member == member } }

    /// The burst `member` is talking in, if any.
    @inlinable
    public func burst(of member: Member) -> UInt64? { talkers.first { $0.member == member }?.burst }
    /// When `member`'s burst will be revoked for length (nil: it holds no floor).
    public func burstDeadline(of member: Member) -> UInt64? {
        talkers.first { $0.member == member }.map { $0.since + configuration.maxBurst }
    }

    /// Events produced by the last commands, in order; the caller sends them on.
    public mutating func takeEvents() -> [Event] {
        defer { pending.removeAll(keepingCapacity: true) }
        return pending
    }

    // MARK: Commands

    /// A floor request (the user pressed the talk button). `canTalk` is the member's `talk`
    /// capability from its token; `priority` 0–255 comes from the token too. `mayQueue` false: a
    /// request that can't be granted now (no free slot, nobody to pre-empt) is denied `busy` rather
    /// than queued, so that it takes nobody's place in a full queue (a one-shot announcement that
    /// would give up at once anyway).
    public mutating func request(_ member: Member, priority: UInt8, canTalk: Bool, mayQueue: Bool = true, now: UInt64) {
        guard canTalk else { pending.append(.denied(member, .listenOnly)); return }
        if let index = talkers.firstIndex(where: { $0.member == member }) {
            // A repeated request (the grant was lost): confirm, and a reconnect ends the grace.
            talkers[index].disconnectedAt = nil
            talkers[index].lastHeard = max(talkers[index].lastHeard, now)
            let talker = talkers[index]
            pending.append(.confirmed(member, burst: talker.burst, until: talker.since + configuration.maxBurst))
            return
        }
        if let position = queue.firstIndex(where: { $0.member == member }) {
            // Asked again while waiting: its place, to it alone, unless a higher priority moves it
            // (then everyone waiting learns theirs). Telling everyone each time let one member's
            // repeated requests send a message to every waiting member.
            guard priority > queue[position].priority else {
                pending.append(.queued(member, position: position + 1))
                return
            }
            queue[position].priority = priority
            reorderQueue()
            return
        }
        if talkers.count < configuration.maxTalkers {
            grant(member, priority: priority, now: now)
            return
        }
        if configuration.preemption, let weakest = weakestTalker(below: priority) {
            let loser = talkers.remove(at: weakest)
            pending.append(.revoked(loser.member, .preempted(by: member, priority: priority)))
            pending.append(.ended(loser.member, burst: loser.burst, duration: now - loser.since))
            grant(member, priority: priority, now: now)
            return
        }
        guard configuration.maxQueue > 0, mayQueue else { pending.append(.denied(member, .busy)); return }
        if queue.count >= configuration.maxQueue {
            // The queue is ordered by priority, so admission to it is too: a dispatcher must not be
            // locked out by a full queue of members who would wait behind it. The last waiting member
            // (lowest priority, latest arrival) gives up its place if the newcomer outranks it.
            guard let last = queue.last, last.priority < priority else { pending.append(.denied(member, .queueFull)); return }
            queue.removeLast()
            pending.append(.denied(last.member, .outranked))
        }
        arrivals += 1
        queue.append(Waiting(member: member, priority: priority, order: arrivals))
        reorderQueue()
    }

    /// The talker let go of the button, or a queued member gave up.
    public mutating func release(_ member: Member, now: UInt64) {
        if let index = talkers.firstIndex(where: { $0.member == member }) {
            let talker = talkers.remove(at: index)
            pending.append(.ended(member, burst: talker.burst, duration: now - talker.since))
            refill(now: now)
        } else if let index = queue.firstIndex(where: { $0.member == member }) {
            queue.remove(at: index)
            reorderQueue()
        }
    }

    /// The member's connection went away. A talker keeps the floor for the grace period; a queued
    /// member leaves the queue.
    public mutating func disconnected(_ member: Member, now: UInt64) {
        if let index = talkers.firstIndex(where: { $0.member == member }) {
            talkers[index].disconnectedAt = now
        } else if let index = queue.firstIndex(where: { $0.member == member }) {
            queue.remove(at: index)
            reorderQueue()
        }
    }

    /// The member joined again with another token (new capabilities or priority) while holding or
    /// waiting for the floor. Without `talk` it loses the floor (revoked, `.notAllowed`) or its place in
    /// the queue (denied, `.listenOnly`): rights are the token's, not the connection's. A new priority
    /// applies to what it holds from now on, for pre-emption and the queue's order.
    public mutating func rightsChanged(_ member: Member, priority: UInt8, canTalk: Bool, now: UInt64) {
        if let index = talkers.firstIndex(where: { $0.member == member }) {
            guard !canTalk else {
                talkers[index].priority = priority
                preemptForQueueHead(now: now)
                return
            }
            let talker = talkers.remove(at: index)
            pending.append(.revoked(member, .notAllowed))
            pending.append(.ended(member, burst: talker.burst, duration: now - talker.since))
            refill(now: now)
        } else if let index = queue.firstIndex(where: { $0.member == member }) {
            if canTalk {
                guard queue[index].priority != priority else { return }
                queue[index].priority = priority
            } else {
                queue.remove(at: index)
                pending.append(.denied(member, .listenOnly))
            }
            reorderQueue()
            preemptForQueueHead(now: now)
        }
    }

    /// After a priority changed: a waiting member that now outranks the weakest talker takes the
    /// floor from it, as a new request with that priority would have.
    mutating func preemptForQueueHead(now: UInt64) {
        guard configuration.preemption, talkers.count >= configuration.maxTalkers, let head = queue.first,
              let weakest = weakestTalker(below: head.priority) else { return }
        queue.removeFirst()
        let loser = talkers.remove(at: weakest)
        pending.append(.revoked(loser.member, .preempted(by: head.member, priority: head.priority)))
        pending.append(.ended(loser.member, burst: loser.burst, duration: now - loser.since))
        grant(head.member, priority: head.priority, now: now)
        reorderQueue()
    }

    /// Replaces the configuration while the floor may be in use (an administrator edited the channel).
    /// A new maximum burst applies to the talkers already granted. If fewer talkers are allowed now,
    /// the weakest lose the floor (disconnected ones first, then the lowest priority, then the most
    /// recently granted: the conversation already under way carries on); if more are, waiting members are granted; a shorter queue denies
    /// its tail.
    public mutating func reconfigure(_ new: Configuration, now: UInt64) {
        configuration = new
        while talkers.count > new.maxTalkers, let weakest = weakestTalker(below: nil) {
            let loser = talkers.remove(at: weakest)
            pending.append(.revoked(loser.member, .channelChanged))
            pending.append(.ended(loser.member, burst: loser.burst, duration: now - loser.since))
        }
        if queue.count > new.maxQueue {
            for waiting in queue[new.maxQueue...] { pending.append(.denied(waiting.member, .queueFull)) }
            queue.removeSubrange(new.maxQueue...)
            reorderQueue()
        }
        // After trimming, the floor is full (nothing to grant, nobody to tell it is idle); otherwise
        // there may be room for waiting members.
        if talkers.count < new.maxTalkers && !queue.isEmpty { refill(now: now) }
    }

    /// The member is back (fast resume): a talker in its grace period carries on, and has a whole
    /// `silenceLimit` to send again.
    public mutating func reconnected(_ member: Member, now: UInt64) {
        if let index = talkers.firstIndex(where: { $0.member == member }) {
            talkers[index].disconnectedAt = nil
            talkers[index].lastHeard = max(talkers[index].lastHeard, now)
        }
    }

    /// Audio of `member`'s burst arrived: it is still there (`silenceLimit`). Called for every talker
    /// packet, so it only stores a time; `talkers` holds at most `maxTalkers` entries.
    @inlinable
    public mutating func heard(_ member: Member, now: UInt64) {
        for index in talkers.indices where talkers[index].member == member {
            talkers[index].lastHeard = now
            talkers[index].heardAudio = true
            return
        }
    }

    // MARK: Time

    public var nextDeadline: UInt64? {
        talkers.map { talker in
            let end = talker.since + configuration.maxBurst
            if let gone = talker.disconnectedAt { return min(end, gone + configuration.disconnectGrace) }
            return configuration.silenceLimit > 0 ? min(end, talker.lastHeard + silenceLimit(of: talker)) : end
        }.min()
    }

    /// How long `talker` may stay silent now: shorter before its first audio (`firstAudioLimit`).
    func silenceLimit(of talker: Talker) -> UInt64 {
        guard !talker.heardAudio, configuration.firstAudioLimit > 0 else { return configuration.silenceLimit }
        return min(configuration.silenceLimit, configuration.firstAudioLimit)
    }

    public mutating func handleTimeout(now: UInt64) {
        var changed = false
        var index = 0
        while index < talkers.count {
            let talker = talkers[index]
            let reason: RevokeReason?
            if now >= talker.since + configuration.maxBurst {
                reason = .maxBurstReached
            } else if let gone = talker.disconnectedAt {
                reason = now >= gone + configuration.disconnectGrace ? .disconnected : nil
            } else if configuration.silenceLimit > 0, now >= talker.lastHeard + silenceLimit(of: talker) {
                reason = .silent
            } else {
                reason = nil
            }
            if let reason {
                talkers.remove(at: index)
                pending.append(.revoked(talker.member, reason))
                pending.append(.ended(talker.member, burst: talker.burst, duration: now - talker.since))
                changed = true
            } else {
                index += 1
            }
        }
        if changed { refill(now: now) }
    }

    // MARK: Internals

    mutating func grant(_ member: Member, priority: UInt8, now: UInt64) {
        let burst = nextBurst
        nextBurst += 1
        talkers.append(Talker(member: member, priority: priority, burst: burst, since: now, lastHeard: now))
        pending.append(.granted(member, burst: burst, until: now + configuration.maxBurst))
        pending.append(.taken(by: member, burst: burst, priority: priority))
    }

    /// After a talker left: grant the queue's head while there is room, else report idle.
    mutating func refill(now: UInt64) {
        var granted = false
        while talkers.count < configuration.maxTalkers, !queue.isEmpty {
            let next = queue.removeFirst()
            grant(next.member, priority: next.priority, now: now)
            granted = true
        }
        if granted { reorderQueue() }
        if talkers.isEmpty { pending.append(.idle) }
    }

    /// The talker to lose the floor when one must (pre-emption, fewer talkers allowed), among those
    /// with a priority below `priority` (any, if nil). A talker whose connection is gone goes first:
    /// cutting off someone who is talking instead would leave the floor idle anyway once its grace
    /// runs out. Then the lowest priority, then the most recently granted, so that the conversation
    /// already under way carries on.
    func weakestTalker(below priority: UInt8?) -> Int? {
        func rank(_ i: Int) -> (Int, UInt8) { (talkers[i].disconnectedAt == nil ? 1 : 0, talkers[i].priority) }
        return talkers.indices.lazy.filter { i in priority.map { talkers[i].priority < $0 } ?? true }.min { a, b in
            rank(a) != rank(b) ? rank(a) < rank(b) : talkers[a].since > talkers[b].since
        }
    }

    /// Keeps the queue ordered (priority, then arrival) and reports every position.
    mutating func reorderQueue() {
        queue.sort { ($0.priority, $1.order) > ($1.priority, $0.order) }
        for (index, waiting) in queue.enumerated() { pending.append(.queued(waiting.member, position: index + 1)) }
    }
}
