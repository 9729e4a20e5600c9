// Frames: the units inside a protected packet's payload. Types and layouts follow QUIC (RFC 9000 §19,
// RFC 9221 for DATAGRAM) so that the protocol can later move onto a real QUIC stack; STREAM is
// replaced by CONTROL, because there is exactly one reliable stream. docs/protocol.md is the spec.
//
// This file depends only on WireBytes.swift, so the frame fuzz target compiles it on its own.

/// An 8-byte connection ID. Every connection ID in this protocol has this length, so a short header
/// needs no length field.
public struct ConnectionID: Hashable, Sendable, CustomStringConvertible {
    public var value: UInt64
    public init(_ value: UInt64) { self.value = value }
    public static let length = 8
    public var description: String {
        let hex = String(value, radix: 16)
        return String(repeating: "0", count: 16 - hex.count) + hex
    }
}

/// Frame type codes.
public enum FrameType: UInt64, Sendable {
    case padding = 0x00
    case ping = 0x01
    case ack = 0x02
    case crypto = 0x06
    case newToken = 0x07
    case control = 0x08
    case newConnectionID = 0x18
    case retireConnectionID = 0x19
    case pathChallenge = 0x1A
    case pathResponse = 0x1B
    case connectionClose = 0x1C
    case applicationClose = 0x1D
    case handshakeDone = 0x1E
    case datagram = 0x30
    case datagramWithLength = 0x31
}

/// An ACK frame as parsed: the ranges stay encoded in the packet and are walked on demand, so parsing
/// an ACK allocates nothing. The parser has already checked that every range is well-formed.
public struct AckFrame: Hashable, Sendable {
    public var largest: UInt64
    /// Encoded ACK delay; multiply by 2^ack_delay_exponent for microseconds.
    public var delay: UInt64
    public var firstRange: UInt64
    public var additionalRangeCount: UInt64
    /// Where the (gap, length) pairs sit in the packet.
    public var encodedRanges: Range<Int>

    /// The acknowledged packet numbers, highest range first.
    public func ranges(in packet: UnsafeRawBufferPointer) -> AckRanges {
        AckRanges(frame: self, packet: packet)
    }

    /// Most ACK ranges accepted in one frame: enough for heavy reordering, small enough to bound work.
    public static let maximumRanges: UInt64 = 256
}

/// Iterates an ACK frame's ranges from the highest.
public struct AckRanges: Sequence, IteratorProtocol {
    private var reader: WireReader
    private var upcoming: ClosedRange<UInt64>?
    private var left: UInt64

    init(frame: AckFrame, packet: UnsafeRawBufferPointer) {
        reader = WireReader(UnsafeRawBufferPointer(rebasing: packet[frame.encodedRanges]))
        upcoming = (frame.largest - frame.firstRange)...frame.largest
        left = frame.additionalRangeCount
    }

    public mutating func next() -> ClosedRange<UInt64>? {
        guard let current = upcoming else { return nil }
        if left > 0, let gap = try? reader.varint("gap"), let length = try? reader.varint("length") {
            left -= 1
            let largest = current.lowerBound - gap - 2
            upcoming = (largest - length)...largest
        } else {
            upcoming = nil
        }
        return current
    }
}

/// A parsed frame. Byte payloads are ranges of offsets into the packet buffer, not copies.
public enum Frame: Hashable, Sendable {
    /// One or more PADDING bytes, coalesced.
    case padding(count: Int)
    case ping
    case ack(AckFrame)
    /// Handshake message bytes at `offset` of the handshake byte stream.
    case crypto(offset: UInt64, data: Range<Int>)
    /// An address-validation token for a future connection.
    case newToken(Range<Int>)
    /// Bytes at `offset` of the reliable, ordered control stream.
    case control(offset: UInt64, data: Range<Int>)
    case newConnectionID(sequence: UInt64, retirePriorTo: UInt64, connectionID: ConnectionID, resetToken: Range<Int>)
    case retireConnectionID(sequence: UInt64)
    case pathChallenge(UInt64)
    case pathResponse(UInt64)
    /// Closes the connection with a transport error code and a UTF-8 reason.
    case connectionClose(code: UInt64, reason: Range<Int>)
    /// Closes the connection with an application error code and a UTF-8 reason.
    case applicationClose(code: UInt64, reason: Range<Int>)
    case handshakeDone
    /// An unreliable datagram (audio).
    case datagram(Range<Int>)

