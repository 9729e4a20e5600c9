// A jitter buffer for one listener's push-to-talk audio.
//
// Why our own and not speexdsp's: speex starts every talk spurt with no buffering (a glitch at every
// key press), can't show the caller packet n+1 when n is missing (which Opus FEC needs), and hides its
// tuning. PTT speech comes in bursts with silence between them, so this buffer adapts only at burst
// starts and never time-stretches: a new target costs nothing when nobody is talking.
//
// Sans-I/O: time is a number the caller passes in, payloads are bytes, and the caller decodes. The
// playout clock (the audio output's blocking writes) asks for one decision per 20 ms frame.
//
// Catch-up: a listener woken by a push gets the burst from its first packet at network speed, then the
// live rest. Such a burst is played whole and in order, however far behind live that puts it, because
// the point of waking is to hear the first words; its ring grows up to `maxBacklogFrames`.

/// Tuning, with the numbers from the design: 60 ms to start, 40-200 ms, a 32-frame live window.
public struct JitterBufferConfiguration: Sendable, Equatable {
    public var frameNanoseconds: UInt64 = 20_000_000
    /// Frames a live burst may run ahead of playout before the buffer skips forward.
    public var liveWindowFrames = 32
    public var initialTargetMilliseconds = 60
    /// One frame of jitter plus one of lookahead, so that FEC has packet n+1 when n is due.
    public var minimumTargetMilliseconds = 40
    public var maximumTargetMilliseconds = 200
    /// The longest catch-up backlog: 60 s, the server's default maximum burst. A channel may allow
    /// up to 600 s; a joiner more than 60 s into such a burst hears its first 60 s, then a gap. (Slots
    /// are `maxPayloadBytes` wide, so ten times this would be 36 MB.)
    public var maxBacklogFrames = 3_000
    /// Missing frames in a row after which concealment turns to silence (it starts to sound synthetic).
    public var concealmentLimitFrames = 10
    /// Without a packet for this long and no end marker, the burst is over.
    public var burstTimeoutNanoseconds: UInt64 = 1_000_000_000
    /// The largest Opus payload accepted.
    public var maxPayloadBytes = 1_100

    public init() {}
}

/// What became of an arriving packet.
public enum ArrivalOutcome: Sendable, Equatable {
    case accepted
    /// Accepted, and it started a new burst.
    case newBurst
    /// Its frame was already played or skipped.
    case late
    case duplicate
    /// A live burst ran more than the window ahead: older frames were dropped to catch up.
    case resynced
    /// The catch-up backlog is full.
    case backlogFull
    /// Of a later burst, arrived while a catch-up burst is still being played: kept, and played
    /// after it (from its first frame) instead of cutting it short.
    case deferred
    /// Too large to be one of our frames.
    case malformed
}

public enum BurstEndReason: Sendable, Equatable {
    case endOfBurst
    case timeout
    /// Another burst (or talker) arrived before this one finished.
    case superseded
}

/// How one received burst went.
public struct BurstStatistics: Sendable, Equatable {
    public var slot: UInt16
    public var burst: UInt16
    /// Distinct frames that arrived in time or late (not duplicates).
    public var received = 0
    public var late = 0
    public var duplicates = 0
    /// Frames that never arrived by their turn (recovered with FEC, concealed or skipped), counting only
    /// frames known to exist: ones before a frame that did arrive.
    public var lost = 0
    public var fecRecovered = 0
    /// Frames made up by concealment (PLC), underruns included.
    public var concealed = 0
    /// Concealed frames played while waiting for late packets (each adds 20 ms of delay).
    public var underruns = 0
    public var silenceFrames = 0
    public var resyncs = 0
    /// Frames that arrived but were never played: dropped when this listener had fallen so far
    /// behind live speech that it skipped ahead (a stalled or overloaded device), or still buffered
    /// when another burst replaced this one. Not loss on the way: this end could not keep up.
    public var skipped = 0
    public var catchUpFrames = 0
    /// Frames decoded from their own packet.
    public var played = 0
    /// RFC 3550 interarrival jitter over live packets.
    public var jitterMilliseconds = 0.0
    /// The target delay used, after any growth within the burst.
    public var targetDelayMilliseconds = 0
    /// Frames waiting now.
    public var bufferedFrames = 0

