import Crypto
import Foundation
import SwiftASN1
import X509

/// The server's certificate chain and the private key that matches its leaf. The handshake signs with
/// the key and sends the chain; clients check the chain against their pinned CA.
///
/// Loading checks everything an operator can get wrong before any client sees it: a file that holds
/// no certificate, a key for another certificate, an expired certificate.
public struct ServerIdentity: Sendable {
    /// Leaf first, then intermediates.
    public let chain: [Certificate]
    public let privateKey: Certificate.PrivateKey
    /// The same key, as the P-256 signing key the handshake's CertificateVerify uses.
    public let signingKey: P256.Signing.PrivateKey
    /// The chain as DER, leaf first, as the Certificate handshake message carries it.
    public let derChain: [[UInt8]]

    public var leaf: Certificate { chain[0] }

    public enum LoadError: Error, Sendable, Hashable, CustomStringConvertible {
        case noCertificate(source: String)
        case unreadableCertificate(source: String, reason: String)
        case unreadableKey(source: String, reason: String)
        case keyDoesNotMatch(certificateSource: String, keySource: String)
        case expired(source: String, notValidAfter: Date)
        case notYetValid(source: String, notValidBefore: Date)
        /// The chain doesn't fit the handshake's Certificate message (more certificates, or more
        /// bytes, than it carries).
        case chainTooLarge(source: String, detail: String)

        public var description: String {
            switch self {
            case .noCertificate(let source):
                return "\(source) holds no PEM certificate; pass the server's certificate chain (make certs writes certs/server-chain.pem)"
            case .unreadableCertificate(let source, let reason):
                return "\(source) is not a readable certificate: \(reason)"
            case .unreadableKey(let source, let reason):
                return "\(source) is not a readable private key (PEM, PKCS#8 or SEC1, P-256): \(reason)"
            case .keyDoesNotMatch(let cert, let key):
                return "the private key in \(key) does not belong to the certificate in \(cert); pass the key that was made with it"
            case .chainTooLarge(let source, let detail):
                return "the certificate chain in \(source) is too large for the handshake (\(detail)); pass the leaf and the intermediates the clients need, not the root or a bundle"
            case .expired(let source, let date):
                return "the certificate in \(source) expired on \(date); renew it (for development: ./certs/make-dev-certs.sh --force)"
            case .notYetValid(let source, let date):
                return "the certificate in \(source) is not valid until \(date); check the machine's clock"
            }
        }
    }

    /// What went wrong parsing, without the input: SwiftASN1's errors carry the whole document, and
    /// a private key printed in a startup error ends up in journald and log shipping.
    static func reason(_ error: any Error) -> String {
        if let asn1 = error as? ASN1Error { return "\(asn1.code)" }
        return "\(type(of: error))"
    }

    /// Parses a PEM chain and key. `now` is a parameter so that tests can move through time.
    public init(chainPEM: String, keyPEM: String, chainSource: String = "certificate", keySource: String = "key",
                now: Date = Date()) throws(LoadError) {
        let documents: [PEMDocument]
        do { documents = try PEMDocument.parseMultiple(pemString: chainPEM) } catch {
            throw .unreadableCertificate(source: chainSource, reason: Self.reason(error))
        }
        var chain: [Certificate] = []
        for document in documents where document.discriminator == "CERTIFICATE" {
            do { chain.append(try Certificate(pemDocument: document)) } catch {
                throw .unreadableCertificate(source: chainSource, reason: Self.reason(error))
            }
        }
        guard let leaf = chain.first else { throw .noCertificate(source: chainSource) }
        let key: Certificate.PrivateKey
        do { key = try Certificate.PrivateKey(pemEncoded: keyPEM) } catch {
            throw .unreadableKey(source: keySource, reason: Self.reason(error))
        }
        let signingKey: P256.Signing.PrivateKey
        do { signingKey = try P256.Signing.PrivateKey(pemRepresentation: keyPEM) } catch {
            throw .unreadableKey(source: keySource, reason: "the handshake needs an ECDSA P-256 key (\(Self.reason(error)))")
        }
        guard key.publicKey == leaf.publicKey else { throw .keyDoesNotMatch(certificateSource: chainSource, keySource: keySource) }
        guard now <= leaf.notValidAfter else { throw .expired(source: chainSource, notValidAfter: leaf.notValidAfter) }
        guard now >= leaf.notValidBefore else { throw .notYetValid(source: chainSource, notValidBefore: leaf.notValidBefore) }
        var derChain: [[UInt8]] = []
        for certificate in chain {
            var serializer = DER.Serializer()
            do { try serializer.serialize(certificate) } catch {
                throw .unreadableCertificate(source: chainSource, reason: Self.reason(error))
            }
            derChain.append(serializer.serializedBytes)
        }
        // Checked here rather than found at the first ClientHello: the Certificate message can't carry
        // more, and encoding it would trap on every handshake.
        if derChain.count > HandshakeMessage.maximumCertificateChain {
            throw .chainTooLarge(source: chainSource, detail: "\(derChain.count) certificates; the handshake carries at most \(HandshakeMessage.maximumCertificateChain)")
        }
        let messageBytes = 1 + derChain.reduce(0) { $0 + 3 + $1.count }
        if messageBytes > HandshakeMessage.maximumLength {
            throw .chainTooLarge(source: chainSource, detail: "\(messageBytes) bytes; the handshake carries at most \(HandshakeMessage.maximumLength)")
        }
        self.chain = chain
        self.privateKey = key
        self.signingKey = signingKey
        self.derChain = derChain
    }

    /// Reads the chain and key from files.
    public static func load(chainPath: String, keyPath: String, now: Date = Date()) throws(LoadError) -> ServerIdentity {
        func read(_ path: String, flag: String, _ failure: (String, String) -> LoadError) throws(LoadError) -> String {
            do throws(PEMText.Problem) { return try PEMText.read(path) } catch {
                switch error {
                case .missing: throw failure(path, "no such file; run 'make certs' for development certificates, or pass --\(flag) PATH")
                case .directory: throw failure(path, "it is a directory; pass the PEM file with --\(flag) PATH")
                case .unreadable: throw failure(path, "it cannot be read (check its permissions)")
                case .notText: throw failure(path, "it is not a PEM file (it isn't text); pass the PEM file with --\(flag) PATH")
                }
            }
        }
        return try ServerIdentity(chainPEM: try read(chainPath, flag: "cert", LoadError.unreadableCertificate),
                                  keyPEM: try read(keyPath, flag: "key", LoadError.unreadableKey),
                                  chainSource: chainPath, keySource: keyPath, now: now)
    }

    /// The DNS names and IP addresses the leaf is valid for (its subject alternative names; clients
    /// check the name they connect to against these), IP addresses in their usual text form.
    public var names: [String] {
        guard let alternatives = try? leaf.extensions.subjectAlternativeNames else { return [] }
        return alternatives.compactMap { name in
            switch name {
            case .dnsName(let dns): return dns
            case .ipAddress(let octets):
                let bytes = Array(octets.bytes)
                guard bytes.count == 4 || bytes.count == 16 else { return nil }
                var text = [CChar](repeating: 0, count: Int(INET6_ADDRSTRLEN))
                let family = bytes.count == 4 ? AF_INET : AF_INET6
                guard inet_ntop(family, bytes, &text, socklen_t(text.count)) != nil else { return nil }
                return String(decoding: text.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
            default: return nil
            }
        }
    }

    /// Names the leaf for logs: subject and expiry.
    public var summary: String {
        "\(leaf.subject) (expires \(leaf.notValidAfter.formatted(.iso8601)))"
    }
}
