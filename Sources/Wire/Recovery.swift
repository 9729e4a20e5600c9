// Loss recovery for the application packet space (RFC 9002, with its constants). Audio is never
// retransmitted, so ACKs of datagram packets only feed the RTT estimate and loss counts; the control
// stream and a few control frames are retransmitted when lost.

/// Smoothed RTT, variance and minimum, as RFC 9002 §5.
public struct RTTEstimator: Sendable {
    public static let initialRTT: UInt64 = ms(333)
    public static let granularity: UInt64 = ms(1)
    public private(set) var smoothed: UInt64 = initialRTT
    public private(set) var variance: UInt64 = initialRTT / 2
    public private(set) var minimum: UInt64 = .max
    public private(set) var latest: UInt64 = 0
    public private(set) var hasSample = false

    public init() {}

    /// The largest sample taken as it is: a longer one counts as this. Voice is useless over a path
    /// this slow, and a peer that holds its ACKs back on purpose would otherwise stretch every timer
    /// (PTO, closing period) of its connection without bound.
    public static let maximumSample: UInt64 = ms(2_000)

    /// Adds a sample. `ackDelay` is the peer's reported delay, already capped at its max_ack_delay.
    public mutating func update(sample: UInt64, ackDelay: UInt64) {
        let sample = min(sample, Self.maximumSample)
        latest = sample
        minimum = min(minimum, sample)
        guard hasSample else {
            hasSample = true
            smoothed = sample
            variance = sample / 2
            return
        }
        let adjusted = sample >= minimum + ackDelay ? sample - ackDelay : sample
        let difference = smoothed > adjusted ? smoothed - adjusted : adjusted - smoothed
        variance = (3 * variance + difference) / 4
        smoothed = (7 * smoothed + adjusted) / 8
    }

    /// PTO = smoothed + max(4 × variance, granularity) + max_ack_delay.
    public func probeTimeout(maxAckDelay: UInt64) -> UInt64 {
        smoothed + max(4 * variance, Self.granularity) + maxAckDelay
    }

    /// A packet is lost when sent more than this before an acknowledged one (9/8 of the larger RTT).
    public var lossDelay: UInt64 { max(max(latest, smoothed) * 9 / 8, Self.granularity) }

    /// Forget the path's RTT (after migration to a different host).
    public mutating func reset() { self = RTTEstimator() }
}

/// Which packet numbers have arrived, as ranges for ACK frames, highest first. Bounded: the oldest
/// ranges fall off, which only means that the peer may retransmit something it already delivered.
struct ReceivedRanges {
    static let maximumRanges = 32
    private(set) var ranges: [ClosedRange<UInt64>] = []

    init() {}

    var largest: UInt64? { ranges.first?.upperBound }

    mutating func insert(_ pn: UInt64) {
        // Common case: the next packet in order.
        if let first = ranges.first, pn == first.upperBound + 1 {
            ranges[0] = first.lowerBound...pn
            return
        }
        var index = 0
        while index < ranges.count, ranges[index].lowerBound > pn { index += 1 }
        if index < ranges.count, ranges[index].contains(pn) { return }
        // The one insert past the limit (undone below) must not double a full array's capacity for
        // the rest of the connection: grow it by exactly one slot, once.
        if ranges.count == Self.maximumRanges, ranges.capacity <= Self.maximumRanges { ranges.reserveCapacity(Self.maximumRanges + 1) }
        ranges.insert(pn...pn, at: index)
        // Merge with neighbours.
        if index + 1 < ranges.count, ranges[index + 1].upperBound + 1 == pn {
            ranges[index] = ranges[index + 1].lowerBound...ranges[index].upperBound
            ranges.remove(at: index + 1)
        }
        if index > 0, ranges[index - 1].lowerBound == ranges[index].upperBound + 1 {
            ranges[index - 1] = ranges[index].lowerBound...ranges[index - 1].upperBound
            ranges.remove(at: index)
        }
        if ranges.count > Self.maximumRanges { ranges.removeLast() }
    }
}

/// What a sent application packet carried, kept until it is acknowledged or declared lost. Fixed
/// size, stored in a ring, so sending an audio packet allocates nothing. The flags come last so the
/// stride is 56 bytes, not 80.
struct SentPacket {
    var number: UInt64
    var time: WireInstant
    var controlStart: UInt64
    var controlEnd: UInt64
    /// Bit i set: NEW_CONNECTION_ID with sequence i (mod 64).
    var newConnectionIDs: UInt64
    var retireConnectionIDs: UInt64
    var ackEliciting: Bool
    /// Holds something that must be retransmitted if lost (so it arms the probe timer).
    var retransmittable: Bool
    var handshakeDone: Bool
    var newToken: Bool
    var live: Bool

    static let empty = SentPacket(number: 0, time: WireInstant(nanoseconds: 0), controlStart: 0, controlEnd: 0,
                                  newConnectionIDs: 0, retireConnectionIDs: 0, ackEliciting: false, retransmittable: false,
                                  handshakeDone: false, newToken: false, live: false)
}

