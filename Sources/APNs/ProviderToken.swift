import Foundation
import JWTKit

/// When to mint a new provider JWT, as pure state (reference §3.4).
///
/// APNs rejects a JWT older than an hour and punishes one that changes more than once in 20 minutes on a
/// connection. One JWT serves every connection of the client, so reusing it for 50 minutes keeps both rules
/// on every connection at once.
public struct ProviderTokenSchedule: Sendable, Equatable {
    public var refreshAfter: Duration
    public private(set) var issuedAt: Date?
    public private(set) var generation = 0

    public init(refreshAfter: Duration = .seconds(50 * 60)) {
        self.refreshAfter = refreshAfter
    }

    public func needsNewToken(now: Date) -> Bool {
        guard let issuedAt else { return true }
        return now.timeIntervalSince(issuedAt) >= refreshAfter.seconds || now < issuedAt
    }

    /// Whether a forced refresh (after `ExpiredProviderToken`) should mint: only if the rejected JWT is still
    /// the current one. Many pushes that failed together must not each mint their own.
    public func shouldReplace(generation rejected: Int) -> Bool { rejected == generation }

    public mutating func issued(at date: Date) {
        issuedAt = date
        generation += 1
    }
}

extension Duration {
    var seconds: Double {
        let (s, attoseconds) = components
        return Double(s) + Double(attoseconds) / 1e18
    }
}

/// The APNs provider identity: a `.p8` signing key with its key ID and team ID.
public struct APNsProviderIdentity: Sendable {
    public var keyID: String
    public var teamID: String
    public var privateKeyPEM: String

    public init(keyID: String, teamID: String, privateKeyPEM: String) {
        self.keyID = keyID
        self.teamID = teamID
        self.privateKeyPEM = privateKeyPEM
    }

    /// Reads an Apple `.p8` file.
    public static func load(p8Path: String, keyID: String, teamID: String) throws(APNsConfigurationError) -> APNsProviderIdentity {
        guard let pem = try? String(contentsOfFile: p8Path, encoding: .utf8) else {
            throw .unreadableKey(path: p8Path)
        }
        return APNsProviderIdentity(keyID: keyID, teamID: teamID, privateKeyPEM: pem)
    }
}

/// Mints and caches the provider JWT (`{alg: ES256, kid}` and `{iss, iat}`), following `ProviderTokenSchedule`.
actor ProviderTokenSigner {
    struct Claims: JWTPayload {
        var iss: IssuerClaim
        var iat: IssuedAtClaim
        func verify(using algorithm: some JWTAlgorithm) throws {}
    }

    private let identity: APNsProviderIdentity
    private let keys: JWTKeyCollection
    private let now: @Sendable () -> Date
    private var schedule: ProviderTokenSchedule
    private var current: String?

    init(identity: APNsProviderIdentity, refreshAfter: Duration, now: @escaping @Sendable () -> Date) async throws(APNsConfigurationError) {
        self.identity = identity
        self.now = now
        schedule = ProviderTokenSchedule(refreshAfter: refreshAfter)
        let keys = JWTKeyCollection()
        do {
            let key = try ES256PrivateKey(pem: identity.privateKeyPEM)
            await keys.add(ecdsa: key, kid: JWKIdentifier(string: identity.keyID))
        } catch {
            throw .invalidKey(String(describing: error))
        }
        self.keys = keys
        guard identity.keyID.count == 10, identity.teamID.count == 10 else {
            throw .invalidIdentifiers(keyID: identity.keyID, teamID: identity.teamID)
        }
    }

    /// The JWT to send now, and its generation (to pass back to `replace` if APNs calls it expired).
    func token() async throws -> (jwt: String, generation: Int) {
        if let minting { return try await minting.value }
        let date = now()
        if let current, !schedule.needsNewToken(now: date) { return (current, schedule.generation) }
        return try await mint(at: date)
    }

    /// Replaces the JWT APNs rejected as expired, unless another push already did.
    func replace(generation: Int) async throws -> (jwt: String, generation: Int) {
        if let minting { return try await minting.value }
        if let current, !schedule.shouldReplace(generation: generation) { return (current, schedule.generation) }
        return try await mint(at: now())
    }

    /// Signing suspends the actor, so callers arriving meanwhile wait for this one mint instead of each
    /// minting their own: two JWTs in a burst would be a provider-token change, which APNs punishes with
    /// `TooManyProviderTokenUpdates`.
    private var minting: Task<(jwt: String, generation: Int), any Error>?

    private func mint(at date: Date) async throws -> (jwt: String, generation: Int) {
        // iat is whole seconds; APNs compares it against its own clock.
        let claims = Claims(iss: IssuerClaim(value: identity.teamID), iat: IssuedAtClaim(value: Date(timeIntervalSince1970: date.timeIntervalSince1970.rounded(.down))))
        let keys = self.keys
        let kid = JWKIdentifier(string: identity.keyID)
        let shared = Task { () async throws -> (jwt: String, generation: Int) in
            let jwt = try await keys.sign(claims, kid: kid)
            return self.adopt(jwt, issuedAt: date)
        }
        minting = shared
        defer { minting = nil }
        return try await shared.value
    }

    private func adopt(_ jwt: String, issuedAt date: Date) -> (jwt: String, generation: Int) {
        current = jwt
        schedule.issued(at: date)
        return (jwt, schedule.generation)
    }
}
