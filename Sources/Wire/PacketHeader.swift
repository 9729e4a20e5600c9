// Packet headers (docs/protocol.md §3). Parsing covers only the parts that are not header-protected;
// Connection removes header protection and decrypts. Like Frames.swift, this file needs only
// WireBytes.swift and Frames.swift, so the packet fuzz target compiles it alone.

/// Protocol versions. The version is in every long header and, with the list the client offered, in
/// the signed handshake transcript, so a forged Version Negotiation cannot downgrade a connection.
public enum WireVersion {
    /// "SQ" 0x0001.
    public static let v1: UInt32 = 0x5351_0001
    public static let supported: [UInt32] = [v1]
    /// Version 0 marks a Version Negotiation packet.
    public static let negotiation: UInt32 = 0
}

/// Long-header packet types (first byte bits 4–5).
public enum LongPacketType: UInt8, Sendable {
    case initial = 0
    case handshake = 2
    case retry = 3
}

/// A parsed packet header, before header protection is removed. Ranges index the datagram.
public enum PacketHeader: Equatable, Sendable {
    /// Initial or Handshake: `pnOffset` is where the protected packet number starts and `end` where
    /// the packet (and the next coalesced one) ends.
    case long(type: LongPacketType, version: UInt32, destination: ConnectionID, source: ConnectionID,
              token: Range<Int>, pnOffset: Int, end: Int)
    case retry(version: UInt32, destination: ConnectionID, source: ConnectionID, token: Range<Int>, tag: Range<Int>)
    case versionNegotiation(destination: ConnectionID, source: ConnectionID, versions: Range<Int>)
    /// A long header of a version this endpoint doesn't speak (the server answers with Version Negotiation).
    case unsupportedVersion(version: UInt32, destination: ConnectionID, source: ConnectionID)
    /// A 1-RTT packet: runs to the end of the datagram.
    case short(destination: ConnectionID, pnOffset: Int)

    public static let longFormBit: UInt8 = 0x80
    public static let fixedBit: UInt8 = 0x40
    public static let keyPhaseBit: UInt8 = 0x04
    /// Smallest datagram that can hold a protected short-header packet: header, 4 bytes for the sample
    /// offset, 16 bytes of sample. Shorter ones are never answered.
    public static let minimumShortPacket = 1 + ConnectionID.length + 4 + 16
    /// A stateless reset: at least 5 unpredictable bytes and the 16-byte token (RFC 9000 §10.3).
    public static let minimumStatelessReset = 21
    /// Client Initial datagrams are padded to at least this size (anti-amplification, RFC 9000 §14.1).
    public static let minimumInitialDatagram = 1200

    /// The destination connection ID of any packet, read without parsing the rest: the endpoint routes
    /// by it.
    public static func destination(of datagram: UnsafeRawBufferPointer) -> ConnectionID? {
        var reader = WireReader(datagram)
        guard let first = try? reader.u8("first byte") else { return nil }
        if first & longFormBit != 0 {
            guard (try? reader.u32("version")) != nil, let length = try? reader.u8("dcid length"),
                  Int(length) == ConnectionID.length, let id = try? reader.uint(8, "dcid") else { return nil }
            return ConnectionID(id)
        }
        guard let id = try? reader.uint(8, "dcid") else { return nil }
        return ConnectionID(id)
    }

