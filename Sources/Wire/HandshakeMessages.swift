// Handshake messages (docs/protocol.md §5), carried in CRYPTO frames. Each is framed as in TLS 1.3:
// type (1 byte), length (3 bytes), body. The transcript hash runs over these framed bytes exactly.
// This file needs only WireBytes.swift and Frames.swift, so the handshake fuzz target compiles it alone.

public enum HandshakeType: UInt8, Sendable {
    case clientHello = 1
    case serverHello = 2
    case encryptedExtensions = 8
    case certificate = 11
    case certificateVerify = 15
    case finished = 20
}

/// Transport parameters, exchanged in the ClientHello and the EncryptedExtensions and covered by the
/// transcript signature. IDs are QUIC's where QUIC has one.
public struct TransportParameters: Equatable, Sendable {
    public enum ID: UInt64 {
        case originalDestinationConnectionID = 0x00
        case maxIdleTimeout = 0x01
        case statelessResetToken = 0x02
        case maxUDPPayloadSize = 0x03
        case maxAckDelay = 0x0b
        case activeConnectionIDLimit = 0x0e
        case initialSourceConnectionID = 0x0f
        case retrySourceConnectionID = 0x10
        case maxDatagramFrameSize = 0x20
        /// Client: an entry pass (`EntryPass`): the ticket, then its 32-byte binder.
        case entryPass = 0x5351
        /// Server: the pass was honoured; what it carried is being answered already.
        case entryPassAccepted = 0x5352
    }

    /// Milliseconds; 0 means no idle timeout from this side. A received value above
    /// `maximumIdleTimeout` is taken as that.
    public var maxIdleTimeout: UInt64 = 0
    /// 2^32 ms, about 49 days.
    public static let maximumIdleTimeout: UInt64 = 1 << 32
    public var maxUDPPayloadSize: UInt64 = 1452
    public var maxAckDelay: UInt64 = 25
    public var activeConnectionIDLimit: UInt64 = 4
    public var maxDatagramFrameSize: UInt64 = 1200
    public var initialSourceConnectionID: ConnectionID?
    /// Server only.
    public var originalDestinationConnectionID: ConnectionID?
    public var retrySourceConnectionID: ConnectionID?
    public var statelessResetToken: [UInt8]?
    /// Client only: an entry pass's ticket followed by its binder (docs/protocol.md §7.8).
    public var entryPass: [UInt8]?
    /// Server only.
    public var entryPassAccepted = false

    /// The longest entry pass value taken: a ticket carries one join message, far smaller.
    public static let maximumEntryPass = 4_096
    /// HMAC-SHA256 (`EntryPass.binder`).
    public static let entryPassBinderLength = 32

    public init() {}

    public func encode(into writer: inout WireWriter) {
        func integer(_ id: ID, _ value: UInt64) {
            writer.varint(id.rawValue); writer.varint(UInt64(WireWriter.varintLength(value))); writer.varint(value)
        }
        func cid(_ id: ID, _ value: ConnectionID?) {
            guard let value else { return }
            writer.varint(id.rawValue); writer.varint(8); writer.uint(value.value, 8)
        }
        integer(.maxIdleTimeout, maxIdleTimeout)
        integer(.maxUDPPayloadSize, maxUDPPayloadSize)
        integer(.maxAckDelay, maxAckDelay)
        integer(.activeConnectionIDLimit, activeConnectionIDLimit)
        integer(.maxDatagramFrameSize, maxDatagramFrameSize)
        cid(.initialSourceConnectionID, initialSourceConnectionID)
        cid(.originalDestinationConnectionID, originalDestinationConnectionID)
        cid(.retrySourceConnectionID, retrySourceConnectionID)
        if let token = statelessResetToken {
            writer.varint(ID.statelessResetToken.rawValue); writer.varint(16); writer.bytes(token)
        }
        if let pass = entryPass {
            writer.varint(ID.entryPass.rawValue); writer.varint(UInt64(pass.count)); writer.bytes(pass)
        }
        if entryPassAccepted { integer(.entryPassAccepted, 1) }
    }

