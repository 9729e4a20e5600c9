import Foundation

/// The provider JWT a cluster's nodes share, as read from where they share it.
public struct SharedProviderToken: Sendable, Equatable {
    public var jwt: String
    /// Its age when read, by the sharing side's clock (the database's), never a node's.
    public var age: Duration

    public init(jwt: String, age: Duration) {
        self.jwt = jwt
        self.age = age
    }
}

/// Where the nodes of a cluster keep the one provider JWT they all send (squelchd: PostgreSQL).
///
/// Apple counts provider-token refreshes per team: nodes that each minted their own every 50 minutes
/// would refresh it several times in 20 minutes and get `429 TooManyProviderTokenUpdates`. With a share,
/// one node mints when the shared JWT is due, and the others adopt it.
public protocol ProviderTokenShare: Sendable {
    /// The JWT stored for `key` (team and key ID), or nil if none is.
    func current(key: String) async throws -> SharedProviderToken?
    /// Stores `new` in place of `replacing` (nil: in place of none) unless another node replaced it
    /// first, and returns the JWT in force afterwards, whichever node's it is.
    func replace(key: String, replacing: String?, with new: String) async throws -> SharedProviderToken
}

/// Which shared JWT one connection sends, as pure state.
///
/// APNs rejects a JWT changed on a connection less than 20 minutes after the connection first sent the
/// previous one, and a JWT over an hour old. A connection keeps the JWT it started with until the
/// shared one is newer and 20 minutes have passed; a connection opened late in a JWT's life that would
/// need to change sooner (its JWT nearly an hour old) is retired instead: a new connection may start
/// with any JWT.
struct SharedTokenUse: Equatable {
    /// The JWT and its generation (the signer's count of shared JWTs seen).
    var jwt: String
    var generation: Int
    /// When the shared JWT was issued, by this node's clock (now minus the age it was read with).
    var issuedAt: Date
    /// When this connection first sent it.
    var firstUse: Date

    static let minimumChangeInterval: TimeInterval = 20 * 60
    /// Past this age a JWT is not sent: APNs's limit is an hour, and clocks differ by a few minutes.
    static let usableAge: TimeInterval = 55 * 60

    enum Decision: Equatable {
        case send(SharedTokenUse)
        /// Take the connection out of the pool; the push goes on another one.
        case retire
    }

    /// What connection with `use` (nil: it has not sent yet) sends now, the shared JWT being `current`.
    static func decide(_ use: SharedTokenUse?, current: SharedTokenUse, now: Date) -> Decision {
        guard let use else { return .send(current.firstUsed(at: now)) }
        if use.jwt == current.jwt { return .send(use) }
        if now.timeIntervalSince(use.firstUse) >= minimumChangeInterval || now < use.firstUse {
            return .send(current.firstUsed(at: now))
        }
        if now.timeIntervalSince(use.issuedAt) < usableAge { return .send(use) }
        return .retire
    }

    func firstUsed(at date: Date) -> SharedTokenUse {
        var use = self
        use.firstUse = date
        return use
    }
}
