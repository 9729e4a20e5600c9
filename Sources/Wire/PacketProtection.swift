import CPacketCrypto
import Crypto

/// The AEAD suites this protocol offers. Exactly two, both with SHA-256 for the key schedule; there is
/// nothing weaker to fall back to. Codes are TLS 1.3's.
public enum CipherSuite: UInt16, Sendable, CaseIterable {
    case aes128GCMSHA256 = 0x1301
    case chacha20Poly1305SHA256 = 0x1303

    /// AEAD and header-protection key length in bytes.
    public var keyLength: Int { self == .aes128GCMSHA256 ? 16 : 32 }
    fileprivate var cSuite: Int32 { self == .aes128GCMSHA256 ? 1 : 2 }

    /// Failed decryptions tolerated under one key before the connection closes (RFC 9001 §6.6), and
    /// packets sealed under one key before a key update is forced (AES-GCM: 2²³, with margin).
    public var integrityLimit: UInt64 { self == .aes128GCMSHA256 ? 1 << 52 : 1 << 36 }
    public var confidentialityLimit: UInt64 { self == .aes128GCMSHA256 ? 1 << 23 : 1 << 62 }
}

/// The key schedule: TLS 1.3's HKDF-Expand-Label with SHA-256 and this protocol's label prefix, so that
/// no key derived here can collide with a TLS or QUIC key.
public enum KeySchedule {
    public static let labelPrefix = "squelch1 "
    /// Salt for the Initial secret: the first 20 bytes of SHA-256("squelch-wire v1 initial salt").
    public static let initialSalt: [UInt8] = [
        0x03, 0x04, 0x7a, 0x37, 0x6c, 0x67, 0x66, 0xdd, 0xcc, 0x37,
        0xc9, 0x7f, 0xf2, 0x99, 0x5f, 0xcf, 0xca, 0x51, 0xca, 0x3e,
    ]

    public static func extract(salt: [UInt8], inputKeyMaterial: [UInt8]) -> [UInt8] {
        let prk = HKDF<SHA256>.extract(inputKeyMaterial: SymmetricKey(data: inputKeyMaterial), salt: salt)
        return prk.withUnsafeBytes { Array($0) }
    }

    /// HKDF-Expand-Label(secret, label, context, length).
    public static func expandLabel(_ secret: [UInt8], _ label: String, context: [UInt8] = [], length: Int) -> [UInt8] {
        let full = Array((labelPrefix + label).utf8)
        var info: [UInt8] = [UInt8(length >> 8), UInt8(length & 0xFF), UInt8(full.count)]
        info += full
        info.append(UInt8(context.count))
        info += context
        let key = HKDF<SHA256>.expand(pseudoRandomKey: SymmetricKey(data: secret), info: info, outputByteCount: length)
        return key.withUnsafeBytes { Array($0) }
    }

    /// Derive-Secret(secret, label, transcriptHash).
    public static func derive(_ secret: [UInt8], _ label: String, transcriptHash: [UInt8]) -> [UInt8] {
        expandLabel(secret, label, context: transcriptHash, length: 32)
    }

    /// The client's and server's Initial secrets, from the client's first destination connection ID.
    /// They only obfuscate: anyone who sees the packet can compute them.
    public static func initialSecrets(clientDestination: ConnectionID) -> (client: [UInt8], server: [UInt8]) {
        let initial = extract(salt: initialSalt, inputKeyMaterial: clientDestination.bytes)
        return (expandLabel(initial, "client in", length: 32), expandLabel(initial, "server in", length: 32))
    }

    /// The next generation of a traffic secret, for key update.
    public static func nextGeneration(_ secret: [UInt8]) -> [UInt8] {
        expandLabel(secret, "ku", length: 32)
    }
}

extension ConnectionID {
    /// Big-endian bytes, as on the wire.
    public var bytes: [UInt8] { (0..<8).map { UInt8(truncatingIfNeeded: value >> UInt64(56 - 8 * $0)) } }
}

/// Why sealing failed. Only a programming error (a buffer too small) or libcrypto running out of
/// memory can cause it.
public enum PacketProtectionError: Error, Sendable, Equatable {
    case keySetupFailed
    case sealFailed
}

/// One direction's keys for one key phase: an AEAD context with the key schedule already run, the IV,
/// and the header-protection context. Sealing and opening work in place in the caller's buffer, so
/// protecting a packet allocates nothing.
///
/// Not Sendable: a key belongs to one connection, which lives on one event loop.
public final class PacketKey {
    public let suite: CipherSuite
    public let secret: [UInt8]
    public let sealing: Bool
    private let aead: OpaquePointer
    private let headerProtection: OpaquePointer
    /// IV bytes 0–3 and 4–11; the packet number is XORed into the low 8 bytes.
    private let ivHigh: UInt32
    private let ivLow: UInt64
    /// Scratch for nonce (12) and mask (5), allocated once with the key.
    private let scratch: UnsafeMutableRawPointer
    /// Packets sealed, or failed openings, under this key.
    @exclusivity(unchecked) public private(set) var uses: UInt64 = 0

