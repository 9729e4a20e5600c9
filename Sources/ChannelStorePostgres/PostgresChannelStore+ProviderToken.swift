import ChannelStore
import Foundation
import PostgresNIO

/// The APNs provider JWT the nodes share (the APNs module's `ProviderTokenShare`, adapted in PTTServer).
/// Ages are the database's clock, like leases: nodes' clocks are never compared.
extension PostgresChannelStore {
    /// A stored JWT and its age in microseconds.
    public struct StoredProviderToken: Sendable, Equatable {
        public var jwt: String
        public var ageMicroseconds: Int64
    }

    private static let databaseNowMicroseconds = "(extract(epoch FROM now()) * 1000000)::bigint"

    public func providerToken(key: String) async throws(StoreError) -> StoredProviderToken? {
        try await rows("read the shared APNs provider token", Self.providerTokenQuery(key), Self.storedProviderToken).first
    }

    /// Stores `new` in place of `replacing` (nil: in place of none), unless another node already
    /// replaced it (the row lock makes the second writer see the first's JWT and change nothing), and
    /// returns the JWT stored afterwards.
    public func replaceProviderToken(key: String, replacing: String?, with new: String) async throws(StoreError) -> StoredProviderToken {
        let logger = logger
        let now = Self.databaseNowMicroseconds
        let stored = try await transaction("store the shared APNs provider token") { connection in
            try await connection.execute("""
                INSERT INTO apns_provider_token (key, jwt, issued_us) VALUES (\(key), \(new), \(unescaped: now))
                ON CONFLICT (key) DO UPDATE SET jwt = excluded.jwt, issued_us = excluded.issued_us
                WHERE apns_provider_token.jwt = \(replacing ?? "")
                """, logger: logger)
            return try await connection.rows(Self.providerTokenQuery(key), logger: logger, Self.storedProviderToken).first
        }
        guard let stored else { throw .database("the shared APNs provider token vanished right after it was stored") }
        return stored
    }

    private static func providerTokenQuery(_ key: String) -> PostgresQuery {
        "SELECT jwt, \(unescaped: databaseNowMicroseconds) - issued_us FROM apns_provider_token WHERE key = \(key)"
    }

    private static func storedProviderToken(_ row: PostgresRow) throws -> StoredProviderToken {
        let (jwt, age) = try row.decode((String, Int64).self)
        return StoredProviderToken(jwt: jwt, ageMicroseconds: age)
    }
}
