import Foundation
import JWTKit
import Logging

/// When to mint a new provider JWT for one connection, as pure state.
///
/// APNs rejects a JWT older than an hour and punishes one that changes more than once in 20 minutes on a
/// connection. Each connection has its own JWT, minted when the connection first sends and replaced every
/// 50 minutes, so both rules hold on every connection whenever it opened. (One JWT shared by the pool
/// did not: a connection opened 45 minutes into its life had to change it 5 minutes later.)
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

/// Mints and caches the provider JWT (`{alg: ES256, kid}` and `{iss, iat}`) of each connection, following
/// `ProviderTokenSchedule`.
actor ProviderTokenSigner {
    struct Claims: JWTPayload {
        var iss: IssuerClaim
        var iat: IssuedAtClaim
        func verify(using algorithm: some JWTAlgorithm) throws {}
    }

    private let identity: APNsProviderIdentity
    private let keys: JWTKeyCollection
    let now: @Sendable () -> Date
    let refreshAfter: Duration
    /// With a share (a cluster), one JWT for every connection of every node: `ProviderTokenSigner+Shared`.
    let share: (any ProviderTokenShare)?
    let logger: Logger
    var shareKey: String { "\(identity.teamID).\(identity.keyID)" }
    /// The cluster's JWT as last read (`firstUse` unused), the read under way, and each connection's.
    var shared: SharedTokenUse?
    var sharedRefresh: Task<SharedTokenUse, any Error>?
    var uses: [Int: SharedTokenUse] = [:]
    var shareRetryAt: Date?

    struct Entry {
        var schedule: ProviderTokenSchedule
        var current: String?
        /// Signing suspends the actor, so pushes on this connection arriving meanwhile wait for this one
        /// mint instead of each minting their own: two JWTs in a burst would be a provider-token change,
        /// which APNs punishes with `TooManyProviderTokenUpdates`.
        var minting: Task<(jwt: String, generation: Int), any Error>?
    }

    /// By connection id. Entries whose JWT is over an hour old (its connection is gone, or mints anew)
    /// are dropped at the next mint.
    private var entries: [Int: Entry] = [:]

    init(identity: APNsProviderIdentity, refreshAfter: Duration, share: (any ProviderTokenShare)? = nil,
         logger: Logger = Logger(label: "squelch.apns"), now: @escaping @Sendable () -> Date) async throws(APNsConfigurationError) {
        self.identity = identity
        self.share = share
        self.logger = logger
        self.now = now
        self.refreshAfter = refreshAfter
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

    /// The JWT to send on connection `connection` now, and its generation (to pass back to `replace` if
    /// APNs calls it expired).
    func token(for connection: Int) async throws -> (jwt: String, generation: Int) {
        if share != nil { return try await sharedToken(for: connection) }
        if let minting = entries[connection]?.minting { return try await minting.value }
        let date = now()
        if let entry = entries[connection], let current = entry.current, !entry.schedule.needsNewToken(now: date) {
            return (current, entry.schedule.generation)
        }
        return try await mint(for: connection, at: date)
    }

    /// Replaces the JWT APNs rejected as expired on `connection`, unless another push already did.
    func replace(generation: Int, for connection: Int) async throws -> (jwt: String, generation: Int) {
        if share != nil { return try await replaceShared(generation: generation, for: connection) }
        if let minting = entries[connection]?.minting { return try await minting.value }
        if let entry = entries[connection], let current = entry.current, !entry.schedule.shouldReplace(generation: generation) {
            return (current, entry.schedule.generation)
        }
        return try await mint(for: connection, at: now())
    }

    /// How many connections have a JWT cached (for tests).
    var cachedConnections: Int { share == nil ? entries.count : uses.count }

    private func mint(for connection: Int, at date: Date) async throws -> (jwt: String, generation: Int) {
        // A JWT over an hour old is of no use to anyone: its connection is gone or will mint anew.
        entries = entries.filter { _, entry in
            entry.minting != nil || entry.schedule.issuedAt.map { date.timeIntervalSince($0) < 3_600 } ?? false
        }
        let shared = Task { () async throws -> (jwt: String, generation: Int) in
            let jwt = try await self.sign(issuedAt: date)
            return self.adopt(jwt, for: connection, issuedAt: date)
        }
        entries[connection, default: Entry(schedule: ProviderTokenSchedule(refreshAfter: refreshAfter))].minting = shared
        defer { entries[connection]?.minting = nil }
        return try await shared.value
    }

    /// A new JWT issued at `date`.
    func sign(issuedAt date: Date) async throws -> String {
        // iat is whole seconds; APNs compares it against its own clock.
        let claims = Claims(iss: IssuerClaim(value: identity.teamID), iat: IssuedAtClaim(value: Date(timeIntervalSince1970: date.timeIntervalSince1970.rounded(.down))))
        return try await keys.sign(claims, kid: JWKIdentifier(string: identity.keyID))
    }

    private func adopt(_ jwt: String, for connection: Int, issuedAt date: Date) -> (jwt: String, generation: Int) {
        var entry = entries[connection] ?? Entry(schedule: ProviderTokenSchedule(refreshAfter: refreshAfter))
        entry.current = jwt
        entry.schedule.issued(at: date)
        entries[connection] = entry
        return (jwt, entry.schedule.generation)
    }
}

extension APNsProviderIdentity {
    /// One provider JWT issued at `date`, signed as the client signs its own: for tools that send the
    /// same request by other means (the benchmark's `h2load` run).
    public func providerToken(issuedAt date: Date = Date()) async throws -> String {
        try await ProviderTokenSigner(identity: self, refreshAfter: .seconds(3_000), now: { date }).sign(issuedAt: date)
    }
}
