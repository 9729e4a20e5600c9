import Crypto
import Foundation
import JWTKit
import KeyFiles
import ParticipantClaims

/// Why a token was refused. Each has its own code, which the server sends back to the client so
/// that the app can say what to do.
public enum TokenError: Error, Sendable, Equatable, CustomStringConvertible {
    case expired(at: Date)
    /// The signature is not the server's: altered, or signed by another key.
    case forged
    case malformed(String)
    case wrongChannel(tokenChannel: UUID, requested: UUID)
    /// Issued in the future by more than the allowed clock skew.
    case notYetValid(issuedAt: Date)
    /// An administrator revoked this token, or removed its member from the channel after it was issued.
    case revoked(at: Date, reason: String)

    /// Stable numeric code for the wire.
    public var code: UInt16 {
        switch self {
        case .expired: return 1
        case .forged: return 2
        case .malformed: return 3
        case .wrongChannel: return 4
        case .notYetValid: return 5
        case .revoked: return 14
        }
    }

    public var description: String {
        switch self {
        case .expired(let date): return "the participant token expired at \(date.formatted(.iso8601)); ask for a new one"
        case .forged: return "the participant token was not signed by this server; ask this server's operator for a token"
        case .malformed(let why): return "the participant token is not a valid token (\(why)); copy it again in full"
        case .wrongChannel(let token, let requested):
            return "the participant token is for channel \(token), not \(requested); use a token issued for this channel"
        case .notYetValid(let date): return "the participant token is not valid before \(date.formatted(.iso8601)); check the clocks"
        case .revoked(let date, let reason):
            return "the participant token was revoked at \(date.formatted(.iso8601)) (\(reason)); ask the channel's administrator for a new one"
        }
    }
}

/// The JSON payload of the JWT. Claim names follow RFC 7519 where one exists.
struct TokenPayload: JWTPayload {
    struct Attributes: Codable {
        var role: String?
        var priority: Int
        /// Absent from tokens issued before images, and from tokens without one.
        var image: String?
    }
    var sub: SubjectClaim
    var name: String
    var channel: String
    var capabilities: [String]
    var attributes: Attributes
    var exp: ExpirationClaim
    var iat: IssuedAtClaim
    var jti: IDClaim

    /// Time checks happen in `TokenAuthority.verify` against the caller's clock, so that each failure
    /// gets its own error and tests can move time.
    func verify(using algorithm: some JWTAlgorithm) throws {}
}

/// Issues and verifies participant tokens: ES256 JWTs signed by the server's token key.
public struct TokenAuthority: Sendable {
    let keys: JWTKeyCollection
    /// Keys that signed tokens before a rotation: verified against, never signed with.
    var previousKeys: [JWTKeyCollection] = []
    /// The public half, for operators who verify tokens elsewhere.
    public let publicKeyPEM: String
    /// Accepted clock difference between issuer and verifier.
    public var clockSkew: TimeInterval = 60
    /// The server-key name under which squelchd records `publicKeyPEM` at every start, so that
    /// `squelchd token issue` can refuse to sign with any other key.
    public static let publicKeyRecordName = "token-public-key"

    public init(privateKeyPEM: String) async throws {
        let key = try ES256PrivateKey(pem: privateKeyPEM)
        keys = JWTKeyCollection()
        await keys.add(ecdsa: key)
        publicKeyPEM = try P256.Signing.PrivateKey(pemRepresentation: privateKeyPEM).publicKey.pemRepresentation
    }

    /// The token key in `directory` (token-key.pem), made on first run and readable only by this user.
    ///
    /// An existing key is never replaced: every token issued with it would stop working. A key that
    /// can't be read is an error to fix, and a new key appears under its name all at once (written
    /// beside it, then linked), so a second process starting at the same moment reads the winner's.
    public static func loadOrCreate(in directory: String) async throws -> TokenAuthority {
        try await loadOrCreate(at: (directory as NSString).appendingPathComponent("token-key.pem"))
    }