    /// Parses parameters; unknown IDs are skipped so that later versions can add some.
    public static func decode(_ reader: inout WireReader, end: Int) throws(WireParseError) -> TransportParameters {
        var params = TransportParameters()
        var seen: Set<UInt64> = []
        while reader.offset < end {
            let id = try reader.varint("transport parameter id")
            let length = try reader.varint("transport parameter length")
            let value = try reader.range(length, "transport parameter value")
            guard value.upperBound <= end else { throw .truncated(field: "transport parameters") }
            guard seen.insert(id).inserted else { throw .invalid(field: "duplicate transport parameter", value: id) }
            var field = WireReader(reader.bytes, offset: value.lowerBound)
            func integer() throws(WireParseError) -> UInt64 {
                let v = try field.varint("transport parameter integer")
                guard field.offset == value.upperBound else { throw .invalid(field: "transport parameter length", value: length) }
                return v
            }
            func cid() throws(WireParseError) -> ConnectionID {
                guard length == 8 else { throw .invalid(field: "connection ID parameter length", value: length) }
                return ConnectionID(try field.uint(8, "connection ID parameter"))
            }
            switch ID(rawValue: id) {
            case .maxIdleTimeout:
                // Clamped, not refused (RFC 9000 sets no maximum): nanoseconds of up to 2^62 ms would
                // overflow every deadline computed from it, and 49 days is as good as forever.
                params.maxIdleTimeout = min(try integer(), Self.maximumIdleTimeout)
            case .maxUDPPayloadSize:
                params.maxUDPPayloadSize = try integer()
                guard params.maxUDPPayloadSize >= 1200 else { throw .invalid(field: "max_udp_payload_size", value: params.maxUDPPayloadSize) }
            case .maxAckDelay:
                params.maxAckDelay = try integer()
                guard params.maxAckDelay < 1 << 14 else { throw .invalid(field: "max_ack_delay", value: params.maxAckDelay) }
            case .activeConnectionIDLimit:
                params.activeConnectionIDLimit = try integer()
                guard params.activeConnectionIDLimit >= 2 else { throw .invalid(field: "active_connection_id_limit", value: params.activeConnectionIDLimit) }
            case .maxDatagramFrameSize: params.maxDatagramFrameSize = try integer()
            case .initialSourceConnectionID: params.initialSourceConnectionID = try cid()
            case .originalDestinationConnectionID: params.originalDestinationConnectionID = try cid()
            case .retrySourceConnectionID: params.retrySourceConnectionID = try cid()
            case .statelessResetToken:
                guard length == 16 else { throw .invalid(field: "stateless_reset_token length", value: length) }
                params.statelessResetToken = Array(reader.bytes[value])
            case .entryPass:
                guard length > UInt64(entryPassBinderLength), length <= UInt64(maximumEntryPass) else {
                    throw .invalid(field: "entry_pass length", value: length)
                }
                params.entryPass = Array(reader.bytes[value])
            case .entryPassAccepted:
                guard try integer() == 1 else { throw .invalid(field: "entry_pass_accepted", value: 0) }
                params.entryPassAccepted = true
            case nil: break
            }
        }
        return params
    }
}

/// A decoded handshake message. Arrays here are copies: handshake messages are few and small.
public enum HandshakeMessage: Equatable, Sendable {
    public struct ClientHello: Equatable, Sendable {
        /// The version in the Initial's header, repeated so the signature covers it.
        public var version: UInt32
        /// Every version the client would speak: a downgrade by a forged Version Negotiation shows.
        public var offeredVersions: [UInt32]
        public var random: [UInt8]
        public var suites: [UInt16]
        public var keyShare: [UInt8]
        /// The name the client will check the certificate against (like TLS SNI).
        public var serverName: String
        public var parameters: TransportParameters
    }
    public struct ServerHello: Equatable, Sendable {
        public var version: UInt32
        public var random: [UInt8]
        public var suite: UInt16
        public var keyShare: [UInt8]
    }

    case clientHello(ClientHello)
    case serverHello(ServerHello)
    case encryptedExtensions(TransportParameters)
    /// DER certificates, leaf first.
    case certificate([[UInt8]])
    /// Signature scheme (0x0403, ECDSA P-256 SHA-256) and DER signature.
    case certificateVerify(scheme: UInt16, signature: [UInt8])
    case finished([UInt8])

    public static let ecdsaP256SHA256: UInt16 = 0x0403
    public static let maximumCertificateChain = 8
    /// Messages longer than this are refused: the largest legitimate one is a certificate chain.
    public static let maximumLength = 16 * 1024

    public var type: HandshakeType {
        switch self {
        case .clientHello: return .clientHello
        case .serverHello: return .serverHello
        case .encryptedExtensions: return .encryptedExtensions
        case .certificate: return .certificate
        case .certificateVerify: return .certificateVerify
        case .finished: return .finished
        }
    }

    /// The framed bytes: type, 24-bit length, body.
    public func encoded() -> [UInt8] {
        var body = [UInt8](repeating: 0, count: Self.maximumLength)
        let length = body.withUnsafeMutableBytes { buffer in
            var w = WireWriter(buffer)
            encodeBody(&w)
            return w.overflowed ? -1 : w.offset
        }
        precondition(length >= 0, "handshake message larger than \(Self.maximumLength) bytes")
        return [type.rawValue, UInt8(length >> 16), UInt8((length >> 8) & 0xFF), UInt8(length & 0xFF)] + body[0..<length]
    }

