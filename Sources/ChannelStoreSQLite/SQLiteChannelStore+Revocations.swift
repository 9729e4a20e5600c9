import ChannelProtocol
import ChannelStore
import Foundation
import GRDB

extension SQLiteChannelStore {

    public func storeRevocation(_ revocation: RevocationRecord) async throws(StoreError) -> (record: RevocationRecord, isNew: Bool) {
        try revocation.validate()
        let newRow = RevocationRow(revocation)
        let now = Date().unixMilliseconds
        return try await write("revoke tokens on channel \(revocation.channelID)") { db in
            guard try ChannelRow.exists(db, key: newRow.channelID) else { throw StoreError.channelNotFound(revocation.channelID) }
            try RevocationRow.filter(RevocationRow.Columns.expiresAt != nil && RevocationRow.Columns.expiresAt < now).deleteAll(db)
            if newRow.tokenID == nil {
                try RevocationRow.filter(RevocationRow.Columns.channelID == newRow.channelID && RevocationRow.Columns.userID == newRow.userID
                                         && RevocationRow.Columns.tokenID == nil).deleteAll(db)
            } else if var existing = try RevocationRow.filter(RevocationRow.Columns.channelID == newRow.channelID
                                                              && RevocationRow.Columns.tokenID == newRow.tokenID).fetchOne(db) {
                // The same token revoked again (a retry, a second administrator): the first revocation
                // stands, rather than a second row. It learns what it lacked when it was made by id
                // alone: the token's expiry (so it can be pruned) and its user.
                if existing.expiresAt == nil, newRow.expiresAt != nil {
                    existing.expiresAt = newRow.expiresAt
                    existing.userID = existing.userID ?? newRow.userID
                    try existing.update(db)
                }
                return (try existing.record(), false)
            }
            var row = newRow
            try row.insert(db)
            return (try row.record(), true)
        }
    }

    public func revocation(channel: UUID, user: String, tokenID: String, issuedAt: Date) async throws(StoreError) -> RevocationRecord? {
        let issued = issuedAt.unixMilliseconds
        let tokenID = RevocationRecord.canonicalTokenID(tokenID)
        return try await read("check token \(tokenID) against revocations") { db in
            let c = RevocationRow.Columns.self
            return try RevocationRow
                .filter(c.channelID == channel.uuidString)
                // `>=`: a token issued in the removal's own millisecond may have come first; the
                // store keeps milliseconds, so refuse it (RevocationRecord.voids says the same).
                .filter(c.tokenID == tokenID || (c.tokenID == nil && c.userID == user && c.revokedAt >= issued))
                .order(c.sequence)
                .fetchOne(db)?.record()
        }
    }

    public func revocations(after sequence: Int64, channel: UUID?) async throws(StoreError) -> [RevocationRecord] {
        try await read("read revocations") { db in
            var request = RevocationRow.filter(RevocationRow.Columns.sequence > sequence)
            if let channel { request = request.filter(RevocationRow.Columns.channelID == channel.uuidString) }
            return try request.order(RevocationRow.Columns.sequence).fetchAll(db).map { row throws(StoreError) in try row.record() }
        }
    }
}