    public init(slot: UInt16, burst: UInt16) {
        self.slot = slot
        self.burst = burst
    }

    /// The burst's frames as far as this listener knows them: played from their own packet, lost
    /// (then recovered with FEC, concealed or skipped over), or received and skipped. Not
    /// `concealed`: an underrun's concealment is a frame of waiting, not one of the talker's, and
    /// counting it says 239 for a 238-frame burst. (Without `skipped`, a listener that fell behind
    /// reported a 300-frame burst as "149 frames, 0 lost".)
    public var framesDue: Int { played + lost + skipped }

    /// Lost frames over frames due: what a listener missed, before FEC.
    public var lossFraction: Double { framesDue == 0 ? 0 : Double(lost) / Double(framesDue) }
}

/// A buffered frame handed to the caller; valid until the next mutating call.
public struct FrameRef: Sendable, Equatable {
    public let sequence: UInt16
    let index: Int
    let count: Int
}

public enum PlayoutDecision: Sendable, Equatable {
    /// No burst.
    case idle
    /// A burst is buffering up to its start time.
    case waiting
    case play(FrameRef)
    /// The frame is missing but the next one is here: decode its FEC data (it stays for its own turn).
    case recoverWithFEC(next: FrameRef)
    case conceal
    case silence
    /// The burst is over; reported once. The caller resets its decoder.
    case ended(BurstStatistics, BurstEndReason)
}

public struct JitterBuffer: Sendable {
    public let configuration: JitterBufferConfiguration

    struct Slot: Sendable {
        var sequence: UInt16 = 0
        var filled = false
        var count = 0
    }

    struct Burst: Sendable {
        var stats: BurstStatistics
        var catchUp: Bool
        var nextToPlay: UInt16
        var startTime: UInt64
        var started = false
        var targetMilliseconds: Int
        /// The first sequence that is not a frame (the end marker's, or one past a last frame carrying END).
        var endSequence: UInt16?
        var lastArrival: UInt64
        /// The newest sequence received: a missing frame before it was lost; one after it may never have
        /// existed (the talker stopped and the end marker was lost), so it is not counted as lost.
        var highest: UInt16
        var consecutiveMisses = 0
        // Estimator and jitter reference for live packets.
        var firstLive: (arrival: UInt64, sequence: UInt16)?
        var previousLive: (arrival: UInt64, sequence: UInt16)?
    }

    private var slots: [Slot]
    private var storage: [UInt8]
    private var burst: Burst?
    private var pendingEnd: (BurstStatistics, BurstEndReason)?
    /// Packets of later bursts that arrived while a catch-up burst was playing, in arrival order,
    /// their payloads one after another in `deferredBytes`. A listener that is behind hears every
    /// burst whole, one after the other; a live listener still switches to a new burst at once.
    private var deferred: [DeferredPacket] = []
    private var deferredBytes: [UInt8] = []
    /// The bursts (`burstID`) among `deferred`, so that a caller can keep a burst's later
    /// packets on the buffer that holds its first ones.
    private var deferredBursts: [UInt32] = []

    struct DeferredPacket {
        var slot: UInt16
        var burst: UInt16
        var sequence: UInt16
        var endOfBurst: Bool
        var offset: Int
        var count: Int
    }
    /// Bursts that ended lately, so that their stragglers (repeated end markers) don't start them again.
    private var finished: [UInt32] = []
    // Delay histogram: 10 ms buckets to 500 ms, kept across bursts with forgetting.
    private var histogram = [Double](repeating: 0, count: 50)
    private var histogramWeight = 0.0
    private var recentDelays = [Int64](repeating: .max, count: 128)
    private var recentIndex = 0

