import Crypto
import Foundation

/// Why a handshake failed. Each case names what an operator can check; the client reports exactly one.
public enum HandshakeFailure: Error, Sendable, Hashable, CustomStringConvertible {
    /// The chain does not lead to the pinned CA.
    case untrustedCertificate(issuer: String)
    /// The leaf (or an intermediate) is past its notAfter, or before its notBefore, at validation time.
    case certificateExpired(subject: String, notValidAfter: Date)
    case certificateNotYetValid(subject: String, notValidBefore: Date)
    /// The certificate is trusted but not issued for the name or address the client dialled.
    case wrongServerName(expected: String)
    /// The certificate is trusted, but its extended key usage excludes serving (a client certificate).
    case notForServers(subject: String)
    case unreadableCertificate(reason: String)
    /// The CertificateVerify signature does not match the certificate's key and the transcript.
    case badSignature
    /// A Finished MAC did not verify: the peer does not hold the handshake keys.
    case badFinished
    /// The X25519 exchange produced the all-zero secret: the peer sent a low-order point.
    case zeroSharedSecret
    /// The peer offered nothing this side accepts, or picked what was not offered.
    case noCommonSuite
    case versionMismatch(offered: [UInt32], chosen: UInt32)
    case unexpectedMessage(String)
    case malformed(String)
    case transportParameters(String)

    public var description: String {
        switch self {
        case .untrustedCertificate(let issuer):
            return "the server's certificate (issued by \(issuer)) does not chain to the pinned CA; pass the CA that signed the server certificate (--ca)"
        case .certificateExpired(let subject, let date):
            return "the server's certificate \(subject) expired on \(date.formatted(.iso8601)); the server operator must renew it"
        case .certificateNotYetValid(let subject, let date):
            return "the server's certificate \(subject) is not valid until \(date.formatted(.iso8601)); check this machine's clock"
        case .wrongServerName(let expected):
            return "the server's certificate is not issued for \(expected); connect with the name in its certificate, or reissue it with that name"
        case .notForServers(let subject):
            return "the server's certificate \(subject) is not for servers (its extended key usage lacks serverAuth); the server operator must use a certificate issued with extendedKeyUsage=serverAuth"
        case .unreadableCertificate(let reason):
            return "the server sent a certificate that cannot be parsed: \(reason)"
        case .badSignature:
            return "the server's handshake signature does not verify; the connection may be intercepted"
        case .badFinished:
            return "the handshake Finished check failed; the connection may be intercepted"
        case .zeroSharedSecret:
            return "the peer sent an invalid key share (all-zero shared secret)"
        case .noCommonSuite:
            return "no common cipher suite"
        case .versionMismatch(let offered, let chosen):
            return "protocol version mismatch: offered \(offered.map { String($0, radix: 16) }), chosen \(String(chosen, radix: 16))"
        case .unexpectedMessage(let what):
            return "unexpected handshake message: \(what)"
        case .malformed(let what):
            return "malformed handshake message: \(what)"
        case .transportParameters(let what):
            return "bad transport parameters: \(what)"
        }
    }
}

/// A running SHA-256 over the handshake messages as framed on the wire.
struct Transcript {
    private var hash = SHA256()
    mutating func add(_ message: [UInt8]) { hash.update(data: message) }
    var current: [UInt8] { Array(hash.finalize()) }
}

/// The secrets of the handshake (docs/protocol.md §6). A TLS 1.3 schedule without PSKs.
enum HandshakeCrypto {
    static let zeros = [UInt8](repeating: 0, count: 32)
    static let emptyHash = Array(SHA256.hash(data: [UInt8]()))
    static let certificateVerifyContext = Array("squelch-wire server CertificateVerify".utf8)

    /// X25519, refusing the all-zero result (swift-crypto's BoringSSL backend does not refuse it).
    static func sharedSecret(_ key: Curve25519.KeyAgreement.PrivateKey, peerShare: [UInt8]) throws(HandshakeFailure) -> [UInt8] {
        guard let peer = try? Curve25519.KeyAgreement.PublicKey(rawRepresentation: peerShare),
              let secret = try? key.sharedSecretFromKeyAgreement(with: peer) else { throw .malformed("key share") }
        let bytes = secret.withUnsafeBytes { Array($0) }
        var accumulated: UInt8 = 0
        for b in bytes { accumulated |= b }  // constant time: no early exit
        guard accumulated != 0 else { throw .zeroSharedSecret }
        return bytes
    }

    struct Secrets {
        var handshake: [UInt8]
        var clientHandshake: [UInt8]
        var serverHandshake: [UInt8]
    }

    static func handshakeSecrets(shared: [UInt8], helloHash: [UInt8]) -> Secrets {
        let early = KeySchedule.extract(salt: zeros, inputKeyMaterial: zeros)
        let hs = KeySchedule.extract(salt: KeySchedule.derive(early, "derived", transcriptHash: emptyHash), inputKeyMaterial: shared)
        return Secrets(handshake: hs,
                       clientHandshake: KeySchedule.derive(hs, "c hs traffic", transcriptHash: helloHash),
                       serverHandshake: KeySchedule.derive(hs, "s hs traffic", transcriptHash: helloHash))
    }

    static func applicationSecrets(handshake: [UInt8], serverFinishedHash: [UInt8]) -> (client: [UInt8], server: [UInt8]) {
        let master = KeySchedule.extract(salt: KeySchedule.derive(handshake, "derived", transcriptHash: emptyHash), inputKeyMaterial: zeros)
        return (KeySchedule.derive(master, "c ap traffic", transcriptHash: serverFinishedHash),
                KeySchedule.derive(master, "s ap traffic", transcriptHash: serverFinishedHash))
    }

    static func finished(baseSecret: [UInt8], transcriptHash: [UInt8]) -> [UInt8] {
        let key = KeySchedule.expandLabel(baseSecret, "finished", length: 32)
        return Array(HMAC<SHA256>.authenticationCode(for: transcriptHash, using: SymmetricKey(data: key)))
    }

    static func finishedIsValid(_ mac: [UInt8], baseSecret: [UInt8], transcriptHash: [UInt8]) -> Bool {
        let key = KeySchedule.expandLabel(baseSecret, "finished", length: 32)
        return HMAC<SHA256>.isValidAuthenticationCode(mac, authenticating: transcriptHash, using: SymmetricKey(data: key))
    }

    /// What CertificateVerify signs: 64 spaces, the context string, a zero byte, the transcript hash.
    static func certificateVerifyContent(transcriptHash: [UInt8]) -> [UInt8] {
        [UInt8](repeating: 0x20, count: 64) + certificateVerifyContext + [0] + transcriptHash
    }
}