    /// Whether receiving this frame obliges the receiver to send an ACK (RFC 9002 §2). Unlike
    /// RFC 9221's, our DATAGRAM frames do not: audio is never acknowledged for its own sake
    /// (docs/protocol.md §11.2).
    public var isAckEliciting: Bool {
        switch self {
        case .padding, .ack, .connectionClose, .applicationClose, .datagram: return false
        default: return true
        }
    }
}

/// Parses the frames of a decrypted payload one at a time.
public struct FrameParser {
    private var reader: WireReader

    /// Largest CRYPTO/CONTROL offset plus length accepted: 2⁶² − 1, as in QUIC.
    static let maximumStreamEnd: UInt64 = (1 << 62) - 1

    public init(payload: UnsafeRawBufferPointer, offset: Int = 0) {
        reader = WireReader(payload, offset: offset)
    }

    /// The next frame, or nil at the end of the payload.
    public mutating func next() throws(WireParseError) -> Frame? {
        guard !reader.isAtEnd else { return nil }
        let rawType = try reader.varint("frame type")
        guard let type = FrameType(rawValue: rawType) else { throw .unknownFrameType(rawType) }
        switch type {
        case .padding:
            var count = 1
            while !reader.isAtEnd, reader.bytes[reader.offset] == 0 { _ = try reader.u8("padding"); count += 1 }
            return .padding(count: count)
        case .ping:
            return .ping
        case .ack:
            return .ack(try parseAck())
        case .crypto, .control:
            let offset = try reader.varint("stream offset")
            let length = try reader.varint("stream length")
            guard offset + length <= Self.maximumStreamEnd else { throw .invalid(field: "stream offset", value: offset) }
            let data = try reader.range(length, "stream data")
            return type == .crypto ? .crypto(offset: offset, data: data) : .control(offset: offset, data: data)
        case .newToken:
            let length = try reader.varint("token length")
            guard length > 0 else { throw .invalid(field: "token length", value: 0) }
            return .newToken(try reader.range(length, "token"))
        case .newConnectionID:
            let sequence = try reader.varint("sequence number")
            let retire = try reader.varint("retire prior to")
            guard retire <= sequence else { throw .invalid(field: "retire prior to", value: retire) }
            let length = try reader.u8("connection ID length")
            guard Int(length) == ConnectionID.length else { throw .invalid(field: "connection ID length", value: UInt64(length)) }
            let id = ConnectionID(try reader.uint(ConnectionID.length, "connection ID"))
            let token = try reader.range(16, "stateless reset token")
            return .newConnectionID(sequence: sequence, retirePriorTo: retire, connectionID: id, resetToken: token)
        case .retireConnectionID:
            return .retireConnectionID(sequence: try reader.varint("sequence number"))
        case .pathChallenge:
            return .pathChallenge(try reader.uint(8, "path challenge data"))
        case .pathResponse:
            return .pathResponse(try reader.uint(8, "path response data"))
        case .connectionClose, .applicationClose:
            let code = try reader.varint("error code")
            let length = try reader.varint("reason length")
            let reason = try reader.range(length, "reason")
            return type == .connectionClose ? .connectionClose(code: code, reason: reason) : .applicationClose(code: code, reason: reason)
        case .handshakeDone:
            return .handshakeDone
        case .datagram:
            return .datagram(reader.rest())
        case .datagramWithLength:
            let length = try reader.varint("datagram length")
            return .datagram(try reader.range(length, "datagram data"))
        }
    }