    public init(configuration: JitterBufferConfiguration = JitterBufferConfiguration()) {
        self.configuration = configuration
        let size = Self.powerOfTwo(atLeast: configuration.liveWindowFrames)
        slots = [Slot](repeating: Slot(), count: size)
        storage = [UInt8](repeating: 0, count: size * configuration.maxPayloadBytes)
    }

    static func powerOfTwo(atLeast n: Int) -> Int {
        var size = 1
        while size < n { size <<= 1 }
        return size
    }

    static func distance(_ from: UInt16, _ to: UInt16) -> Int { Int(Int16(bitPattern: to &- from)) }

    // MARK: Reading

    public var current: BurstStatistics? {
        guard var stats = burst?.stats else { return nil }
        stats.bufferedFrames = bufferedFrames
        return stats
    }

    public var activeSlot: UInt16? { burst?.stats.slot }

    /// The burst being played: its talker's slot, its number, and whether it began as catch-up. No
    /// counting, unlike `current`, so the playout loop can ask every tick.
    public var playing: (slot: UInt16, burst: UInt16, catchUp: Bool)? {
        burst.map { ($0.stats.slot, $0.stats.burst, $0.catchUp) }
    }

    /// Whether the burst being played is a catch-up whose end is known: a burst that ended before
    /// this listener caught up, which later bursts are best played after (JitterBuffer defers them).
    public var isReplayingAnEndedBurst: Bool { burst.map { $0.catchUp && $0.endSequence != nil } ?? false }

    /// One number for a burst of a talker, as the buffer keeps the bursts it has finished or holds.
    public static func burstID(slot: UInt16, burst: UInt16) -> UInt32 { UInt32(slot) << 16 | UInt32(burst) }

    /// Whether this buffer plays that burst or holds its packets behind the one it plays: where the
    /// burst's later packets belong.
    public func holds(slot: UInt16, burst number: UInt16) -> Bool {
        if let burst, burst.stats.slot == slot, burst.stats.burst == number { return true }
        return deferredBursts.contains(Self.burstID(slot: slot, burst: number))
    }

    /// Whether this buffer ended that burst lately: its stragglers (repeated end markers) must not
    /// start it again, here or on another buffer.
    public func hasFinished(slot: UInt16, burst number: UInt16) -> Bool {
        finished.contains(Self.burstID(slot: slot, burst: number))
    }

    /// Whether the burst being played has its end marker: it will finish on its own.
    public var endKnown: Bool { burst?.endSequence != nil }

    /// The target the next burst would start with (or the current burst's, grown).
    public var currentTargetMilliseconds: Int { burst?.targetMilliseconds ?? estimatedTarget }

    var bufferedFrames: Int { slots.reduce(0) { $0 + ($1.filled ? 1 : 0) } }

    public func withPayload<R>(of frame: FrameRef, _ body: (UnsafeRawBufferPointer) throws -> R) rethrows -> R {
        try storage.withUnsafeBytes { try body(UnsafeRawBufferPointer(rebasing: $0[frame.index * configuration.maxPayloadBytes ..< frame.index * configuration.maxPayloadBytes + frame.count])) }
    }

    /// Drops everything buffered (leaving a channel); the delay history stays. The bursts that ended
    /// are forgotten too: another channel numbers its bursts its own way. (A rejoin after a server
    /// restart keeps them: the server starts each channel's numbering at random, protocol §16.4.1.)
    public mutating func reset() {
        for i in slots.indices { slots[i].filled = false }
        burst = nil
        pendingEnd = nil
        finished.removeAll()
        deferred.removeAll()
        deferredBytes.removeAll()
        deferredBursts.removeAll()
    }

    // MARK: Arrivals