    private func encodeBody(_ w: inout WireWriter) {
        switch self {
        case .clientHello(let ch):
            w.u32(ch.version)
            // Counts are one byte: longer lists and names (never legitimate; DNS names stop at 253)
            // are cut rather than trapping, and the server's name check then fails cleanly.
            let versions = ch.offeredVersions.prefix(255), suites = ch.suites.prefix(255)
            w.u8(UInt8(versions.count)); for v in versions { w.u32(v) }
            w.bytes(ch.random)
            w.u8(UInt8(suites.count)); for s in suites { w.uint(UInt64(s), 2) }
            w.bytes(ch.keyShare)
            let name = Array(ch.serverName.utf8.prefix(255))
            w.u8(UInt8(name.count)); w.bytes(name)
            writeParameters(ch.parameters, &w)
        case .serverHello(let sh):
            w.u32(sh.version); w.bytes(sh.random); w.uint(UInt64(sh.suite), 2); w.bytes(sh.keyShare)
        case .encryptedExtensions(let params):
            writeParameters(params, &w)
        case .certificate(let chain):
            w.u8(UInt8(min(chain.count, HandshakeMessage.maximumCertificateChain)))
            let chain = chain.prefix(HandshakeMessage.maximumCertificateChain)
            for der in chain { w.uint(UInt64(der.count), 3); w.bytes(der) }
        case .certificateVerify(let scheme, let signature):
            w.uint(UInt64(scheme), 2); w.uint(UInt64(signature.count), 2); w.bytes(signature)
        case .finished(let mac):
            w.bytes(mac)
        }
    }

    private func writeParameters(_ params: TransportParameters, _ w: inout WireWriter) {
        let lengthAt = w.offset
        w.uint(0, 2)
        params.encode(into: &w)
        let length = w.offset - lengthAt - 2
        if !w.overflowed { w.buffer[lengthAt] = UInt8(length >> 8); w.buffer[lengthAt + 1] = UInt8(length & 0xFF) }
    }

    /// Decodes one framed message starting at the reader's offset. Throws on anything malformed,
    /// including trailing bytes inside the message.
    public static func decode(_ reader: inout WireReader) throws(WireParseError) -> HandshakeMessage {
        let rawType = try reader.u8("handshake type")
        let length = try reader.uint(3, "handshake length")
        guard length <= UInt64(maximumLength) else { throw .invalid(field: "handshake length", value: length) }
        let body = try reader.range(length, "handshake body")
        var r = WireReader(UnsafeRawBufferPointer(rebasing: reader.bytes[..<body.upperBound]), offset: body.lowerBound)
        let message: HandshakeMessage
        switch HandshakeType(rawValue: rawType) {
        case .clientHello:
            let version = try r.u32("version")
            let count = try r.u8("offered versions")
            guard count > 0 else { throw .invalid(field: "offered versions", value: 0) }
            var offered: [UInt32] = []
            for _ in 0..<count { offered.append(try r.u32("offered version")) }
            let random = try bytes(&r, 32, "client random")
            let suiteCount = try r.u8("suite count")
            guard suiteCount > 0 else { throw .invalid(field: "suite count", value: 0) }
            var suites: [UInt16] = []
            for _ in 0..<suiteCount { suites.append(UInt16(try r.uint(2, "suite"))) }
            let share = try bytes(&r, 32, "key share")
            let nameLength = try r.u8("server name length")
            let nameBytes = try bytes(&r, Int(nameLength), "server name")
            guard let name = String(validating: nameBytes, as: UTF8.self) else { throw .invalid(field: "server name", value: UInt64(nameLength)) }
            let params = try parameters(&r)
            message = .clientHello(.init(version: version, offeredVersions: offered, random: random, suites: suites,
                                         keyShare: share, serverName: name, parameters: params))
        case .serverHello:
            let version = try r.u32("version")
            let random = try bytes(&r, 32, "server random")
            let suite = UInt16(try r.uint(2, "suite"))
            let share = try bytes(&r, 32, "key share")
            message = .serverHello(.init(version: version, random: random, suite: suite, keyShare: share))
        case .encryptedExtensions:
            message = .encryptedExtensions(try parameters(&r))
        case .certificate:
            let count = try r.u8("certificate count")
            guard count > 0, Int(count) <= maximumCertificateChain else { throw .invalid(field: "certificate count", value: UInt64(count)) }
            var chain: [[UInt8]] = []
            for _ in 0..<count {
                let length = try r.uint(3, "certificate length")
                guard length > 0 else { throw .invalid(field: "certificate length", value: 0) }
                chain.append(Array(r.bytes[try r.range(length, "certificate")]))
            }
            message = .certificate(chain)
        case .certificateVerify:
            let scheme = UInt16(try r.uint(2, "signature scheme"))
            let length = try r.uint(2, "signature length")
            message = .certificateVerify(scheme: scheme, signature: Array(r.bytes[try r.range(length, "signature")]))
        case .finished:
            message = .finished(try bytes(&r, 32, "finished"))
        case nil:
            throw .invalid(field: "handshake type", value: UInt64(rawType))
        }
        guard r.isAtEnd else { throw .invalid(field: "handshake message trailing bytes", value: UInt64(r.remaining)) }
        return message
    }

    private static func bytes(_ r: inout WireReader, _ count: Int, _ field: StaticString) throws(WireParseError) -> [UInt8] {
        Array(r.bytes[try r.range(UInt64(count), field)])
    }

    private static func parameters(_ r: inout WireReader) throws(WireParseError) -> TransportParameters {
        let length = try r.uint(2, "transport parameters length")
        let range = try r.range(length, "transport parameters")
        var inner = WireReader(UnsafeRawBufferPointer(rebasing: r.bytes[..<range.upperBound]), offset: range.lowerBound)
        return try TransportParameters.decode(&inner, end: range.upperBound)
    }
}