    private mutating func parseAck() throws(WireParseError) -> AckFrame {
        let largest = try reader.varint("largest acknowledged")
        let delay = try reader.varint("ACK delay")
        let count = try reader.varint("ACK range count")
        guard count <= AckFrame.maximumRanges else { throw .invalid(field: "ACK range count", value: count) }
        let first = try reader.varint("first ACK range")
        guard first <= largest else { throw .invalid(field: "first ACK range", value: first) }
        let start = reader.offset
        // Walk the ranges once now, so that AckRanges never meets an underflow later.
        var smallest = largest - first
        for _ in 0..<count {
            let gap = try reader.varint("ACK gap")
            let length = try reader.varint("ACK range length")
            guard smallest >= gap + 2 else { throw .invalid(field: "ACK gap", value: gap) }
            let next = smallest - gap - 2
            guard length <= next else { throw .invalid(field: "ACK range length", value: length) }
            smallest = next - length
        }
        return AckFrame(largest: largest, delay: delay, firstRange: first, additionalRangeCount: count,
                        encodedRanges: start..<reader.offset)
    }
}

/// Writes frames. Each returns false if the frame didn't fit (the writer has overflowed).
extension WireWriter {
    public mutating func writePadding(_ count: Int) { zeros(count) }

    public mutating func writePing() { varint(FrameType.ping.rawValue) }

    /// Writes an ACK for `ranges`, which must be disjoint, non-adjacent and sorted highest first.
    public mutating func writeAck(ranges: some Collection<ClosedRange<UInt64>>, delay: UInt64) {
        guard let first = ranges.first else { return }
        varint(FrameType.ack.rawValue)
        varint(first.upperBound)
        varint(delay)
        varint(UInt64(ranges.count - 1))
        varint(first.upperBound - first.lowerBound)
        var previousSmallest = first.lowerBound
        for range in ranges.dropFirst() {
            precondition(range.upperBound + 2 <= previousSmallest, "ACK ranges must be sorted, disjoint and non-adjacent")
            varint(previousSmallest - range.upperBound - 2)
            varint(range.upperBound - range.lowerBound)
            previousSmallest = range.lowerBound
        }
    }

    public mutating func writeCrypto(offset: UInt64, data: UnsafeRawBufferPointer) {
        varint(FrameType.crypto.rawValue); varint(offset); varint(UInt64(data.count)); bytes(data)
    }

    public mutating func writeControl(offset: UInt64, data: UnsafeRawBufferPointer) {
        varint(FrameType.control.rawValue); varint(offset); varint(UInt64(data.count)); bytes(data)
    }

    public mutating func writeNewToken(_ token: UnsafeRawBufferPointer) {
        varint(FrameType.newToken.rawValue); varint(UInt64(token.count)); bytes(token)
    }

    public mutating func writeNewConnectionID(sequence: UInt64, retirePriorTo: UInt64, id: ConnectionID,
                                              resetToken: UnsafeRawBufferPointer) {
        precondition(resetToken.count == 16, "stateless reset tokens are 16 bytes")
        varint(FrameType.newConnectionID.rawValue); varint(sequence); varint(retirePriorTo)
        u8(UInt8(ConnectionID.length)); uint(id.value, ConnectionID.length); bytes(resetToken)
    }

    public mutating func writeRetireConnectionID(sequence: UInt64) {
        varint(FrameType.retireConnectionID.rawValue); varint(sequence)
    }

    public mutating func writePathChallenge(_ data: UInt64) { varint(FrameType.pathChallenge.rawValue); uint(data, 8) }

    public mutating func writePathResponse(_ data: UInt64) { varint(FrameType.pathResponse.rawValue); uint(data, 8) }

    public mutating func writeConnectionClose(code: UInt64, reason: String, application: Bool = false) {
        varint(application ? FrameType.applicationClose.rawValue : FrameType.connectionClose.rawValue); varint(code)
        var reason = reason
        reason.withUTF8 { utf8 in varint(UInt64(utf8.count)); bytes(UnsafeRawBufferPointer(utf8)) }
    }

    public mutating func writeHandshakeDone() { varint(FrameType.handshakeDone.rawValue) }

    /// A DATAGRAM frame. `last: true` omits the length: the datagram runs to the end of the packet,
    /// which saves a byte or two on every audio packet.
    public mutating func writeDatagram(_ data: UnsafeRawBufferPointer, last: Bool) {
        if last {
            varint(FrameType.datagram.rawValue)
        } else {
            varint(FrameType.datagramWithLength.rawValue); varint(UInt64(data.count))
        }
        bytes(data)
    }
}