    public mutating func insert(slot: UInt16, burst number: UInt16, sequence: UInt16, endOfBurst: Bool, catchUp: Bool,
                                payload: UnsafeRawBufferPointer, now: UInt64) -> ArrivalOutcome {
        guard payload.count <= configuration.maxPayloadBytes else { return .malformed }
        let id = Self.burstID(slot: slot, burst: number)
        var outcome = ArrivalOutcome.accepted
        if burst == nil || burst!.stats.slot != slot || burst!.stats.burst != number {
            if finished.contains(id) { return .late }
            if let old = burst, old.catchUp {
                // Behind already: this burst waits its turn rather than cut the one being caught up.
                guard deferred.count < configuration.maxBacklogFrames else { return .backlogFull }
                deferred.append(DeferredPacket(slot: slot, burst: number, sequence: sequence, endOfBurst: endOfBurst,
                                               offset: deferredBytes.count, count: payload.count))
                deferredBytes.append(contentsOf: payload)
                if !deferredBursts.contains(id) { deferredBursts.append(id) }
                return .deferred
            }
            if let old = burst { finish(old, reason: old.endSequence != nil ? .endOfBurst : .superseded, now: now) }
            start(slot: slot, burst: number, sequence: sequence, catchUp: catchUp, now: now)
            outcome = .newBurst
        }
        var b = burst!
        defer { burst = b }
        b.lastArrival = now
        if Self.distance(b.highest, sequence) > 0 { b.highest = sequence }
        if !catchUp { observe(&b, sequence: sequence, now: now) }

        if endOfBurst {
            let end = payload.isEmpty ? sequence : sequence &+ 1
            if let known = b.endSequence, known == end { b.stats.duplicates += 1; return .duplicate }
            b.endSequence = end
            if payload.isEmpty { return outcome }
        }
        var ahead = Self.distance(b.nextToPlay, sequence)
        if ahead < 0 {
            // Before playout starts, an early frame that arrived second still gets its turn.
            if !b.started && -ahead < slots.count - bufferedFrames {
                b.nextToPlay = sequence
                ahead = 0
            } else {
                b.stats.late += 1
                b.stats.received += 1
                return .late
            }
        }
        if ahead >= slots.count {
            if b.catchUp {
                guard ahead < configuration.maxBacklogFrames else { b.stats.lost += 1; return .backlogFull }
                grow(toHold: ahead + 1)
            } else {
                // Live and too far behind: skip to this frame, dropping what is older, so that the
                // listener is back to live speech instead of a growing backlog.
                let newNext = sequence
                var missing = 0, dropped = 0
                var s = b.nextToPlay
                while Self.distance(s, newNext) > 0 {
                    let i = Int(s) & (slots.count - 1)
                    if slots[i].filled && slots[i].sequence == s {
                        slots[i].filled = false
                        dropped += 1
                    } else {
                        missing += 1
                    }
                    s &+= 1
                }
                b.stats.lost += missing
                b.stats.skipped += dropped
                b.stats.resyncs += 1
                b.nextToPlay = newNext
                outcome = .resynced
            }
        }
        let index = Int(sequence) & (slots.count - 1)
        if slots[index].filled && slots[index].sequence == sequence {
            b.stats.duplicates += 1
            return .duplicate
        }
        slots[index] = Slot(sequence: sequence, filled: true, count: payload.count)
        storage.withUnsafeMutableBytes { bytes in
            let base = index * configuration.maxPayloadBytes
            UnsafeMutableRawBufferPointer(rebasing: bytes[base ..< base + payload.count]).copyMemory(from: payload)
        }
        b.stats.received += 1
        if catchUp { b.stats.catchUpFrames += 1 }
        return outcome
    }

    private mutating func start(slot: UInt16, burst number: UInt16, sequence: UInt16, catchUp: Bool, now: UInt64) {
        for i in slots.indices { slots[i].filled = false }
        let target = estimatedTarget
        var stats = BurstStatistics(slot: slot, burst: number)
        stats.targetDelayMilliseconds = target
        burst = Burst(stats: stats, catchUp: catchUp, nextToPlay: sequence,
                      startTime: catchUp ? now : now + UInt64(target) * 1_000_000,
                      targetMilliseconds: target, lastArrival: now, highest: sequence)
    }

