import Crypto
import Foundation
import SwiftASN1
import Testing
import X509
@testable import Wire

/// Makes a CA-signed P-256 leaf in memory, so each test controls validity dates and keys.
func makeLeaf(notBefore: Date = Date().addingTimeInterval(-3_600), notAfter: Date = Date().addingTimeInterval(86_400),
              names: [String] = ["localhost"]) throws -> (chainPEM: String, keyPEM: String) {
    let caKey = P256.Signing.PrivateKey()
    let leafKey = P256.Signing.PrivateKey()
    let caName = try DistinguishedName { CommonName("Test CA") }
    let leaf = try Certificate(
        version: .v3, serialNumber: .init(), publicKey: .init(leafKey.publicKey),
        notValidBefore: notBefore, notValidAfter: notAfter,
        issuer: caName, subject: try DistinguishedName { CommonName("squelchd test") },
        signatureAlgorithm: .ecdsaWithSHA256,
        extensions: try Certificate.Extensions { SubjectAlternativeNames(names.map { .dnsName($0) }) },
        issuerPrivateKey: .init(caKey))
    return (try leaf.serializeAsPEM().pemString, leafKey.pemRepresentation)
}

@Suite struct ServerIdentityTests {
    @Test func loadsAMatchingChainAndKey() throws {
        let (chain, key) = try makeLeaf()
        let identity = try ServerIdentity(chainPEM: chain, keyPEM: key)
        #expect(identity.chain.count == 1)
        #expect(identity.summary.contains("squelchd test"))
    }

    /// A damaged key file is refused without its contents: the parser's own error carries the whole
    /// document, and the message goes to the service's log.
    @Test func anUnreadableKeyOrCertificateIsReportedWithoutItsContents() throws {
        let (chain, key) = try makeLeaf()
        let body = key.split(separator: "\n")[1]
        for damaged in [key.replacingOccurrences(of: "-----END", with: "----END"), String(key.prefix(100))] {
            do {
                _ = try ServerIdentity(chainPEM: chain, keyPEM: damaged, keySource: "bad.key")
                Issue.record("a damaged key was accepted")
            } catch {
                #expect("\(error)".hasPrefix("bad.key is not a readable private key"), "\(error)")
                #expect(!"\(error)".contains(body.prefix(16)), "the key's contents are in the message: \(error)")
            }
        }
        let certificateBody = chain.split(separator: "\n")[1]
        do {
            _ = try ServerIdentity(chainPEM: String(chain.prefix(120)), keyPEM: key, chainSource: "bad.pem")
            Issue.record("a damaged certificate was accepted")
        } catch {
            #expect(!"\(error)".contains(certificateBody.prefix(16)), "\(error)")
        }
    }

    /// A chain the handshake's Certificate message can't carry is refused at load. It used to pass,
    /// and then every ClientHello trapped the server while encoding the message.
    @Test func aChainTooLargeForTheHandshakeIsRefusedAtLoad() throws {
        let (chain, key) = try makeLeaf()
        let nine = Array(repeating: chain, count: 9).joined(separator: "\n")
        let many = #expect(throws: ServerIdentity.LoadError.self) { try ServerIdentity(chainPEM: nine, keyPEM: key, chainSource: "chain.pem") }
        #expect("\(try #require(many))".contains("9 certificates; the handshake carries at most 8"))
        #expect(try ServerIdentity(chainPEM: Array(repeating: chain, count: 8).joined(separator: "\n"), keyPEM: key).derChain.count == 8)

        let names = (0..<700).map { "host-\($0).a-rather-long-subdomain.example.org" }
        let (bulky, bulkyKey) = try makeLeaf(names: names)
        let big = #expect(throws: ServerIdentity.LoadError.self) { try ServerIdentity(chainPEM: bulky, keyPEM: bulkyKey, chainSource: "big.pem") }
        #expect("\(try #require(big))".contains("the handshake carries at most 16384"), "\(String(describing: big))")
    }

    @Test func aKeyForAnotherCertificateIsRefused() throws {
        let (chain, _) = try makeLeaf()
        let otherKey = P256.Signing.PrivateKey().pemRepresentation
        #expect(throws: ServerIdentity.LoadError.keyDoesNotMatch(certificateSource: "certificate", keySource: "key")) {
            try ServerIdentity(chainPEM: chain, keyPEM: otherKey)
        }
    }

    @Test func anExpiredCertificateIsRefusedWithItsDate() throws {
        let (chain, key) = try makeLeaf(notBefore: Date().addingTimeInterval(-7_200), notAfter: Date().addingTimeInterval(-3_600))
        let error = #expect(throws: ServerIdentity.LoadError.self) { try ServerIdentity(chainPEM: chain, keyPEM: key) }
        #expect(String(describing: try #require(error)).contains("expired"))
    }

    @Test func textWithoutACertificateIsRefused() throws {
        let (_, key) = try makeLeaf()
        #expect(throws: ServerIdentity.LoadError.noCertificate(source: "certificate")) {
            try ServerIdentity(chainPEM: key, keyPEM: key)  // a key, not a certificate
        }
        #expect(throws: ServerIdentity.LoadError.self) { try ServerIdentity(chainPEM: "garbage", keyPEM: key) }
    }

    @Test func missingFilesSayHowToMakeThem() throws {
        let error = #expect(throws: ServerIdentity.LoadError.self) {
            try ServerIdentity.load(chainPath: "/nonexistent/server-chain.pem", keyPath: "/nonexistent/server.key")
        }
        #expect(String(describing: try #require(error)).contains("make certs"))
    }

    /// A file that is there but isn't a PEM file, or a directory: said as such, not as a permission problem.
    @Test func filesThatAreNotPEMSaySo() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("identity-\(UUID())").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let binary = directory + "/tone.wav"
        try Data([0x52, 0x49, 0x46, 0x46, 0xFF, 0xFE, 0x00, 0x80]).write(to: URL(fileURLWithPath: binary))
        for (path, expected) in [(binary, "it is not a PEM file (it isn't text)"), (directory, "it is a directory")] {
            let error = #expect(throws: ServerIdentity.LoadError.self) { try ServerIdentity.load(chainPath: path, keyPath: path) }
            let message = String(describing: try #require(error))
            #expect(message.contains(expected) && !message.contains("permissions"), "\(message)")
        }
    }
}