    public let key: [UInt8]
    public let iv: [UInt8]
    public let hpKey: [UInt8]

    /// Derives key, IV and header-protection key from `secret`. The header-protection key can be
    /// carried over from an earlier generation: key update never changes it.
    public init(secret: [UInt8], suite: CipherSuite, sealing: Bool, hpKey: [UInt8]? = nil) throws(PacketProtectionError) {
        let key = KeySchedule.expandLabel(secret, "key", length: suite.keyLength)
        let iv = KeySchedule.expandLabel(secret, "iv", length: 12)
        let hp = hpKey ?? KeySchedule.expandLabel(secret, "hp", length: suite.keyLength)
        guard let aead = key.withUnsafeBufferPointer({ sq_aead_new(suite.cSuite, $0.baseAddress, $0.count, sealing ? 1 : 0) })
        else { throw .keySetupFailed }
        guard let hpContext = hp.withUnsafeBufferPointer({ sq_hp_new(suite.cSuite, $0.baseAddress, $0.count) }) else {
            sq_aead_free(aead)
            throw .keySetupFailed
        }
        self.suite = suite
        self.secret = secret
        self.sealing = sealing
        self.aead = aead
        self.headerProtection = hpContext
        self.key = key
        self.iv = iv
        self.hpKey = hp
        ivHigh = iv[0..<4].reduce(0) { $0 << 8 | UInt32($1) }
        ivLow = iv[4..<12].reduce(0) { $0 << 8 | UInt64($1) }
        scratch = .allocate(byteCount: 32, alignment: 8)
    }

    deinit {
        sq_aead_free(aead)
        sq_hp_free(headerProtection)
        scratch.deallocate()
    }

    /// The key for the next key phase.
    public func nextGeneration() throws(PacketProtectionError) -> PacketKey {
        try PacketKey(secret: KeySchedule.nextGeneration(secret), suite: suite, sealing: sealing, hpKey: hpKey)
    }

    private func writeNonce(packetNumber: UInt64) {
        let low = ivLow ^ packetNumber
        for i in 0..<4 { scratch.storeBytes(of: UInt8(truncatingIfNeeded: ivHigh >> UInt32(24 - 8 * i)), toByteOffset: i, as: UInt8.self) }
        for i in 0..<8 { scratch.storeBytes(of: UInt8(truncatingIfNeeded: low >> UInt64(56 - 8 * i)), toByteOffset: 4 + i, as: UInt8.self) }
    }

    /// Seals `packet[payloadStart..<payloadEnd]` in place and writes the 16-byte tag after it. The
    /// bytes before `payloadStart` (the header, packet number unprotected) are the associated data.
    public func seal(_ packet: UnsafeMutableRawBufferPointer, payloadStart: Int, payloadEnd: Int,
                     packetNumber: UInt64) throws(PacketProtectionError) {
        guard sealing, payloadEnd + 16 <= packet.count, payloadStart <= payloadEnd else { throw .sealFailed }
        writeNonce(packetNumber: packetNumber)
        let base = packet.baseAddress!.assumingMemoryBound(to: UInt8.self)
        let ok = sq_aead_seal(aead, scratch.assumingMemoryBound(to: UInt8.self), base, payloadStart,
                              base + payloadStart, payloadEnd - payloadStart, base + payloadEnd)
        guard ok == 1 else { throw .sealFailed }
        uses += 1
    }

    /// Opens `packet[payloadStart..<tagStart]` in place against the tag at `tagStart`. False when the
    /// packet was forged or damaged; the caller drops it.
    public func open(_ packet: UnsafeMutableRawBufferPointer, payloadStart: Int, tagStart: Int, packetNumber: UInt64) -> Bool {
        guard !sealing, payloadStart <= tagStart, tagStart + 16 <= packet.count else { return false }
        writeNonce(packetNumber: packetNumber)
        let base = packet.baseAddress!.assumingMemoryBound(to: UInt8.self)
        let ok = sq_aead_open(aead, scratch.assumingMemoryBound(to: UInt8.self), base, payloadStart,
                              base + payloadStart, tagStart - payloadStart, base + tagStart) == 1
        if !ok { uses += 1 }
        return ok
    }

    /// The 5-byte header-protection mask for the 16-byte ciphertext sample at `sampleOffset`.
    /// Returns the mask packed into a UInt64 (byte 0 in the top byte), or nil if libcrypto failed.
    public func headerMask(_ packet: UnsafeRawBufferPointer, sampleOffset: Int) -> UInt64? {
        guard sampleOffset >= 0, sampleOffset + 16 <= packet.count else { return nil }
        let sample = (packet.baseAddress! + sampleOffset).assumingMemoryBound(to: UInt8.self)
        let mask = (scratch + 16).assumingMemoryBound(to: UInt8.self)
        guard sq_hp_mask(headerProtection, sample, mask) == 1 else { return nil }
        var packed: UInt64 = 0
        for i in 0..<5 { packed = packed << 8 | UInt64(mask[i]) }
        return packed << 24
    }
}
