import Crypto
import Foundation
import ParticipantClaims
import Testing
@testable import ParticipantTokens

@Suite struct ParticipantTokenTests {
    let channel = UUID()
    let now = Date(timeIntervalSince1970: 1_800_000_000)

    func authority() async throws -> TokenAuthority {
        try await TokenAuthority(privateKeyPEM: P256.Signing.PrivateKey().pemRepresentation)
    }

    func claims(expiresIn: TimeInterval = 3_600, capabilities: Set<Capability> = [.talk, .listen]) -> ParticipantClaims {
        ParticipantClaims(userID: "u-17", name: "Dispatch 1", channel: channel, capabilities: capabilities, role: "dispatcher",
                          priority: 200, issuedAt: now, expiresAt: now.addingTimeInterval(expiresIn), tokenID: "t-1")
    }

    @Test func aTokenRoundTripsEveryClaim() async throws {
        let authority = try await authority()
        let token = try await authority.issue(claims())
        #expect(token.split(separator: ".").count == 3)
        let verified = try await authority.verify(token, channel: channel, now: now.addingTimeInterval(10))
        #expect(verified.userID == "u-17" && verified.name == "Dispatch 1" && verified.channel == channel)
        #expect(verified.capabilities == [.talk, .listen] && verified.role == "dispatcher" && verified.priority == 200)
        #expect(verified.tokenID == "t-1")
        #expect(abs(verified.expiresAt.timeIntervalSince(now.addingTimeInterval(3_600))) < 1)
        // The header says ES256.
        let header = try #require(Data(base64Encoded: String(token.split(separator: ".")[0]) + "=="))
        #expect(String(decoding: header, as: UTF8.self).contains("ES256"))
    }

