// The SFrame header (RFC 9605 §4.3). Like PacketHeader.swift this file needs nothing else, so the
// media fuzz target compiles it alone.

/// A parsed SFrame header: the key ID and counter in front of every sealed media frame.
///
/// ```
///  0 1 2 3 4 5 6 7
/// +-+-+-+-+-+-+-+-+---------------------+---------------------+
/// |X|  K  |Y|  C  |   KID... (if X)     |   CTR... (if Y)     |
/// +-+-+-+-+-+-+-+-+---------------------+---------------------+
/// ```
/// X clear: K is the KID (0–7); set: K is the KID's length in bytes minus one, and the KID follows.
/// Y and C say the same of the counter, which follows the KID.
public struct SFrameHeader: Sendable, Equatable {
    public var keyID: UInt64
    public var counter: UInt64

    /// The longest header: the config byte, an 8-byte KID and an 8-byte counter.
    public static let maxSize = 17

    public init(keyID: UInt64, counter: UInt64) {
        self.keyID = keyID
        self.counter = counter
    }

    /// Bytes a value takes beyond the config byte: none below 8, else its length without leading zeros.
    private static func extraBytes(_ value: UInt64) -> Int {
        value < 8 ? 0 : (64 - value.leadingZeroBitCount + 7) / 8
    }

    /// The header's size on the wire (values are always written as short as they go).
    public var size: Int { 1 + Self.extraBytes(keyID) + Self.extraBytes(counter) }

    /// Reads the header at the start of `bytes`; nil if it is cut short. Returns the header and its size.
    public static func parse(_ bytes: UnsafeRawBufferPointer) -> (header: SFrameHeader, size: Int)? {
        guard let config = bytes.first else { return nil }
        var offset = 1
        func field(extended: Bool, low: UInt8) -> UInt64? {
            guard extended else { return UInt64(low) }
            let length = Int(low) + 1
            guard bytes.count >= offset + length else { return nil }
            var value: UInt64 = 0
            for i in 0..<length { value = value << 8 | UInt64(bytes[offset + i]) }
            offset += length
            return value
        }
        guard let keyID = field(extended: config & 0x80 != 0, low: (config >> 4) & 0x07),
              let counter = field(extended: config & 0x08 != 0, low: config & 0x07) else { return nil }
        return (SFrameHeader(keyID: keyID, counter: counter), offset)
    }

    /// Writes the header at the start of `buffer` (which must hold `size` bytes); returns its size.
    @discardableResult
    public func write(to buffer: UnsafeMutableRawBufferPointer) -> Int {
        let kidBytes = Self.extraBytes(keyID), ctrBytes = Self.extraBytes(counter)
        precondition(buffer.count >= 1 + kidBytes + ctrBytes)
        var config: UInt8 = 0
        config |= kidBytes == 0 ? UInt8(keyID) << 4 : 0x80 | UInt8(kidBytes - 1) << 4
        config |= ctrBytes == 0 ? UInt8(counter) : 0x08 | UInt8(ctrBytes - 1)
        buffer[0] = config
        var offset = 1
        func put(_ value: UInt64, _ count: Int) {
            for i in 0..<count { buffer[offset + i] = UInt8(truncatingIfNeeded: value >> UInt64(8 * (count - 1 - i))) }
            offset += count
        }
        put(keyID, kidBytes)
        put(counter, ctrBytes)
        return offset
    }
}
