import Foundation
import SwiftASN1
@_spi(FixedExpiryValidationTime) import X509

/// What the client must check before it finishes a handshake: the server's chain, and the name it
/// dialled. Certificate validation in swift-certificates is async, so the sans-I/O connection hands
/// this out and waits for `Connection.completeCertificateCheck` instead of calling it itself.
public struct CertificateCheck: Sendable, Equatable {
    public var chain: [[UInt8]]
    public var serverName: String
}

/// Validates server chains against pinned CA certificates (from certs/), with RFC 5280 rules and the
/// server name or IP checked against the leaf's subject alternative names.
public struct CertificateValidator: Sendable {
    public let roots: [Certificate]

    public init(roots: [Certificate]) { self.roots = roots }

    /// Why a CA file gave no roots, said as the file's problem: a `HandshakeFailure` here read as
    /// "the server sent a certificate that cannot be parsed", though nothing had been sent yet.
    public struct CAFileProblem: Error, Sendable, CustomStringConvertible {
        public let description: String
    }

    public init(caPEM: String) throws {
        let documents: [PEMDocument]
        do { documents = try PEMDocument.parseMultiple(pemString: caPEM) } catch {
            throw CAFileProblem(description: "it is not PEM text (\(error))")
        }
        let kinds = Set(documents.map(\.discriminator)).sorted()
        do {
            roots = try documents.filter { $0.discriminator == "CERTIFICATE" }.map { try Certificate(pemDocument: $0) }
        } catch {
            throw CAFileProblem(description: "a certificate in it can't be read (\(error))")
        }
        guard !roots.isEmpty else {
            throw CAFileProblem(description: kinds.isEmpty ? "it holds no PEM block"
                : "it holds \(kinds.joined(separator: ", ")) but no CERTIFICATE: is it a key rather than the CA certificate?")
        }
    }

    /// Validates at wall-clock time `time`. Distinct failures: untrusted chain, expired, wrong name.
    public func validate(_ check: CertificateCheck, at time: Date = Date()) async -> Result<Void, HandshakeFailure> {
        let chain: [Certificate]
        do { chain = try check.chain.map { try Certificate(derEncoded: $0) } } catch {
            return .failure(.unreadableCertificate(reason: "\(error)"))
        }
        guard let leaf = chain.first else { return .failure(.unreadableCertificate(reason: "empty chain")) }
        // Dates first: an expired certificate from the right CA should say "expired", not "untrusted".
        for certificate in chain {
            if time > certificate.notValidAfter {
                return .failure(.certificateExpired(subject: "\(certificate.subject)", notValidAfter: certificate.notValidAfter))
            }
            if time < certificate.notValidBefore {
                return .failure(.certificateNotYetValid(subject: "\(certificate.subject)", notValidBefore: certificate.notValidBefore))
            }
        }
        let isIP = check.serverName.contains(":") || check.serverName.allSatisfy { $0.isNumber || $0 == "." }
        let store = CertificateStore(roots)
        let intermediates = CertificateStore(chain.dropFirst())
        var full = Verifier(rootCertificates: store) {
            RFC5280Policy(fixedExpiryValidationTime: time)
            ServerIdentityPolicy(serverHostname: isIP ? nil : check.serverName, serverIP: isIP ? check.serverName : nil)
        }
        if case .validCertificate = await full.validate(leaf: leaf, intermediates: intermediates) {
            return Self.mayServe(leaf) ? .success(()) : .failure(.notForServers(subject: "\(leaf.subject)"))
        }
        // Tell a wrong name apart from a wrong CA: does the chain validate without the name?
        var chainOnly = Verifier(rootCertificates: store) { RFC5280Policy(fixedExpiryValidationTime: time) }
        if case .validCertificate = await chainOnly.validate(leaf: leaf, intermediates: intermediates) {
            return .failure(.wrongServerName(expected: check.serverName))
        }
        return .failure(.untrustedCertificate(issuer: "\(leaf.issuer)"))
    }

    /// Whether the leaf's extended key usage lets it identify a server (RFC 5280 §4.2.1.12): no EKU
    /// at all, serverAuth, or anyExtendedKeyUsage. Without this check a client certificate, or a
    /// code-signing one, from the same CA could stand in for the server.
    static func mayServe(_ leaf: Certificate) -> Bool {
        do {
            guard let usage = try leaf.extensions.extendedKeyUsage else { return true }
            return usage.contains(.serverAuth) || usage.contains(.any)
        } catch {
            return false  // an EKU that can't be read grants nothing
        }
    }
}