    private mutating func grow(toHold frames: Int) {
        let size = Self.powerOfTwo(atLeast: frames)
        guard size > slots.count else { return }
        var newSlots = [Slot](repeating: Slot(), count: size)
        var newStorage = [UInt8](repeating: 0, count: size * configuration.maxPayloadBytes)
        let width = configuration.maxPayloadBytes
        for (old, slot) in slots.enumerated() where slot.filled {
            let index = Int(slot.sequence) & (size - 1)
            newSlots[index] = slot
            for k in 0..<slot.count { newStorage[index * width + k] = storage[old * width + k] }
        }
        slots = newSlots
        storage = newStorage
    }

    /// Feeds the delay estimator and the RFC 3550 jitter figure with one live arrival.
    private mutating func observe(_ b: inout Burst, sequence: UInt16, now: UInt64) {
        let frame = Int64(configuration.frameNanoseconds)
        if let previous = b.previousLive {
            let transit = Int64(bitPattern: now &- previous.arrival) - Int64(Self.distance(previous.sequence, sequence)) * frame
            let d = Double(abs(transit)) / 1e6
            b.stats.jitterMilliseconds += (d - b.stats.jitterMilliseconds) / 16
        }
        b.previousLive = (now, sequence)
        guard let first = b.firstLive else {
            b.firstLive = (now, sequence)
            record(delay: 0)
            return
        }
        let relative = Int64(bitPattern: now &- first.arrival) - Int64(Self.distance(first.sequence, sequence)) * frame
        record(delay: relative)
    }

    private mutating func record(delay: Int64) {
        recentDelays[recentIndex] = delay
        recentIndex = (recentIndex + 1) & (recentDelays.count - 1)
        // Delay over the fastest packet of the last ~2.5 s (128 frames): a base that slowly follows
        // the path, so a changed route doesn't count as jitter forever.
        let base = recentDelays.min() ?? 0
        let bucket = min(histogram.count - 1, max(0, Int((delay - base) / 10_000_000)))
        for i in histogram.indices { histogram[i] *= 0.99 }
        histogramWeight = histogramWeight * 0.99 + 1
        histogram[bucket] += 1
    }

    /// P95 of the delay history plus one frame of FEC lookahead, rounded up to whole frames.
    var estimatedTarget: Int {
        guard histogramWeight >= 10 else { return configuration.initialTargetMilliseconds }
        var cumulative = 0.0
        var p95 = histogram.count - 1
        for (i, weight) in histogram.enumerated() {
            cumulative += weight
            if cumulative >= 0.95 * histogramWeight { p95 = i; break }
        }
        let frameMs = Int(configuration.frameNanoseconds / 1_000_000)
        let raw = (p95 + 1) * 10 + frameMs
        let rounded = (raw + frameMs - 1) / frameMs * frameMs
        return min(configuration.maximumTargetMilliseconds, max(configuration.minimumTargetMilliseconds, rounded))
    }

    // MARK: Playout

