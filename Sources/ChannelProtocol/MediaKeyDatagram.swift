// A media key as a datagram (docs/protocol.md §16.4.5). Like AudioHeader.swift this file parses
// network input in place and is compiled into the media-frame fuzz target.

extension MediaKey {
    /// The kind byte of a key datagram ('K'), beside audio's 'A'.
    public static let datagramKind: UInt8 = 0x4B
    /// kind, slot, burst, key ID, key.
    public static let datagramSize = 1 + 2 + 2 + 8 + keyLength

    /// The key as a datagram, sent beside its control message: a DATAGRAM frame, sealed for one
    /// connection like any, that no lost packet ahead of it on the control stream holds back.
    public var datagram: [UInt8] {
        var bytes: [UInt8] = [Self.datagramKind, UInt8(slot >> 8), UInt8(truncatingIfNeeded: slot),
                              UInt8(burst >> 8), UInt8(truncatingIfNeeded: burst)]
        for i in 0..<8 { bytes.append(UInt8(truncatingIfNeeded: keyID >> UInt64(56 - 8 * i))) }
        return bytes + key
    }

    /// Reads a key datagram; nil if `bytes` is not one (another kind, the wrong size, a key ID
    /// above 2^53).
    public init?(datagram bytes: UnsafeRawBufferPointer) {
        guard bytes.count == Self.datagramSize, bytes[0] == Self.datagramKind else { return nil }
        var keyID: UInt64 = 0
        for i in 0..<8 { keyID = keyID << 8 | UInt64(bytes[5 + i]) }
        guard keyID <= Self.maxKeyID else { return nil }
        self.init(slot: UInt16(bytes[1]) << 8 | UInt16(bytes[2]), burst: UInt16(bytes[3]) << 8 | UInt16(bytes[4]),
                  keyID: keyID, key: Array(bytes[13...]))
    }
}
