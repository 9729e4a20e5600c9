/// Why a datagram or frame could not be parsed. Parsers of network input throw these and never trap:
/// a malformed packet is dropped and counted, never acted on.
public enum WireParseError: Error, Sendable, Hashable, CustomStringConvertible {
    /// The input ended before the field did.
    case truncated(field: StaticString)
    /// A field holds a value the protocol forbids.
    case invalid(field: StaticString, value: UInt64)
    /// A frame type this version does not define.
    case unknownFrameType(UInt64)

    public var description: String {
        switch self {
        case .truncated(let field): return "truncated \(field)"
        case .invalid(let field, let value): return "invalid \(field) (\(value))"
        case .unknownFrameType(let type): return "unknown frame type 0x\(String(type, radix: 16))"
        }
    }

    public static func == (a: Self, b: Self) -> Bool {
        switch (a, b) {
        case (.truncated(let x), .truncated(let y)): return "\(x)" == "\(y)"
        case (.invalid(let x, let v), .invalid(let y, let w)): return "\(x)" == "\(y)" && v == w
        case (.unknownFrameType(let x), .unknownFrameType(let y)): return x == y
        default: return false
        }
    }

    public func hash(into hasher: inout Hasher) { hasher.combine(description) }
}

/// A bounds-checked big-endian cursor over received bytes. Every read checks the remaining length
/// first and throws `truncated`, so no input can make it read out of bounds.
public struct WireReader {
    public let bytes: UnsafeRawBufferPointer
    public private(set) var offset: Int

    public init(_ bytes: UnsafeRawBufferPointer, offset: Int = 0) {
        self.bytes = bytes
        self.offset = offset
    }

    public var remaining: Int { bytes.count - offset }
    public var isAtEnd: Bool { offset >= bytes.count }

    public mutating func u8(_ field: StaticString) throws(WireParseError) -> UInt8 {
        guard remaining >= 1 else { throw .truncated(field: field) }
        defer { offset += 1 }
        return bytes[offset]
    }

    public mutating func u32(_ field: StaticString) throws(WireParseError) -> UInt32 {
        guard remaining >= 4 else { throw .truncated(field: field) }
        defer { offset += 4 }
        return UInt32(bytes[offset]) << 24 | UInt32(bytes[offset + 1]) << 16 | UInt32(bytes[offset + 2]) << 8 | UInt32(bytes[offset + 3])
    }

    /// Big-endian unsigned integer of `count` bytes (1 to 8).
    public mutating func uint(_ count: Int, _ field: StaticString) throws(WireParseError) -> UInt64 {
        guard remaining >= count else { throw .truncated(field: field) }
        var value: UInt64 = 0
        for i in 0..<count { value = value << 8 | UInt64(bytes[offset + i]) }
        offset += count
        return value
    }

    /// A QUIC variable-length integer (RFC 9000 §16): the top two bits of the first byte give the
    /// length, 1, 2, 4 or 8 bytes, leaving 6 to 62 bits of value.
    public mutating func varint(_ field: StaticString) throws(WireParseError) -> UInt64 {
        guard remaining >= 1 else { throw .truncated(field: field) }
        let length = 1 << Int(bytes[offset] >> 6)
        guard remaining >= length else { throw .truncated(field: field) }
        var value = UInt64(bytes[offset] & 0x3F)
        for i in 1..<length { value = value << 8 | UInt64(bytes[offset + i]) }
        offset += length
        return value
    }

    /// The next `count` bytes, as a range of offsets into `bytes` (no copy).
    public mutating func range(_ count: UInt64, _ field: StaticString) throws(WireParseError) -> Range<Int> {
        guard count <= UInt64(remaining) else { throw .truncated(field: field) }
        let start = offset
        offset += Int(count)
        return start..<offset
    }

    /// Everything left.
    public mutating func rest() -> Range<Int> {
        defer { offset = bytes.count }
        return offset..<bytes.count
    }
}

/// Appends big-endian fields into caller-owned memory, so building a packet allocates nothing.
/// Writers check capacity and report `false` (a programming error: size buffers for the maximum
/// datagram) instead of trapping.
public struct WireWriter {
    public let buffer: UnsafeMutableRawBufferPointer
    public private(set) var offset: Int
    /// Set when a write did not fit; every later write is ignored.
    public private(set) var overflowed = false

    public init(_ buffer: UnsafeMutableRawBufferPointer, offset: Int = 0) {
        self.buffer = buffer
        self.offset = offset
    }

    public var remaining: Int { buffer.count - offset }

    private mutating func reserve(_ n: Int) -> Bool {
        guard !overflowed, remaining >= n else { overflowed = true; return false }
        return true
    }

    public mutating func u8(_ v: UInt8) {
        guard reserve(1) else { return }
        buffer[offset] = v
        offset += 1
    }

    public mutating func u32(_ v: UInt32) { uint(UInt64(v), 4) }

    public mutating func uint(_ v: UInt64, _ count: Int) {
        guard reserve(count) else { return }
        for i in 0..<count { buffer[offset + i] = UInt8(truncatingIfNeeded: v >> UInt64(8 * (count - 1 - i))) }
        offset += count
    }

    /// Largest value a varint can hold.
    public static let maximumVarint: UInt64 = (1 << 62) - 1

    /// Encoded length of a varint.
    public static func varintLength(_ v: UInt64) -> Int {
        v < 1 << 6 ? 1 : v < 1 << 14 ? 2 : v < 1 << 30 ? 4 : 8
    }

    /// Writes the shortest encoding of `v` (which must be at most 2⁶² − 1).
    public mutating func varint(_ v: UInt64) {
        precondition(v <= Self.maximumVarint, "varint out of range")
        let length = Self.varintLength(v)
        guard reserve(length) else { return }
        let prefix: UInt64 = switch length { case 1: 0; case 2: 1; case 4: 2; default: 3 }
        let tagged = v | prefix << UInt64(8 * length - 2)
        for i in 0..<length { buffer[offset + i] = UInt8(truncatingIfNeeded: tagged >> UInt64(8 * (length - 1 - i))) }
        offset += length
    }

    public mutating func bytes(_ source: UnsafeRawBufferPointer) {
        guard reserve(source.count) else { return }
        if let base = source.baseAddress, source.count > 0 {
            (buffer.baseAddress! + offset).copyMemory(from: base, byteCount: source.count)
        }
        offset += source.count
    }

    public mutating func bytes(_ source: [UInt8]) { source.withUnsafeBytes { bytes($0) } }

    public mutating func zeros(_ count: Int) {
        guard reserve(count) else { return }
        (buffer.baseAddress! + offset).initializeMemory(as: UInt8.self, repeating: 0, count: count)
        offset += count
    }
}