    /// Parses the packet that starts at `offset`.
    public static func parse(_ datagram: UnsafeRawBufferPointer, at offset: Int = 0) throws(WireParseError) -> PacketHeader {
        var reader = WireReader(datagram, offset: offset)
        let first = try reader.u8("first byte")
        if first & longFormBit == 0 {
            guard first & fixedBit != 0 else { throw .invalid(field: "fixed bit", value: UInt64(first)) }
            let destination = ConnectionID(try reader.uint(8, "destination connection ID"))
            guard datagram.count - offset >= minimumShortPacket else { throw .truncated(field: "short packet") }
            return .short(destination: destination, pnOffset: reader.offset)
        }
        let version = try reader.u32("version")
        let destination = try connectionID(&reader, "destination connection ID")
        let source = try connectionID(&reader, "source connection ID")
        if version == WireVersion.negotiation {
            let versions = reader.rest()
            guard !versions.isEmpty, versions.count % 4 == 0 else { throw .invalid(field: "version list", value: UInt64(versions.count)) }
            return .versionNegotiation(destination: destination, source: source, versions: versions)
        }
        guard first & fixedBit != 0 else { throw .invalid(field: "fixed bit", value: UInt64(first)) }
        guard WireVersion.supported.contains(version) else {
            return .unsupportedVersion(version: version, destination: destination, source: source)
        }
        let rawType = (first >> 4) & 0x03
        guard let type = LongPacketType(rawValue: rawType) else { throw .invalid(field: "long packet type", value: UInt64(rawType)) }
        switch type {
        case .retry:
            let rest = reader.rest()
            guard rest.count > 16 else { throw .truncated(field: "retry token") }
            return .retry(version: version, destination: destination, source: source,
                          token: rest.lowerBound..<(rest.upperBound - 16), tag: (rest.upperBound - 16)..<rest.upperBound)
        case .initial, .handshake:
            var token = reader.offset..<reader.offset
            if type == .initial {
                let length = try reader.varint("token length")
                token = try reader.range(length, "token")
            }
            let length = try reader.varint("packet length")
            // Packet number (≥1) plus a 16-byte sample region must fit.
            guard length >= 20 else { throw .invalid(field: "packet length", value: length) }
            let body = try reader.range(length, "packet body")
            return .long(type: type, version: version, destination: destination, source: source,
                         token: token, pnOffset: body.lowerBound, end: body.upperBound)
        }
    }

    private static func connectionID(_ reader: inout WireReader, _ field: StaticString) throws(WireParseError) -> ConnectionID {
        let length = try reader.u8(field)
        guard Int(length) == ConnectionID.length else { throw .invalid(field: field, value: UInt64(length)) }
        return ConnectionID(try reader.uint(8, field))
    }
}

/// Packet-number truncation and recovery (RFC 9000 §17.1 and appendix A).
public enum PacketNumber {
    /// Bytes needed so that the receiver can rebuild `full` when it has seen up to `largestAcked`.
    public static func encodedLength(_ full: UInt64, largestAcked: UInt64?) -> Int {
        let unacked = largestAcked.map { full - $0 } ?? full + 1
        let span = unacked * 2
        return span < 1 << 8 ? 1 : span < 1 << 16 ? 2 : span < 1 << 24 ? 3 : 4
    }

    /// Rebuilds a full packet number from its `length`-byte truncation, closest to `largest + 1`.
    public static func decode(truncated: UInt64, length: Int, largest: UInt64?) -> UInt64 {
        let expected = largest.map { $0 + 1 } ?? 0
        let window: UInt64 = 1 << UInt64(length * 8)
        let half = window / 2
        let candidate = (expected & ~(window - 1)) | truncated
        if candidate + half <= expected, candidate < (1 << 62) - window { return candidate + window }
        if candidate > expected + half, candidate >= window { return candidate - window }
        return candidate
    }
}

/// Writes long headers. The Length field is always two bytes, so it can be filled in after the payload.
extension WireWriter {
    /// Writes a long header up to and including the packet number; returns where Length and the packet
    /// number start.
    public mutating func writeLongHeader(type: LongPacketType, version: UInt32, destination: ConnectionID,
                                         source: ConnectionID, token: [UInt8], packetNumber: UInt64,
                                         pnLength: Int) -> (lengthOffset: Int, pnOffset: Int) {
        u8(PacketHeader.longFormBit | PacketHeader.fixedBit | type.rawValue << 4 | UInt8(pnLength - 1))
        u32(version)
        u8(UInt8(ConnectionID.length)); uint(destination.value, 8)
        u8(UInt8(ConnectionID.length)); uint(source.value, 8)
        if type == .initial { varint(UInt64(token.count)); bytes(token) }
        let lengthOffset = offset
        uint(0x4000, 2)
        let pnOffset = offset
        uint(packetNumber & ((1 << UInt64(pnLength * 8)) - 1), pnLength)
        return (lengthOffset, pnOffset)
    }

    /// Writes a short header; returns where the packet number starts.
    public mutating func writeShortHeader(destination: ConnectionID, keyPhase: Bool, packetNumber: UInt64, pnLength: Int) -> Int {
        u8(PacketHeader.fixedBit | (keyPhase ? PacketHeader.keyPhaseBit : 0) | UInt8(pnLength - 1))
        uint(destination.value, 8)
        let pnOffset = offset
        uint(packetNumber & ((1 << UInt64(pnLength * 8)) - 1), pnLength)
        return pnOffset
    }
}