    /// The token key at `path`, made (with its directory) if there is none yet. See `loadOrCreate(in:)`.
    public static func loadOrCreate(at path: String) async throws -> TokenAuthority {
        if FileManager.default.fileExists(atPath: path) { return try await load(path) }
        try FileManager.default.createDirectory(atPath: (path as NSString).deletingLastPathComponent, withIntermediateDirectories: true)
        let pem = P256.Signing.PrivateKey().pemRepresentation
        let outcome: KeyFiles.Outcome
        do { outcome = try KeyFiles.createOnce(at: path, contents: Array(pem.utf8)) } catch {
            throw TokenKeyError(message: error.description)
        }
        // Another process may have made the key a moment ago: then its key is the one to use.
        if outcome == .exists { return try await load(path) }
        return try await TokenAuthority(privateKeyPEM: pem)
    }

    /// The token key at `path`, which must exist: for a key that was configured, or that a tool
    /// other than the server must not make.
    public static func load(from path: String) async throws -> TokenAuthority {
        guard FileManager.default.fileExists(atPath: path) else {
            throw TokenKeyError(message: "there is no token key at \(path)")
        }
        return try await load(path)
    }

    static func load(_ path: String) async throws -> TokenAuthority {
        let pem: String
        do { pem = try String(contentsOfFile: path, encoding: .utf8) } catch {
            throw TokenKeyError(message: "cannot read \(path) (\(KeyFiles.problem(error, at: path))); run squelchd as the user that owns it, or fix its permissions (it must stay mode 600)")
        }
        do { return try await TokenAuthority(privateKeyPEM: pem) } catch {
            // Not the parser's own words ("invalidPEMDocument"): what the file should be, and what to do.
            throw TokenKeyError(message: "\(path) does not hold a P-256 private key in PEM ('-----BEGIN PRIVATE KEY-----' or 'EC PRIVATE KEY'); restore it from a backup (every issued token is signed with it)")
        }
    }

    /// This authority, also accepting tokens signed with the key at `path` (the key before a rotation),
    /// until they expire. It still signs with its own key only.
    public func accepting(previousKeyAt path: String) async throws -> TokenAuthority {
        guard FileManager.default.fileExists(atPath: path) else {
            throw TokenKeyError(message: "there is no previous token key at \(path)")
        }
        let pem: String
        do { pem = try String(contentsOfFile: path, encoding: .utf8) } catch {
            throw TokenKeyError(message: "cannot read the previous token key at \(path) (\(KeyFiles.problem(error, at: path))); restore the key the server used before the rotation")
        }
        let previous: TokenAuthority
        do { previous = try await TokenAuthority(privateKeyPEM: pem) } catch {
            throw TokenKeyError(message: "the previous token key at \(path) does not hold a P-256 private key in PEM; restore the key the server used before the rotation")
        }
        guard previous.publicKeyPEM != publicKeyPEM else {
            throw TokenKeyError(message: "the previous token key at \(path) is the current key; point it at the key used before the rotation")
        }
        var copy = self
        copy.previousKeys.append(previous.keys)
        return copy
    }

    /// Signs `claims`, which must pass `ParticipantClaims.validate()`.
    public func issue(_ claims: ParticipantClaims) async throws -> String {
        try claims.validate()
        let payload = TokenPayload(
            sub: .init(value: claims.userID), name: claims.name, channel: claims.channel.uuidString.lowercased(),
            capabilities: claims.capabilities.sorted().map(\.rawValue),
            attributes: .init(role: claims.role, priority: Int(claims.priority), image: claims.image),
            exp: .init(value: claims.expiresAt), iat: .init(value: claims.issuedAt), jti: .init(value: claims.tokenID))
        return try await keys.sign(payload)
    }

    /// Verifies `token` for `channel` at `now`. Revocation is the caller's to check (it lives in the
    /// store): see `ParticipantClaims.tokenID` and `issuedAt`.
    public func verify(_ token: String, channel: UUID, now: Date = Date()) async throws(TokenError) -> ParticipantClaims {
        let claims = try await inspect(token)
        guard claims.expiresAt > now else { throw .expired(at: claims.expiresAt) }
        guard claims.issuedAt <= now.addingTimeInterval(clockSkew) else { throw .notYetValid(issuedAt: claims.issuedAt) }
        guard claims.channel == channel else { throw .wrongChannel(tokenChannel: claims.channel, requested: channel) }
        return claims
    }

