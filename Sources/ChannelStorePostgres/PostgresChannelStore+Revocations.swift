import ChannelProtocol
import ChannelStore
import Foundation
import PostgresNIO

extension PostgresChannelStore {

    public func storeRevocation(_ revocation: RevocationRecord) async throws(StoreError) -> (record: RevocationRecord, isNew: Bool) {
        try revocation.validate()
        let now = Date().unixMilliseconds
        let logger = logger
        let r = revocation
        let tokenID = r.tokenID
        return try await transaction("revoke tokens on channel \(r.channelID)") { connection in
            // Revocations are written one at a time, cluster-wide. Two reasons: of two identical
            // requests at once exactly one is told new; and sequences then commit in their own order,
            // so a node reading "revocations after N" never misses one that a slower transaction
            // committed later with a smaller number. Readers are not blocked.
            try await connection.execute("LOCK TABLE revocation IN SHARE ROW EXCLUSIVE MODE", logger: logger)
            guard try await connection.count("SELECT 1 FROM channel WHERE id = \(r.channelID)", logger: logger) > 0 else {
                throw StoreError.channelNotFound(r.channelID)
            }
            try await connection.execute("DELETE FROM revocation WHERE expires_at IS NOT NULL AND expires_at < \(now)", logger: logger)
            if tokenID == nil {
                try await connection.execute("""
                    DELETE FROM revocation
                    WHERE channel_id = \(r.channelID) AND user_id IS NOT DISTINCT FROM \(r.userID) AND token_id IS NULL
                    """, logger: logger)
            } else if var existing = try await connection.rows("""
                SELECT \(unescaped: RevocationColumns.list) FROM revocation
                WHERE channel_id = \(r.channelID) AND token_id = \(tokenID) ORDER BY sequence LIMIT 1
                """, logger: logger, RevocationColumns.record).first {
                // The same token revoked again (a retry, a second administrator): the first revocation
                // stands. It learns what it lacked when it was made by id alone: the token's expiry
                // (so it can be pruned) and its user.
                if existing.expiresAt == nil, let expires = r.expiresAt {
                    existing.expiresAt = expires
                    existing.userID = existing.userID ?? r.userID
                    try await connection.execute("""
                        UPDATE revocation SET expires_at = \(expires.unixMilliseconds), user_id = \(existing.userID)
                        WHERE sequence = \(existing.sequence)
                        """, logger: logger)
                }
                return (existing, false)
            }
            let inserted = try await connection.rows("""
                INSERT INTO revocation (channel_id, user_id, token_id, revoked_at, expires_at, reason)
                VALUES (\(r.channelID), \(r.userID), \(tokenID), \(r.revokedAt.unixMilliseconds), \(r.expiresAt?.unixMilliseconds), \(r.reason))
                RETURNING \(unescaped: RevocationColumns.list)
                """, logger: logger, RevocationColumns.record)
            guard let record = inserted.first else { throw StoreError.database("the revocation vanished right after it was stored") }
            return (record, true)
        }
    }

    public func revocation(channel: UUID, user: String, tokenID: String, issuedAt: Date) async throws(StoreError) -> RevocationRecord? {
        let issued = issuedAt.unixMilliseconds
        let tokenID = RevocationRecord.canonicalTokenID(tokenID)
        // `>=`: a token issued in the removal's own millisecond may have come first; the store keeps
        // milliseconds, so refuse it (RevocationRecord.voids says the same).
        return try await rows("check token \(tokenID) against revocations", """
            SELECT \(unescaped: RevocationColumns.list) FROM revocation
            WHERE channel_id = \(channel)
              AND (token_id = \(tokenID) OR (token_id IS NULL AND user_id = \(user) AND revoked_at >= \(issued)))
            ORDER BY sequence LIMIT 1
            """, RevocationColumns.record).first
    }

    public func revocations(after sequence: Int64, channel: UUID?) async throws(StoreError) -> [RevocationRecord] {
        if let channel {
            return try await rows("read revocations", """
                SELECT \(unescaped: RevocationColumns.list) FROM revocation
                WHERE sequence > \(sequence) AND channel_id = \(channel) ORDER BY sequence
                """, RevocationColumns.record)
        }
        return try await rows("read revocations", """
            SELECT \(unescaped: RevocationColumns.list) FROM revocation WHERE sequence > \(sequence) ORDER BY sequence
            """, RevocationColumns.record)
    }
}
