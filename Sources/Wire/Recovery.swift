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

    /// Adds a sample. `ackDelay` is the peer's reported delay, already capped at its max_ack_delay.
    public mutating func update(sample: UInt64, ackDelay: UInt64) {
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

    init() { ranges.reserveCapacity(Self.maximumRanges + 1) }

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
/// size, stored in a ring, so sending an audio packet allocates nothing.
struct SentPacket {
    var number: UInt64
    var time: WireInstant
    var ackEliciting: Bool
    /// Holds something that must be retransmitted if lost (so it arms the probe timer).
    var retransmittable: Bool
    var controlStart: UInt64
    var controlEnd: UInt64
    var handshakeDone: Bool
    var newToken: Bool
    /// Bit i set: NEW_CONNECTION_ID with sequence i (mod 64).
    var newConnectionIDs: UInt64
    var retireConnectionIDs: UInt64
    var live: Bool

    static let empty = SentPacket(number: 0, time: WireInstant(nanoseconds: 0), ackEliciting: false, retransmittable: false,
                                  controlStart: 0, controlEnd: 0, handshakeDone: false, newToken: false,
                                  newConnectionIDs: 0, retireConnectionIDs: 0, live: false)
}

/// The sent-packet ring. A packet still unacknowledged when its slot is reused is reported lost.
///
/// `oldest` is a lower bound on the live packet numbers, kept tight as packets leave. ACK frames
/// repeat old ranges and loss detection walks up to the largest acknowledged packet; starting both
/// at `oldest` instead of at the ring's floor keeps an ACK's cost at the packets it newly settles
/// rather than the ring's 1,024 slots (profiling the 200-listener fan-out found 30 % of the server's
/// CPU in those walks).
struct SentPackets {
    static let capacity = 1024
    private var slots: [SentPacket]
    /// No live packet has a number below this.
    private(set) var oldest: UInt64 = 0
    /// One past the highest number recorded.
    private var next: UInt64 = 0

    init() { slots = Array(repeating: .empty, count: Self.capacity) }

    /// Stores `packet`; returns the live packet it displaced, if any.
    mutating func record(_ packet: SentPacket) -> SentPacket? {
        let index = Int(packet.number % UInt64(Self.capacity))
        let displaced = slots[index].live ? slots[index] : nil
        slots[index] = packet
        if next == oldest { oldest = packet.number }  // nothing was live
        next = packet.number + 1
        if next - oldest > UInt64(Self.capacity) { oldest = next - UInt64(Self.capacity) }
        advanceOldest()
        return displaced
    }

    /// Removes and returns the live packet with this number.
    mutating func take(_ number: UInt64) -> SentPacket? {
        let index = Int(number % UInt64(Self.capacity))
        guard slots[index].live, slots[index].number == number else { return nil }
        slots[index].live = false
        if number == oldest { advanceOldest() }
        return slots[index]
    }

    func peek(_ number: UInt64) -> SentPacket? {
        let slot = slots[Int(number % UInt64(Self.capacity))]
        return slot.live && slot.number == number ? slot : nil
    }

    /// Moves `oldest` past numbers that are no longer live (each number is passed once, so this is
    /// amortised O(1) per packet).
    private mutating func advanceOldest() {
        while oldest < next {
            let slot = slots[Int(oldest % UInt64(Self.capacity))]
            if slot.live && slot.number == oldest { return }
            oldest += 1
        }
    }
}