/// The sent-packet ring. A packet still unacknowledged when its slot is reused is reported lost.
///
/// It starts small and doubles, up to `capacity`, only when the packets in flight need it: an idle
/// connection, or a listener that acknowledges every tenth audio packet, keeps a few dozen in flight,
/// and a full-size ring for each of 1,000 connections would be 56 MB of server memory.
///
/// `oldest` is a lower bound on the live packet numbers, kept tight as packets leave. ACK frames
/// repeat old ranges and loss detection walks up to the largest acknowledged packet; starting both
/// at `oldest` instead of at the ring's floor keeps an ACK's cost at the packets it newly settles
/// rather than the ring's slots (profiling the 200-listener fan-out found 30 % of the server's CPU
/// in those walks).
struct SentPackets {
    /// The most packets tracked at once; one more displaces the oldest, which is then lost.
    static let capacity = 1024
    /// Eight slots: an idle connection (most of a big channel's members) needs no more, and a
    /// listener acknowledging every tenth packet grows it once, to 16.
    static let initialCapacity = 8
    /// A ring larger than this goes back to `initialCapacity` once nothing in it is live (acknowledged
    /// or declared lost). What shrinks is the peak of a burst of control traffic (a joiner's roster of
    /// a thousand members is about 80 packets in flight), which an idle member would otherwise keep
    /// for the rest of its connection. A listener whose unacknowledged audio fits 32 slots (ten
    /// packets between acknowledgements plus a round trip: under about 400 ms with one talker) never
    /// reallocates; beyond that, the ring regrows at the start of each talk spurt, three allocations
    /// per listener per spurt, never per packet.
    static let shrinkAbove = 32
    private var slots: [SentPacket]
    /// No live packet has a number below this.
    private(set) var oldest: UInt64 = 0
    /// One past the highest number recorded.
    private(set) var next: UInt64 = 0

    /// The part of `range` that may hold live packets: `oldest..<next`. Every walk over packet
    /// numbers that a peer names (ACK ranges, the largest it acknowledged) goes through this, so
    /// that it costs at most the ring's capacity: a peer acknowledging a million numbers at once
    /// (the ACK-only packets in between are never recorded) must not make the event loop visit each.
    func clipped(_ range: ClosedRange<UInt64>) -> ClosedRange<UInt64>? {
        guard next > oldest else { return nil }
        let lower = max(range.lowerBound, oldest), upper = min(range.upperBound, next - 1)
        return lower <= upper ? lower...upper : nil
    }

    init() { slots = Array(repeating: .empty, count: Self.initialCapacity) }

    /// Slots allocated now (a power of two).
    var allocated: Int { slots.count }

    private func index(_ number: UInt64) -> Int { Int(number & UInt64(slots.count - 1)) }

    /// Stores `packet`; returns the live packet it displaced, if any.
    mutating func record(_ packet: SentPacket) -> SentPacket? {
        if next == oldest { oldest = packet.number }  // nothing was live
        if packet.number - oldest >= UInt64(slots.count), slots.count < Self.capacity { grow(toHold: packet.number - oldest + 1) }
        let index = index(packet.number)
        let displaced = slots[index].live ? slots[index] : nil
        slots[index] = packet
        next = packet.number + 1
        if next - oldest > UInt64(slots.count) { oldest = next - UInt64(slots.count) }
        advanceOldest()
        return displaced
    }

    /// Removes and returns the live packet with this number.
    mutating func take(_ number: UInt64) -> SentPacket? {
        let index = index(number)
        guard slots[index].live, slots[index].number == number else { return nil }
        slots[index].live = false
        let taken = slots[index]
        if number == oldest {
            advanceOldest()
            if oldest == next, slots.count > Self.shrinkAbove { slots = Array(repeating: .empty, count: Self.initialCapacity) }
        }
        return taken
    }

    func peek(_ number: UInt64) -> SentPacket? {
        let slot = slots[index(number)]
        return slot.live && slot.number == number ? slot : nil
    }

    /// Doubles the ring until `span` numbers fit (or it reaches `capacity`), moving the live packets,
    /// which all lie in `oldest..<next`, to their slots in the larger ring.
    private mutating func grow(toHold span: UInt64) {
        var size = slots.count
        while UInt64(size) < span, size < Self.capacity { size *= 2 }
        var larger = [SentPacket](repeating: .empty, count: size)
        for slot in slots where slot.live && slot.number >= oldest {
            larger[Int(slot.number & UInt64(size - 1))] = slot
        }
        slots = larger
    }

    /// Moves `oldest` past numbers that are no longer live (each number is passed once, so this is
    /// amortised O(1) per packet).
    private mutating func advanceOldest() {
        while oldest < next {
            let slot = slots[index(oldest)]
            if slot.live && slot.number == oldest { return }
            oldest += 1
        }
    }
}
