import CPacketCrypto
import Crypto

/// One SFrame key (RFC 9605 §4.4) in cipher suite AES_128_GCM_SHA256_128 (0x0004): the AEAD key and
/// salt derived from a base key and its KID, with a libcrypto context that seals or opens in place,
/// so that a frame costs no allocation.
///
/// A sealed frame is `header ‖ ciphertext ‖ 16-byte tag`; the associated data is `header ‖ metadata`,
/// where the metadata is whatever the application binds to the frame without sending it encrypted.
///
/// Not Sendable: one thread uses a key at a time (its owner holds it under a lock or on one thread).
public final class SFrameKey {
    /// AES_128_GCM_SHA256_128.
    public static let cipherSuite: UInt16 = 0x0004
    public static let baseKeyLength = 16
    public static let tagLength = 16
    /// Bytes a frame grows by when sealed, beyond its header.
    public static let overhead = tagLength

    public let keyID: UInt64
    public let sealing: Bool
    /// The derived AEAD key and salt (RFC 9605 `sframe_key`, `sframe_salt`), for test vectors.
    public let key: [UInt8]
    public let salt: [UInt8]
    private let aead: OpaquePointer
    /// Nonce (12 bytes) and associated data (header ‖ metadata, up to 17 + 64), allocated once.
    private let scratch: UnsafeMutableRawBufferPointer
    public static let maxMetadata = 64

    public enum KeyError: Error, Sendable, Equatable {
        case badBaseKey
        case setupFailed
    }

    public init(baseKey: [UInt8], keyID: UInt64, sealing: Bool) throws(KeyError) {
        guard baseKey.count == Self.baseKeyLength else { throw .badBaseKey }
        let secret = HKDF<SHA256>.extract(inputKeyMaterial: SymmetricKey(data: baseKey), salt: [UInt8]())
        var suffix = [UInt8]()
        for i in 0..<8 { suffix.append(UInt8(truncatingIfNeeded: keyID >> UInt64(56 - 8 * i))) }
        suffix += [UInt8(Self.cipherSuite >> 8), UInt8(truncatingIfNeeded: Self.cipherSuite)]
        func expand(_ label: String, _ length: Int) -> [UInt8] {
            HKDF<SHA256>.expand(pseudoRandomKey: secret, info: Array(label.utf8) + suffix, outputByteCount: length)
                .withUnsafeBytes { Array($0) }
        }
        key = expand("SFrame 1.0 Secret key ", 16)
        salt = expand("SFrame 1.0 Secret salt ", 12)
        guard let aead = key.withUnsafeBufferPointer({ sq_aead_new(1, $0.baseAddress, $0.count, sealing ? 1 : 0) })
        else { throw .setupFailed }
        self.aead = aead
        self.keyID = keyID
        self.sealing = sealing
        scratch = .allocate(byteCount: 12 + SFrameHeader.maxSize + Self.maxMetadata, alignment: 8)
    }

    deinit {
        sq_aead_free(aead)
        scratch.deallocate()
    }

    /// Writes the nonce (salt XOR the counter, big-endian in the low bytes) and `header ‖ metadata`
    /// into the scratch space; returns the associated data's length.
    private func prepare(counter: UInt64, header: UnsafeRawBufferPointer, metadata: UnsafeRawBufferPointer) -> Int {
        for i in 0..<12 {
            let counterByte = i < 4 ? 0 : UInt8(truncatingIfNeeded: counter >> UInt64(8 * (11 - i)))
            scratch[i] = salt[i] ^ counterByte
        }
        UnsafeMutableRawBufferPointer(rebasing: scratch[12 ..< 12 + header.count]).copyMemory(from: header)
        UnsafeMutableRawBufferPointer(rebasing: scratch[(12 + header.count)...]).copyMemory(from: metadata)
        return header.count + metadata.count
    }

    /// Seals the plaintext in `frame[headerSize ..< frame.count - 16]` in place behind a header for
    /// `counter`, which it writes at the start of `frame`, and writes the tag in the last 16 bytes.
    /// The caller sizes `frame` as `SFrameHeader(keyID:counter:).size + plaintext + 16` and puts the
    /// plaintext after the header. False if the sizes don't fit or libcrypto failed.
    public func seal(_ frame: UnsafeMutableRawBufferPointer, counter: UInt64, metadata: UnsafeRawBufferPointer) -> Bool {
        let header = SFrameHeader(keyID: keyID, counter: counter)
        let headerSize = header.size
        guard sealing, metadata.count <= Self.maxMetadata, frame.count >= headerSize + Self.tagLength else { return false }
        header.write(to: frame)
        let aadCount = prepare(counter: counter, header: UnsafeRawBufferPointer(rebasing: frame[..<headerSize]), metadata: metadata)
        let base = frame.baseAddress!.assumingMemoryBound(to: UInt8.self)
        let nonce = scratch.baseAddress!.assumingMemoryBound(to: UInt8.self)
        let tagStart = frame.count - Self.tagLength
        return sq_aead_seal(aead, nonce, nonce + 12, aadCount, base + headerSize, tagStart - headerSize, base + tagStart) == 1
    }

    /// Opens a sealed frame in place: on success the plaintext is `frame[headerSize ..< frame.count - 16]`.
    /// False when the frame is not this key's, was forged or damaged, or is too short.
    public func open(_ frame: UnsafeMutableRawBufferPointer, metadata: UnsafeRawBufferPointer) -> (header: SFrameHeader, headerSize: Int)? {
        guard !sealing, metadata.count <= Self.maxMetadata,
              let (header, headerSize) = SFrameHeader.parse(UnsafeRawBufferPointer(frame)),
              header.keyID == keyID, frame.count >= headerSize + Self.tagLength else { return nil }
        let aadCount = prepare(counter: header.counter, header: UnsafeRawBufferPointer(rebasing: frame[..<headerSize]), metadata: metadata)
        let base = frame.baseAddress!.assumingMemoryBound(to: UInt8.self)
        let nonce = scratch.baseAddress!.assumingMemoryBound(to: UInt8.self)
        let tagStart = frame.count - Self.tagLength
        guard sq_aead_open(aead, nonce, nonce + 12, aadCount, base + headerSize, tagStart - headerSize, base + tagStart) == 1
        else { return nil }
        return (header, headerSize)
    }
}
