import Crypto
import Foundation
import SwiftASN1
import Wire
import X509

// Test and benchmark support for the transport: an in-memory PKI. A library target rather than test
// code, so WireTests, WireNIOTests and squelch-bench share one copy. Never used by the products that
// ship (squelchd, walkie).

/// An in-memory CA and a server certificate signed by it, so each test controls names and dates.
public struct TestPKI: Sendable {
    public let caKey = P256.Signing.PrivateKey()
    public let ca: Certificate
    public let caName: DistinguishedName

    public init(name: String = "Squelch Test CA") throws {
        caName = try DistinguishedName { CommonName(name) }
        ca = try Certificate(
            version: .v3, serialNumber: .init(), publicKey: .init(caKey.publicKey),
            notValidBefore: Date().addingTimeInterval(-86_400), notValidAfter: Date().addingTimeInterval(86_400 * 365),
            issuer: caName, subject: caName, signatureAlgorithm: .ecdsaWithSHA256,
            extensions: try Certificate.Extensions {
                Critical(BasicConstraints.isCertificateAuthority(maxPathLength: nil))
                KeyUsage(keyCertSign: true)
            },
            issuerPrivateKey: .init(caKey))
    }

    public var validator: CertificateValidator { CertificateValidator(roots: [ca]) }

    /// A server identity for `names` (DNS names or IP literals), valid between the given dates (90
    /// days ahead by default: squelchd calls a certificate within 14 days of its end degraded).
    /// `usages`, when given, become the leaf's extended key usage (none by default, which allows any use).
    public func identity(names: [String] = ["localhost", "127.0.0.1"], notBefore: Date = Date().addingTimeInterval(-3_600),
                  notAfter: Date = Date().addingTimeInterval(86_400 * 90), usages: [ExtendedKeyUsage.Usage]? = nil) throws -> ServerIdentity {
        let key = P256.Signing.PrivateKey()
        let sans: [GeneralName] = names.map { name in
            if let ip = IPv4Address(name) { return .ipAddress(ASN1OctetString(contentBytes: ArraySlice(ip.bytes))) }
            return .dnsName(name)
        }
        let leaf = try Certificate(
            version: .v3, serialNumber: .init(), publicKey: .init(key.publicKey),
            notValidBefore: notBefore, notValidAfter: notAfter,
            issuer: caName, subject: try DistinguishedName { CommonName("squelchd test") },
            signatureAlgorithm: .ecdsaWithSHA256,
            extensions: try Certificate.Extensions {
                SubjectAlternativeNames(sans)
                if let usages { try ExtendedKeyUsage(usages) }
            },
            issuerPrivateKey: .init(caKey))
        return try ServerIdentity(chainPEM: try leaf.serializeAsPEM().pemString, keyPEM: key.pemRepresentation,
                                  now: notBefore.addingTimeInterval(1))
    }

    /// A client configuration trusting this CA, with a short handshake timeout so a failure can't
    /// stall a test.
    public func client(serverName: String = "localhost") -> ClientConfiguration {
        var connection = ConnectionConfiguration.client
        connection.handshakeTimeout = 5_000_000_000
        return ClientConfiguration(serverName: serverName, validator: validator, connection: connection)
    }

    public func secrets(identity: ServerIdentity? = nil, resetKey: SymmetricKey = SymmetricKey(size: .bits256)) throws -> ServerSecrets {
        ServerSecrets(identity: try identity ?? self.identity(), resetKey: resetKey)
    }
}

struct IPv4Address {
    let bytes: [UInt8]
    init?(_ text: String) {
        let parts = text.split(separator: ".").compactMap { UInt8($0) }
        guard parts.count == 4, text.split(separator: ".").count == 4 else { return nil }
        bytes = parts
    }
}

extension PathAddress {
    /// An IPv4 address from its four numbers.
    public static func v4(_ a: UInt8, _ b: UInt8, _ c: UInt8, _ d: UInt8, port: UInt16) -> PathAddress {
        PathAddress(ipv4: UInt32(a) << 24 | UInt32(b) << 16 | UInt32(c) << 8 | UInt32(d), port: port)
    }
}