    public mutating func nextFrame(now: UInt64) -> PlayoutDecision {
        if let (stats, reason) = pendingEnd {
            pendingEnd = nil
            return .ended(stats, reason)
        }
        guard var b = burst else { return .idle }
        // A catch-up burst arrives faster than it plays: its last packet can be long past while
        // frames are still waiting, and those are played before it may time out.
        if b.endSequence == nil && now > b.lastArrival + configuration.burstTimeoutNanoseconds
            && !(b.catchUp && slots.contains { $0.filled }) {
            finish(b, reason: .timeout, now: now)
            return takeEnd()
        }
        if let end = b.endSequence, Self.distance(b.nextToPlay, end) <= 0 {
            finish(b, reason: .endOfBurst, now: now)
            return takeEnd()
        }
        if !b.started {
            guard now >= b.startTime else { burst = b; return .waiting }
            b.started = true
        }
        defer { burst = b }
        let mask = slots.count - 1
        if b.catchUp, b.consecutiveMisses >= configuration.concealmentLimitFrames,
           now > b.lastArrival + configuration.burstTimeoutNanoseconds {
            // A catch-up burst no longer arriving, with a gap before the frames it still holds: skip
            // the gap instead of playing silence through it (a stray frame far ahead could otherwise
            // hold playout, and every burst waiting behind it, for a minute).
            var nearest: UInt16?
            for slot in slots where slot.filled && Self.distance(b.nextToPlay, slot.sequence) > 0 {
                if nearest.map({ Self.distance(b.nextToPlay, slot.sequence) < Self.distance(b.nextToPlay, $0) }) ?? true {
                    nearest = slot.sequence
                }
            }
            if let nearest {
                b.stats.lost += Self.distance(b.nextToPlay, nearest)
                b.nextToPlay = nearest
                b.consecutiveMisses = 0
            }
        }
        let n = b.nextToPlay
        let index = Int(n) & mask
        if slots[index].filled && slots[index].sequence == n {
            slots[index].filled = false
            b.nextToPlay &+= 1
            b.consecutiveMisses = 0
            b.stats.played += 1
            return .play(FrameRef(sequence: n, index: index, count: slots[index].count))
        }
        b.consecutiveMisses += 1
        let nextIndex = Int(n &+ 1) & mask
        if slots[nextIndex].filled && slots[nextIndex].sequence == n &+ 1, slots[nextIndex].count > 0 {
            b.nextToPlay &+= 1
            b.stats.lost += 1
            b.stats.fecRecovered += 1
            return .recoverWithFEC(next: FrameRef(sequence: n &+ 1, index: nextIndex, count: slots[nextIndex].count))
        }
        let anythingLater = slots.contains { $0.filled }
        if !anythingLater && b.targetMilliseconds < configuration.maximumTargetMilliseconds
            && b.consecutiveMisses <= configuration.concealmentLimitFrames {
            // Underrun: the packets are late, not lost. Wait one more frame for them, and keep that
            // extra frame of delay for the rest of the burst.
            b.targetMilliseconds += Int(configuration.frameNanoseconds / 1_000_000)
            b.stats.targetDelayMilliseconds = b.targetMilliseconds
            b.stats.concealed += 1
            b.stats.underruns += 1
            return .conceal
        }
        b.nextToPlay &+= 1
        if Self.distance(n, b.highest) > 0 { b.stats.lost += 1 }
        if b.consecutiveMisses > configuration.concealmentLimitFrames {
            b.stats.silenceFrames += 1
            return .silence
        }
        b.stats.concealed += 1
        return .conceal
    }

    private mutating func finish(_ b: Burst, reason: BurstEndReason, now: UInt64) {
        var stats = b.stats
        stats.bufferedFrames = 0
        // Frames still waiting when another burst replaces this one are never played.
        stats.skipped += slots.reduce(0) { $0 + ($1.filled ? 1 : 0) }
        for i in slots.indices { slots[i].filled = false }
        pendingEnd = (stats, reason)
        burst = nil
        finished.append(Self.burstID(slot: b.stats.slot, burst: b.stats.burst))
        if finished.count > 8 { finished.removeFirst() }
        guard !deferred.isEmpty else { return }
        // The next burst starts now, as catch-up: it is played whole from its first frame, with no
        // jitter cushion of its own (the listener is behind anyway). Packets of a third burst among
        // them are deferred again behind it.
        var packets: [DeferredPacket] = [], bytes: [UInt8] = []
        swap(&packets, &deferred)
        swap(&bytes, &deferredBytes)
        deferredBursts.removeAll(keepingCapacity: true)
        bytes.withUnsafeBytes { all in
            for p in packets {
                _ = insert(slot: p.slot, burst: p.burst, sequence: p.sequence, endOfBurst: p.endOfBurst, catchUp: true,
                           payload: UnsafeRawBufferPointer(rebasing: all[p.offset ..< p.offset + p.count]), now: now)
            }
        }
        if deferred.isEmpty {
            // Keep the storage for the next time.
            packets.removeAll(keepingCapacity: true)
            bytes.removeAll(keepingCapacity: true)
            deferred = packets
            deferredBytes = bytes
        }
    }

    private mutating func takeEnd() -> PlayoutDecision {
        guard let (stats, reason) = pendingEnd else { return .idle }
        pendingEnd = nil
        return .ended(stats, reason)
    }
}