    /// A picture rides in the token's attributes; a token without one (or from before them) has none,
    /// and only an https URL of a bounded length is signed.
    @Test func aTokenCarriesAnHTTPSPicture() async throws {
        let authority = try await authority()
        var pictured = claims()
        pictured.image = "https://example.org/u-17.png"
        let verified = try await authority.verify(try await authority.issue(pictured), channel: channel, now: now)
        #expect(verified.image == "https://example.org/u-17.png")
        #expect(try await authority.verify(try await authority.issue(claims()), channel: channel, now: now).image == nil)
        for bad in ["http://example.org/a.png", "file:///etc/passwd", "data:image/png;base64,AAAA", "https://",
                    "https://example.org/" + String(repeating: "a", count: ParticipantClaims.maxImageBytes)] {
            var wrong = claims()
            wrong.image = bad
            #expect(throws: InvalidClaims.self, "\(bad)") { try wrong.validate() }
        }
        var wrong = claims()
        wrong.image = "ftp://example.org/a.png"
        do { try wrong.validate() } catch { #expect(error.message.contains("is not an https URL"), "\(error)") }
    }

    @Test func aClientReadsATokensUserWithoutTheJWTLibrary() async throws {
        let authority = try await authority()
        // A user id whose JSON and base64 need the url-safe alphabet and padding to come back whole.
        var claims = claims()
        claims.userID = "ünit-7/?>~"
        let token = try await authority.issue(claims)
        #expect(UnverifiedToken.subject(of: token) == "ünit-7/?>~")
        #expect(UnverifiedToken.subject(of: token) == (try TokenAuthority.unverifiedClaims(of: token)).userID)
        for garbage in ["", "abc", "a.b.c", "YWJj.YWJj.YWJj", token + ".x", "e30.e30.e30"] {  // e30: "{}", no sub
            #expect(UnverifiedToken.subject(of: garbage) == nil, "\(garbage)")
        }
    }

    @Test func eachRefusalHasItsOwnErrorAndCode() async throws {
        let authority = try await authority()
        let token = try await authority.issue(claims(expiresIn: 60))
        await #expect(throws: TokenError.expired(at: now.addingTimeInterval(60))) {
            try await authority.verify(token, channel: channel, now: now.addingTimeInterval(61))
        }
        let other = UUID()
        await #expect(throws: TokenError.wrongChannel(tokenChannel: channel, requested: other)) {
            try await authority.verify(token, channel: other, now: now)
        }
        let stranger = try await self.authority()
        await #expect(throws: TokenError.forged) { try await stranger.verify(token, channel: channel, now: now) }
        // A changed payload with the old signature.
        var parts = token.split(separator: ".").map(String.init)
        parts[1] = Data(#"{"sub":"admin"}"#.utf8).base64EncodedString().replacingOccurrences(of: "=", with: "")
        await #expect(throws: TokenError.forged) { try await authority.verify(parts.joined(separator: "."), channel: channel, now: now) }
        for garbage in ["", "abc", "a.b.c", "YWJj.YWJj.YWJj", String(repeating: "x", count: 5000)] {
            let error = await #expect(throws: TokenError.self) { try await authority.verify(garbage, channel: channel, now: now) }
            if case .malformed = error {} else { Issue.record("\(garbage.prefix(10)): \(String(describing: error))") }
            // Said in words, not as a decoder's dump.
            #expect(!"\(error.map(String.init(describing:)) ?? "")".contains("DecodingError"), "\(String(describing: error))")
        }
        // Not three parts: said as what a token looks like, not as jwt-kit's "not split in 3 parts".
        for shapeless in ["abc", "a.b", "sq_3f9a0c1b"] {
            let error = #expect(throws: TokenError.self) { try TokenAuthority.unverifiedClaims(of: shapeless) }
            let text = "\(error.map(String.init(describing:)) ?? "")"
            #expect(text.contains("three parts joined by dots") && !text.contains("split in 3"), "\(text)")
        }
        // Another service's JWT: JSON, but without Squelch's claims.
        let foreign = [#"{"alg":"ES256","typ":"JWT"}"#, #"{"sub":"x","exp":2000000000}"#]
            .map { Data($0.utf8).base64EncodedString().replacingOccurrences(of: "=", with: "").replacingOccurrences(of: "+", with: "-")
                .replacingOccurrences(of: "/", with: "_") }.joined(separator: ".") + ".c2ln"
        let error = #expect(throws: TokenError.self) { try TokenAuthority.unverifiedClaims(of: foreign) }
        #expect("\(error.map(String.init(describing:)) ?? "")".contains("not a Squelch participant token (it has no"), "\(String(describing: error))")
        #expect(throws: TokenError.malformed("its parts are not base64url-encoded JSON; it was probably cut short or changed in copying")) {
            try TokenAuthority.unverifiedClaims(of: "YWJj.YWJj.YWJj")  // base64url of "abc", not JSON
        }
        await #expect(throws: TokenError.notYetValid(issuedAt: now)) {
            try await authority.verify(token, channel: channel, now: now.addingTimeInterval(-3_600))
        }
        let codes = [TokenError.expired(at: now), .forged, .malformed(""), .wrongChannel(tokenChannel: channel, requested: channel), .notYetValid(issuedAt: now)].map(\.code)
        #expect(Set(codes).count == codes.count)
    }

    @Test func aRotationAcceptsThePreviousKeysTokensAndSignsWithTheNewKey() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("rotation-\(UUID())").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let old = try await TokenAuthority.loadOrCreate(in: directory + "/old")
        let oldToken = try await old.issue(claims())
        let new = try await TokenAuthority.loadOrCreate(in: directory + "/new")
        await #expect(throws: TokenError.forged) { try await new.verify(oldToken, channel: channel, now: now) }
        let rotating = try await new.accepting(previousKeyAt: directory + "/old/token-key.pem")
        #expect(try await rotating.verify(oldToken, channel: channel, now: now).userID == "u-17")
        // New tokens carry the new key's signature: the old key alone refuses them.
        let newToken = try await rotating.issue(claims())
        #expect(try await new.verify(newToken, channel: channel, now: now).userID == "u-17")
        await #expect(throws: TokenError.forged) { try await old.verify(newToken, channel: channel, now: now) }
        // The previous key does not widen anything else: a stranger's token is still forged, and an
        // old token still expires and still names its channel.
        let strangerToken = try await self.authority().issue(claims())
        await #expect(throws: TokenError.forged) { try await rotating.verify(strangerToken, channel: channel, now: now) }
        await #expect(throws: TokenError.expired(at: now.addingTimeInterval(3_600))) {
            try await rotating.verify(oldToken, channel: channel, now: now.addingTimeInterval(3_601))
        }
        // Mistakes an operator can make get a message, not a key accepted twice.
        await #expect(throws: TokenKeyError.self) { try await new.accepting(previousKeyAt: directory + "/missing.pem") }
        await #expect(throws: TokenKeyError.self) { try await new.accepting(previousKeyAt: directory + "/new/token-key.pem") }
    }

    @Test func theKeyIsMadeOnceAndKeptPrivate() async throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("tokens-\(UUID())").path
        let first = try await TokenAuthority.loadOrCreate(in: dir)
        let token = try await first.issue(claims())
        let second = try await TokenAuthority.loadOrCreate(in: dir)
        #expect(try await second.verify(token, channel: channel, now: now).userID == "u-17", "tokens survive a restart")
        let attributes = try FileManager.default.attributesOfItem(atPath: dir + "/token-key.pem")
        #expect((attributes[.posixPermissions] as? Int) == 0o600)
        try "not a key".write(toFile: dir + "/token-key.pem", atomically: true, encoding: .utf8)
        let error = await #expect(throws: TokenKeyError.self) { try await TokenAuthority.loadOrCreate(in: dir) }
        // What the file should hold and what to do, not the parser's case name.
        #expect("\(error!)".contains("restore it from a backup") && !"\(error!)".contains("invalidPEM"), "\(error!)")
    }

    @Test func anUnreadableKeyIsAnErrorNeverReplaced() async throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("tokens-\(UUID())").path
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        // Not UTF-8: the old code took an unreadable key for a missing one and wrote a new key over it.
        let damaged = Data([0xFF, 0xFE, 0x00, 0x2D])
        try damaged.write(to: URL(fileURLWithPath: dir + "/token-key.pem"))
        let error = await #expect(throws: TokenKeyError.self) { try await TokenAuthority.loadOrCreate(in: dir) }
        #expect("\(error!)".contains("cannot read"))
        #expect(try Data(contentsOf: URL(fileURLWithPath: dir + "/token-key.pem")) == damaged)
    }

    @Test func processesStartingTogetherShareOneKey() async throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("tokens-\(UUID())").path
        let keys = try await withThrowingTaskGroup(of: String.self) { group in
            for _ in 0..<8 { group.addTask { try await TokenAuthority.loadOrCreate(in: dir).publicKeyPEM } }
            return try await group.reduce(into: Set<String>()) { $0.insert($1) }
        }
        #expect(keys.count == 1)
        let left = try FileManager.default.contentsOfDirectory(atPath: dir)
        #expect(left == ["token-key.pem"], "no temporary files left behind: \(left)")
    }

    /// Issuing is stricter than verifying: a name that displays as something else, or as nothing, is
    /// refused when signed, while tokens already out keep joining.
    @Test func issuingRefusesNamesThatDoNotReadAsWhatTheyAre() throws {
        func claims(user: String = "u1", name: String = "Ann", role: String? = nil) -> ParticipantClaims {
            ParticipantClaims(userID: user, name: name, channel: UUID(), capabilities: [.listen], role: role, expiresAt: Date().addingTimeInterval(60))
        }
        try claims().validateForIssue()
        try claims(name: "Anne-Marie O’Brien", role: "dispatcher").validateForIssue()
        // Right-to-left scripts, CJK and emoji are names like any other.
        try claims(name: "نور", role: "מוקדן").validateForIssue()
        try claims(name: "李雷 👩‍🚒").validateForIssue()
        for bad in [claims(name: "Ann\u{202E}nimda"), claims(name: "Ann\u{2066}x"), claims(role: "a\u{2028}b"),
                    claims(user: "\u{3000}"), claims(name: " Ann"), claims(user: "u1\u{202D}"), claims(name: "\u{200B}\u{3164}")] {
            #expect(throws: InvalidClaims.self) { try bad.validateForIssue() }
        }
        // What verification checks is unchanged: such a token, already issued, still reads as valid.
        try claims(name: "Ann\u{202E}nimda").validate()
    }

    @Test func lifetimesParse() {
        #expect(parseLifetime("12h") == 43_200)
        #expect(parseLifetime("30m") == 1_800)
        #expect(parseLifetime("7d") == 604_800)
        #expect(parseLifetime("90s") == 90)
        for bad in ["", "h", "12", "-1h", "12y", "nanh", "infh"] { #expect(parseLifetime(bad) == nil, "\(bad)") }
    }
}
