/// The 8-byte header in front of every audio DATAGRAM's Opus payload (docs/protocol.md §16.4).
///
/// ```
/// 0      kind (0x41, 'A')
/// 1      flags: bit 0 end of burst, bit 1 catch-up (server → client only)
/// 2..3   talker slot, big-endian (server → client; a client sends 0)
/// 4..5   burst number, big-endian (from the floor grant)
/// 6..7   sequence within the burst, big-endian, from 0, one per 20 ms frame
/// 8..    Opus packet (may be empty on an end-of-burst marker)
/// ```
///
/// Parsing and writing work on raw buffers in place: the relay rewrites the header of each forwarded
/// datagram without copying the payload into anything new.
public struct AudioHeader: Sendable, Equatable {
    public static let size = 8
    public static let kind: UInt8 = 0x41
    /// The largest Opus payload either side sends or accepts (a 20 ms frame at 510 kbps is 1275; our
    /// 32 kbps VOIP frames are about 80).
    public static let maxPayload = 1_100

    public struct Flags: OptionSet, Sendable, Hashable {
        public let rawValue: UInt8
        public init(rawValue: UInt8) { self.rawValue = rawValue }
        public static let endOfBurst = Flags(rawValue: 1 << 0)
        /// The packet is part of a burst replayed to a late joiner, not live.
        public static let catchUp = Flags(rawValue: 1 << 1)
        static let known: Flags = [.endOfBurst, .catchUp]
    }

    public var flags: Flags
    public var slot: UInt16
    public var burst: UInt16
    public var sequence: UInt16

    public init(flags: Flags = [], slot: UInt16 = 0, burst: UInt16, sequence: UInt16) {
        self.flags = flags
        self.slot = slot
        self.burst = burst
        self.sequence = sequence
    }

    /// Reads the header of `datagram`; nil if it is not an audio datagram (wrong kind, too short, too
    /// long, unknown flags).
    public init?(parsing datagram: UnsafeRawBufferPointer) {
        guard datagram.count >= Self.size, datagram.count <= Self.size + Self.maxPayload,
              datagram[0] == Self.kind else { return nil }
        let flags = Flags(rawValue: datagram[1])
        guard Flags.known.isSuperset(of: flags) else { return nil }
        self.flags = flags
        slot = UInt16(datagram[2]) << 8 | UInt16(datagram[3])
        burst = UInt16(datagram[4]) << 8 | UInt16(datagram[5])
        sequence = UInt16(datagram[6]) << 8 | UInt16(datagram[7])
    }

    /// Writes the header into the first `size` bytes of `buffer` (which must hold them).
    public func write(to buffer: UnsafeMutableRawBufferPointer) {
        precondition(buffer.count >= Self.size)
        buffer[0] = Self.kind
        buffer[1] = flags.rawValue
        buffer[2] = UInt8(slot >> 8); buffer[3] = UInt8(truncatingIfNeeded: slot)
        buffer[4] = UInt8(burst >> 8); buffer[5] = UInt8(truncatingIfNeeded: burst)
        buffer[6] = UInt8(sequence >> 8); buffer[7] = UInt8(truncatingIfNeeded: sequence)
    }

    /// A whole datagram as an array (for clients and tests; the relay writes in place).
    public func datagram(payload: some Collection<UInt8>) -> [UInt8] {
        var bytes = [UInt8](repeating: 0, count: Self.size)
        bytes.withUnsafeMutableBytes { write(to: $0) }
        bytes.append(contentsOf: payload)
        return bytes
    }
}
