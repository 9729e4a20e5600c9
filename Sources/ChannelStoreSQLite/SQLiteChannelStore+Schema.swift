import ChannelProtocol
import ChannelStore
import Foundation
import GRDB

extension SQLiteChannelStore {

    static let revisionBump = "UPDATE meta SET value = value + 1 WHERE key = 'revision';"

    static var migrator: DatabaseMigrator {
        var migrator = DatabaseMigrator()
        migrator.registerMigration("v1") { db in
            try db.create(table: "channel") { t in
                t.primaryKey("id", .text)  // UUID string, readable in the sqlite3 shell
                t.column("name", .text).notNull()
                t.column("image", .text)
                t.column("mode", .text).notNull()
                t.column("max_burst_seconds", .integer).notNull()
                t.column("created_at", .integer).notNull()  // unix milliseconds
                t.column("updated_at", .integer).notNull()
            }
            try db.create(table: "member") { t in
                t.column("channel_id", .text).notNull().references("channel", onDelete: .cascade)
                t.column("user_id", .text).notNull()
                t.primaryKey(["channel_id", "user_id"])
                t.column("display_name", .text).notNull()
                t.column("joined_at", .integer).notNull()
                t.column("last_seen", .integer).notNull()
                t.column("push_token", .text)
                t.column("push_environment", .text)
                t.column("push_registered_at", .integer)
            }
            try db.create(table: "server_key") { t in
                t.primaryKey("name", .text)
                t.column("value", .blob).notNull()
                t.column("created_at", .integer).notNull()
            }
            // No foreign key: the log outlives the channel it was spoken on.
            try db.create(table: "transmission") { t in
                t.autoIncrementedPrimaryKey("id")
                t.column("channel_id", .text).notNull()
                t.column("user_id", .text).notNull()
                t.column("started_at", .integer).notNull()
                t.column("duration_ms", .integer).notNull()
                t.column("end_reason", .text).notNull()
            }
            try db.create(index: "transmission_by_channel", on: "transmission", columns: ["channel_id", "started_at"])
            try db.create(table: "meta") { t in
                t.primaryKey("key", .text)
                t.column("value", .integer).notNull()
            }
            try db.execute(sql: "INSERT INTO meta (key, value) VALUES ('revision', 0)")
            // Triggers rather than Swift code, so edits by any process (or the sqlite3 shell) move the
            // revision a polling server watches.
            let bump = revisionBump
            try db.execute(sql: """
                CREATE TRIGGER channel_inserted AFTER INSERT ON channel BEGIN \(bump) END;
                CREATE TRIGGER channel_updated AFTER UPDATE ON channel BEGIN \(bump) END;
                CREATE TRIGGER channel_deleted AFTER DELETE ON channel BEGIN \(bump) END;
                CREATE TRIGGER member_deleted AFTER DELETE ON member BEGIN \(bump) END;
                """)
        }
        migrator.registerMigration("v2-revocations") { db in
            try db.create(table: "revocation") { t in
                t.autoIncrementedPrimaryKey("sequence")
                t.column("channel_id", .text).notNull().references("channel", onDelete: .cascade)
                t.column("user_id", .text)
                t.column("token_id", .text)
                t.column("revoked_at", .integer).notNull()  // unix milliseconds
                t.column("expires_at", .integer)
                t.column("reason", .text).notNull()
            }
            try db.create(index: "revocation_by_member", on: "revocation", columns: ["channel_id", "user_id"])
            try db.create(index: "revocation_by_token", on: "revocation", columns: ["token_id"])
            try db.execute(sql: """
                CREATE TRIGGER revocation_inserted AFTER INSERT ON revocation BEGIN \(revisionBump) END;
                """)
        }
        migrator.registerMigration("v3-member-grants") { db in
            // Nullable: rows from before keep working, and fill in at the member's next join.
            try db.alter(table: "member") { t in
                t.add(column: "can_talk", .boolean)
                t.add(column: "can_listen", .boolean)
                t.add(column: "role", .text)
                t.add(column: "priority", .integer)
                t.add(column: "token_id", .text)
                t.add(column: "token_issued_at", .integer)  // unix milliseconds
                t.add(column: "token_expires_at", .integer)
            }
        }
        migrator.registerMigration("v4-transmission-by-time") { db in
            // For pruning the log by age across channels: without it each prune scans the whole log
            // while holding the write lock.
            try db.create(index: "transmission_by_time", on: "transmission", columns: ["started_at"])
        }
        migrator.registerMigration("v5-member-subscriptions") { db in
            // A JSON array of user ids; NULL (every row from before) hears everyone.
            try db.alter(table: "member") { t in t.add(column: "unheard", .text) }
        }
        migrator.registerMigration("v6-transmissions-in-progress") { db in
            // Bursts going on (logged at their start): few rows, found at every start without a scan
            // of a year of log.
            try db.execute(sql: "CREATE INDEX transmission_in_progress ON transmission(end_reason) WHERE end_reason = 'inProgress'")
        }
        migrator.registerMigration("v7-canonical-token-ids") { db in
            // Revocations by id were once stored as typed (a lower-case UUID pasted from a log, a
            // trailing newline). The lookup compares canonical ids in SQL, so such a row no longer
            // matched its token: a revoked token would be accepted again. Rewrite them canonically;
            // where that makes two rows for one token, the first revocation stands, as `revoke` keeps
            // it, and learns the later row's user and expiry if it lacked them (as `revoke` does).
            // The canonical form is spelled out here, not taken from `RevocationRecord`: a migration
            // must mean the same thing however that function changes later.
            func canonical(_ id: String) -> String {
                let trimmed = id.trimmingCharacters(in: .whitespacesAndNewlines)
                return UUID(uuidString: trimmed)?.uuidString ?? trimmed
            }
            let rows = try Row.fetchAll(db, sql: """
                SELECT sequence, channel_id, token_id, user_id, expires_at FROM revocation WHERE token_id IS NOT NULL ORDER BY sequence
                """)
            var kept: [[String]: Int64] = [:]
            for row in rows {
                let sequence: Int64 = row["sequence"]
                let stored: String = row["token_id"]
                let id = canonical(stored)
                let key: [String] = [row["channel_id"], id]
                if let first = kept[key] {
                    try db.execute(sql: """
                        UPDATE revocation SET user_id = coalesce(user_id, ?), expires_at = coalesce(expires_at, ?) WHERE sequence = ?
                        """, arguments: [row["user_id"] as String?, row["expires_at"] as Int64?, first])
                    try db.execute(sql: "DELETE FROM revocation WHERE sequence = ?", arguments: [sequence])
                    continue
                }
                kept[key] = sequence
                if id != stored {
                    try db.execute(sql: "UPDATE revocation SET token_id = ? WHERE sequence = ?", arguments: [id, sequence])
                }
            }
        }
        migrator.registerMigration("v8-audit") { db in
            // No foreign key to channel: the record of a channel's deletion outlives the channel.
            try db.create(table: "audit") { t in
                t.autoIncrementedPrimaryKey("id")
                t.column("at", .integer).notNull()  // unix milliseconds
                t.column("source", .text).notNull()
                t.column("actor", .text)
                t.column("action", .text).notNull()
                t.column("channel_id", .text)
                t.column("user_id", .text)
                t.column("details", .text).notNull()
            }
            try db.create(index: "audit_by_time", on: "audit", columns: ["at"])
            try db.create(index: "audit_by_channel", on: "audit", columns: ["channel_id", "id"])
        }
        return migrator
    }
}