    /// The claims of a token this server signed, whatever its times and channel: for revoking a token,
    /// or telling an operator what one holds. `forged` or `malformed` otherwise.
    public func inspect(_ token: String) async throws(TokenError) -> ParticipantClaims {
        var payload: TokenPayload?
        for collection in [keys] + previousKeys where payload == nil {
            do { payload = try await collection.verify(token, as: TokenPayload.self) } catch let error as JWTError {
                // Not this key's signature: the next key may have made it.
                if error.errorType == .signatureVerificationFailed || error.errorType == .unknownKID { continue }
                throw .malformed(Self.readable(error))
            } catch {
                throw .malformed(Self.readable(error))
            }
        }
        guard let payload else { throw .forged }
        return try Self.claims(from: payload)
    }

    /// jwt-kit's reason in words for whoever pasted the token: a part that isn't base64url JSON comes
    /// back as Foundation's `DecodingError` dump, which says nothing to a user.
    static func readable(_ error: any Error) -> String {
        let reason = (error as? JWTError).map { $0.reason ?? "\($0.errorType)" } ?? "\(error)"
        // A JWT that is JSON but not ours (another service's): a claim missing, or of another kind.
        let notOurs = "it is a JWT but not a Squelch participant token"
        // Foundation describes it as "DecodingError.keyNotFound: Key 'name' not found …".
        if reason.contains("keyNotFound") {
            let name = reason.range(of: "Key '").map { reason[$0.upperBound...].prefix { $0 != "'" } }
            return "\(notOurs) (it has no \"\(name ?? "?")\" claim); get one from 'squelchd token issue' or the admin API"
        }
        if reason.contains("typeMismatch") || reason.contains("valueNotFound") {
            return "\(notOurs) (a claim holds the wrong kind of value); get one from 'squelchd token issue' or the admin API"
        }
        // jwt-kit's "Token is not split in 3 parts": not even the shape of a token.
        if reason.contains("split in 3 parts") {
            return "a token is three parts joined by dots, and this is not; it was probably cut short in copying, or is something else (a token id, a file name)"
        }
        if error is DecodingError || reason.contains("Couldn't decode") || reason.contains("DecodingError") {
            return "its parts are not base64url-encoded JSON; it was probably cut short or changed in copying"
        }
        return reason
    }

    /// What `token` states, read with jwt-kit's parser but without checking its signature, times or
    /// channel: for showing who a token is for and until when, or catching another user's token
    /// early. Never for trusting it: the server verifies (`verify`).
    public static func unverifiedClaims(of token: String) throws(TokenError) -> ParticipantClaims {
        let payload: TokenPayload
        do { payload = try DefaultJWTParser().parse(Array(token.utf8), as: TokenPayload.self).payload } catch let error as JWTError {
            throw .malformed(Self.readable(error))
        } catch {
            throw .malformed(Self.readable(error))
        }
        return try claims(from: payload)
    }

    static func claims(from payload: TokenPayload) throws(TokenError) -> ParticipantClaims {
        guard let tokenChannel = UUID(uuidString: payload.channel) else { throw .malformed("channel is not a UUID") }
        guard (0...255).contains(payload.attributes.priority) else { throw .malformed("priority must be 0–255") }
        var capabilities = Set<Capability>()
        for name in payload.capabilities {
            guard let capability = Capability(rawValue: name) else { throw .malformed("unknown capability '\(name)'") }
            capabilities.insert(capability)
        }
        let claims = ParticipantClaims(userID: payload.sub.value, name: payload.name, channel: tokenChannel, capabilities: capabilities,
                                       role: payload.attributes.role, image: payload.attributes.image,
                                       priority: UInt8(payload.attributes.priority),
                                       issuedAt: payload.iat.value, expiresAt: payload.exp.value, tokenID: payload.jti.value)
        do throws(InvalidClaims) { try claims.validate() } catch { throw .malformed(error.message) }
        return claims
    }
}

public struct TokenKeyError: Error, CustomStringConvertible {
    public let message: String
    public var description: String { message }
    public init(message: String) { self.message = message }
}

/// Parses a lifetime such as "90s", "30m", "12h" or "7d".
public func parseLifetime(_ text: String) -> TimeInterval? {
    guard let unit = text.last, let value = Double(text.dropLast()), value > 0, value.isFinite else { return nil }
    switch unit {
    case "s": return value
    case "m": return value * 60
    case "h": return value * 3_600
    case "d": return value * 86_400
    default: return nil
    }
}
