// What an entry ticket holds (docs/protocol.md §7.8), as plain bytes before sealing. No imports: the
// entry-ticket fuzz target compiles this file alone.

/// The plaintext of an entry ticket: version 1, expiry (Unix milliseconds, 8 bytes), the pass key
/// (32 bytes), the client's host as the issuing node saw it (17 bytes: 1 for IPv6 or 0, then the
/// address's high and low 64 bits), the audience (the node it is for: length byte, bytes), then the
/// payload (the rest).
public struct EntryTicketContents: Equatable, Sendable {
    public static let version: UInt8 = 1
    public static let keyLength = 32
    public static let hostLength = 17
    public static let maximumAudience = 64

    public var expiresMilliseconds: UInt64
    public var key: [UInt8]
    public var host: [UInt8]
    public var audience: [UInt8]
    public var payload: [UInt8]

    public init(expiresMilliseconds: UInt64, key: [UInt8], host: [UInt8], audience: [UInt8], payload: [UInt8]) {
        self.expiresMilliseconds = expiresMilliseconds
        self.key = key
        self.host = host
        self.audience = audience
        self.payload = payload
    }

    /// Nil for a key that isn't 32 bytes, a host that isn't 17, or an audience over 64 bytes:
    /// nothing this side issues.
    public func encoded() -> [UInt8]? {
        guard key.count == Self.keyLength, host.count == Self.hostLength, audience.count <= Self.maximumAudience else { return nil }
        var bytes: [UInt8] = [Self.version]
        bytes.reserveCapacity(Self.fixedLength + audience.count + payload.count)
        Self.append(expiresMilliseconds, to: &bytes)
        bytes += key
        bytes += host
        bytes.append(UInt8(audience.count))
        bytes += audience
        bytes += payload
        return bytes
    }

    /// `value` as 8 bytes, most significant first (the expiry; a host's halves).
    static func append(_ value: UInt64, to bytes: inout [UInt8]) {
        for shift in stride(from: 56, through: 0, by: -8) { bytes.append(UInt8(truncatingIfNeeded: value >> UInt64(shift))) }
    }

    /// Version, expiry, key, host and the audience's length byte.
    public static let fixedLength = 1 + 8 + keyLength + hostLength + 1

    /// Nil for anything not laid out as `encoded` writes it: another version, too short, an audience
    /// longer than the bytes or than 64.
    public init?(parsing bytes: [UInt8]) {
        let fixed = Self.fixedLength
        guard bytes.count >= fixed, bytes[0] == Self.version else { return nil }
        var expires: UInt64 = 0
        for byte in bytes[1..<9] { expires = expires << 8 | UInt64(byte) }
        let audienceLength = Int(bytes[fixed - 1])
        guard audienceLength <= Self.maximumAudience, bytes.count >= fixed + audienceLength else { return nil }
        let hostStart = 9 + Self.keyLength
        self.init(expiresMilliseconds: expires, key: Array(bytes[9..<hostStart]), host: Array(bytes[hostStart..<(hostStart + Self.hostLength)]),
                  audience: Array(bytes[fixed..<(fixed + audienceLength)]), payload: Array(bytes[(fixed + audienceLength)...]))
    }
}
