import ChannelProtocol
import Foundation
import GRDB
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// The embedded `ChannelStore`: one SQLite file (WAL mode) in the data directory.
///
/// Several processes may open the same file at once: a running `squelchd serve` and the
/// `squelchd channel` CLI. Writers wait up to `busyTimeoutSeconds` for each other, and triggers in the
/// schema bump the revision counter, so `revision()` sees edits made by any process.
public final class SQLiteChannelStore: ChannelStore {
    /// The database's file name inside a data directory.
    public static let defaultFileName = "squelch.sqlite"
    /// How long a statement waits for another connection's lock before failing.
    public static let busyTimeoutSeconds: TimeInterval = 5

    /// The database file.
    public let path: String
    let pool: DatabasePool

    /// Opens (or creates) `directory/squelch.sqlite`, creating the directory (mode 0700) if missing.
    public convenience init(directory: String, busyTimeout: TimeInterval = busyTimeoutSeconds) throws(StoreError) {
        if !FileManager.default.fileExists(atPath: directory) {
            do {
                try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true,
                                                        attributes: [.posixPermissions: 0o700])
            } catch {
                throw .database("cannot create the data directory \(directory) (\(error.localizedDescription)); create it or pass another --data-dir")
            }
        }
        try self.init(path: URL(fileURLWithPath: directory).appendingPathComponent(Self.defaultFileName).path, busyTimeout: busyTimeout)
    }

    /// Opens (or creates) the database at `path` and brings its schema up to date.
    ///
    /// Refuses a file that is not a SQLite database, and one whose schema was written by a newer
    /// squelchd (it has migrations this build does not know). `busyTimeout` is how long a statement
    /// waits for another connection's lock before it fails with `StoreError.unavailable`.
    public init(path: String, busyTimeout: TimeInterval = busyTimeoutSeconds) throws(StoreError) {
        self.path = path
        createPrivateFileIfAbsent(path)

        var config = Configuration()
        config.label = "squelch"
        config.foreignKeysEnabled = true
        config.busyMode = .timeout(busyTimeout)
        // Several processes may open a new file at once (a server and the CLI started together). One
        // of them can get SQLITE_BUSY at once, without the busy handler (switching a new file to WAL,
        // or upgrading a read to a write while another commits), or find the other's migrations half
        // done (each runs in its own transaction): then it tries again until the other is through.
        let deadline = Date().addingTimeInterval(busyTimeout)
        while true {
            do throws(OpenFailure) {
                pool = try Self.openAndMigrate(path, config)
                return
            } catch {
                switch error {
                case .retry(let cause, let context):
                    guard Date() < deadline else { throw Self.storeError(context, cause) }
                    usleep(20_000)
                case .final(let storeError):
                    throw storeError
                }
            }
        }
    }

    /// One server key, read without opening the store for writing: for a command that only checks
    /// what the server recorded, and must not migrate a database under a server older than itself.
    /// Nil when the database or its `server_key` table has no such key.
    public static func recordedServerKey(named name: String, inDirectory directory: String) throws(StoreError) -> [UInt8]? {
        let path = URL(fileURLWithPath: directory).appendingPathComponent(defaultFileName).path
        var config = Configuration()
        config.readonly = true
        config.busyMode = .timeout(busyTimeoutSeconds)
        do {
            let queue = try DatabaseQueue(path: path, configuration: config)
            return try queue.read { db -> [UInt8]? in
                guard try db.tableExists("server_key") else { return nil }
                return try Data.fetchOne(db, sql: "SELECT value FROM server_key WHERE name = ?", arguments: [name]).map { [UInt8]($0) }
            }
        } catch {
            throw .database("cannot read \(path) (\(error)); check that it is squelchd's database and readable by this user")
        }
    }

    private enum OpenFailure: Error {
        /// Possibly another process's open in progress; worth another try.
        case retry(any Error, context: String)
        case final(StoreError)
    }

    private static func openAndMigrate(_ path: String, _ config: Configuration) throws(OpenFailure) -> DatabasePool {
        let pool: DatabasePool
        do {
            pool = try DatabasePool(path: path, configuration: config)
            // FULL, not GRDB's WAL default NORMAL: NORMAL already survives `kill -9` (the WAL is in the
            // OS page cache), but a power cut can lose the last commits, and the protocol promises a
            // write is durable when the call returns. FULL fsyncs the WAL on every commit; our writes
            // are a few per join or talk burst, so the cost is invisible. Set after opening because
            // GRDB's WAL setup switches the writer to NORMAL; only the writer connection commits.
            try pool.writeWithoutTransaction { try $0.execute(sql: "PRAGMA synchronous = FULL") }
        } catch {
            let context = "cannot open the database \(path)"
            if let database = error as? DatabaseError, database.resultCode == .SQLITE_BUSY || database.resultCode == .SQLITE_LOCKED {
                throw .retry(error, context: context)
            }
            throw .final(storeError(context, error))
        }

        let migrator = Self.migrator
        let context = "cannot prepare the schema of \(path)"
        do {
            let unknown = try pool.read { db in try migrator.appliedIdentifiers(db).subtracting(migrator.migrations) }
            if !unknown.isEmpty {
                throw OpenFailure.final(.database("\(path) has schema version(s) \(unknown.sorted().joined(separator: ", ")) from a newer squelchd; run that version, or restore a backup made before the upgrade"))
            }
            try migrator.migrate(pool)
        } catch let failure as OpenFailure {
            throw failure
        } catch {
            // GRDB checks which migrations are applied before taking the write lock, so a process
            // opening a new file at the same moment as another can fail on "table exists", or on a
            // lock. The other process's migration is just as good once it is complete.
            if (try? pool.read(migrator.hasCompletedMigrations)) == true { return pool }
            throw .retry(error, context: context)
        }
        return pool
    }

    // MARK: Schema

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

    // MARK: Channels

    public func createChannel(_ channel: ChannelRecord) async throws(StoreError) {
        try channel.validate()
        let row = ChannelRow(channel)
        try await write("create channel \(channel.id)") { db in
            if try ChannelRow.exists(db, key: row.id) {
                throw StoreError.invalid("a channel with id \(channel.id) exists")
            }
            try row.insert(db)
        }
    }

    public func channel(_ id: UUID) async throws(StoreError) -> ChannelRecord? {
        try await read("read channel \(id)") { db in try ChannelRow.fetchOne(db, key: id.uuidString)?.record() }
    }

    public func channels() async throws(StoreError) -> [ChannelRecord] {
        try await read("list channels") { db in
            try ChannelRow.order(ChannelRow.Columns.name.collating(.nocase), ChannelRow.Columns.createdAt)
                .fetchAll(db).map { row throws(StoreError) in try row.record() }
        }
    }

    public func updateChannel(_ channel: ChannelRecord) async throws(StoreError) -> ChannelRecord {
        try channel.validate()
        let now = Date().unixMilliseconds
        return try await write("update channel \(channel.id)") { db in
            guard let existing = try ChannelRow.fetchOne(db, key: channel.id.uuidString) else {
                throw StoreError.channelNotFound(channel.id)
            }
            var row = ChannelRow(channel)
            // Creation time is the store's fact, not something an edit can move.
            row.createdAt = existing.createdAt
            row.updatedAt = now
            try row.update(db)
            return try row.record()
        }
    }

    public func deleteChannel(_ id: UUID) async throws(StoreError) {
        try await write("delete channel \(id)") { db in
            guard try ChannelRow.deleteOne(db, key: id.uuidString) else { throw StoreError.channelNotFound(id) }
        }
    }

    public func revision() async throws(StoreError) -> Int64 {
        try await read("read the revision") { db in
            try Int64.fetchOne(db, sql: "SELECT value FROM meta WHERE key = ?", arguments: ["revision"]) ?? 0
        }
    }

    // MARK: Members

    public func upsertMember(_ member: MemberRecord) async throws(StoreError) {
        let operation = StoreOperation.upsertMember(member)
        try await write(Self.action(operation)) { db in try Self.perform(operation, in: db) }
    }

    public func members(of channel: UUID) async throws(StoreError) -> [MemberRecord] {
        try await read("list members of channel \(channel)") { db in
            try MemberRow.filter(MemberRow.Columns.channelID == channel.uuidString)
                .order(MemberRow.Columns.joinedAt, MemberRow.Columns.userID)
                .fetchAll(db).map { row throws(StoreError) in try row.record() }
        }
    }

    public func member(channel: UUID, user: String) async throws(StoreError) -> MemberRecord? {
        try await read("read member '\(user)' of channel \(channel)") { db in
            try MemberRow.fetchOne(db, key: MemberRow.key(channel, user))?.record()
        }
    }

    public func removeMember(channel: UUID, user: String) async throws(StoreError) {
        let operation = StoreOperation.removeMember(channel: channel, user: user)
        try await write(Self.action(operation)) { db in try Self.perform(operation, in: db) }
    }

    public func touchMember(channel: UUID, user: String, lastSeen: Date) async throws(StoreError) {
        let operation = StoreOperation.touchMember(channel: channel, user: user, lastSeen: lastSeen)
        try await write(Self.action(operation)) { db in try Self.perform(operation, in: db) }
    }

    public func touchMembers(_ members: [MemberKey], lastSeen: Date) async throws(StoreError) {
        guard !members.isEmpty else { return }
        let time = lastSeen.unixMilliseconds
        try await write("update last seen of \(members.count) members") { db in
            let statement = try db.makeStatement(sql: "UPDATE member SET last_seen = MAX(last_seen, ?) WHERE channel_id = ? AND user_id = ?")
            for member in members { try statement.execute(arguments: [time, member.channel.uuidString, member.user]) }
        }
    }

    public func recordServerAlive(at now: Date, creditingDowntime: Bool) async throws(StoreError) -> Date? {
        let time = now.unixMilliseconds
        return try await write("record that the server is running") { db -> Date? in
            let alive = try Int64.fetchOne(db, sql: "SELECT value FROM meta WHERE key = 'alive_at'")
            if creditingDowntime, let alive {
                // Rows written after the last record (a join, a close) show the server ran until then.
                let newest = try Int64.fetchOne(db, sql: "SELECT MAX(last_seen) FROM member") ?? alive
                let downtime = time - max(alive, newest)
                if downtime > 0 {
                    try db.execute(sql: "UPDATE member SET last_seen = MIN(?, last_seen + ?)", arguments: [time, downtime])
                }
            }
            try db.execute(sql: """
                INSERT INTO meta (key, value) VALUES ('alive_at', ?)
                ON CONFLICT(key) DO UPDATE SET value = excluded.value
                """, arguments: [time])
            return alive.map { Date(unixMilliseconds: $0) }
        }
    }

    public func setPushToken(channel: UUID, user: String, token: String, environment: PushEnvironment,
                             registeredAt: Date) async throws(StoreError) {
        let operation = StoreOperation.setPushToken(channel: channel, user: user, token: token, environment: environment, registeredAt: registeredAt)
        try await write(Self.action(operation)) { db in try Self.perform(operation, in: db) }
    }

    public func clearPushToken(channel: UUID, user: String) async throws(StoreError) {
        let operation = StoreOperation.clearPushToken(channel: channel, user: user)
        try await write(Self.action(operation)) { db in try Self.perform(operation, in: db) }
    }

    public func setSubscriptions(channel: UUID, user: String, unheard: [String]) async throws(StoreError) {
        let operation = StoreOperation.setSubscriptions(channel: channel, user: user, unheard: unheard)
        try await write(Self.action(operation)) { db in try Self.perform(operation, in: db) }
    }

    /// Every write in one transaction, each in a savepoint of its own: a write refused (no such
    /// member, a value refused) is undone alone and reported, the others commit together, with one
    /// disk flush for all of them.
    public func apply(_ operations: [StoreOperation]) async throws(StoreError) -> [StoreError?] {
        guard !operations.isEmpty else { return [] }
        let action = operations.count == 1 ? Self.action(operations[0]) : "save \(operations.count) changes"
        return try await write(action) { db in
            var outcomes: [StoreError?] = []
            outcomes.reserveCapacity(operations.count)
            for operation in operations {
                do {
                    try db.inSavepoint {
                        try Self.perform(operation, in: db)
                        return .commit
                    }
                    outcomes.append(nil)
                } catch {
                    let refusal = Self.storeError("cannot " + Self.action(operation), error)
                    // One that may pass later (the disk full, an I/O error) fails them all: the
                    // transaction is rolled back and the caller tries the whole batch again. So does
                    // one after which SQLite rolled the whole transaction back itself (out of memory,
                    // a damaged page): the caller learns its own words, not the next statement's
                    // "transaction was aborted".
                    if refusal.isTransient || !db.isInsideTransaction { throw error }
                    outcomes.append(refusal)
                }
            }
            return outcomes
        }
    }

    /// What `operation` does, for error messages: "store member 'ann' of channel …".
    static func action(_ operation: StoreOperation) -> String {
        switch operation {
        case .upsertMember(let member): "store member '\(member.userID)' of channel \(member.channelID)"
        case .touchMember(let channel, let user, _): "update last seen of member '\(user)' of channel \(channel)"
        case .setPushToken(let channel, let user, _, _, _): "store the push token of member '\(user)' of channel \(channel)"
        case .removeMember(let channel, let user): "remove member '\(user)' of channel \(channel)"
        case .clearPushToken(let channel, let user): "clear the push token of member '\(user)' of channel \(channel)"
        case .setSubscriptions(let channel, let user, _): "store the subscriptions of member '\(user)' of channel \(channel)"
        case .logTransmission(let record): "log a transmission on channel \(record.channelID)"
        }
    }

    /// One write, inside the caller's transaction.
    static func perform(_ operation: StoreOperation, in db: Database) throws {
        switch operation {
        case .upsertMember(let member):
            var row = MemberRow(member)
            guard try ChannelRow.exists(db, key: row.channelID) else { throw StoreError.channelNotFound(member.channelID) }
            if row.pushToken == nil || row.tokenID == nil, let existing = try MemberRow.fetchOne(db, key: row.key) {
                if row.pushToken == nil {
                    row.pushToken = existing.pushToken
                    row.pushEnvironment = existing.pushEnvironment
                    row.pushRegisteredAt = existing.pushRegisteredAt
                }
                if row.tokenID == nil { row.grant = existing.grant }
            }
            try row.save(db)
        case .touchMember(let channel, let user, let lastSeen):
            try updateMember(channel, user, in: db, [MemberRow.Columns.lastSeen.set(to: lastSeen.unixMilliseconds)])
        case .setPushToken(let channel, let user, let token, let environment, let registeredAt):
            try updateMember(channel, user, in: db,
                             [MemberRow.Columns.pushToken.set(to: token),
                              MemberRow.Columns.pushEnvironment.set(to: environment.rawValue),
                              MemberRow.Columns.pushRegisteredAt.set(to: registeredAt.unixMilliseconds)])
        case .removeMember(let channel, let user):
            guard try MemberRow.deleteOne(db, key: MemberRow.key(channel, user)) else {
                throw StoreError.memberNotFound(channel: channel, user: user)
            }
        case .clearPushToken(let channel, let user):
            try updateMember(channel, user, in: db,
                             [MemberRow.Columns.pushToken.set(to: nil),
                              MemberRow.Columns.pushEnvironment.set(to: nil),
                              MemberRow.Columns.pushRegisteredAt.set(to: nil)])
        case .setSubscriptions(let channel, let user, let unheard):
            try updateMember(channel, user, in: db, [MemberRow.Columns.unheard.set(to: MemberRow.unheardColumn(unheard))])
        case .logTransmission(let record):
            try logTransmission(TransmissionRow(record), in: db)
        }
    }

    private static func updateMember(_ channel: UUID, _ user: String, in db: Database, _ assignments: [ColumnAssignment]) throws {
        let changed = try MemberRow.filter(key: MemberRow.key(channel, user)).updateAll(db, assignments)
        guard changed > 0 else { throw StoreError.memberNotFound(channel: channel, user: user) }
    }

    // MARK: Revocations

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

    // MARK: Server keys

    public func serverKey(named name: String) async throws(StoreError) -> [UInt8]? {
        try await read("read server key '\(name)'") { db in
            try ServerKeyRow.fetchOne(db, key: name).map { [UInt8]($0.value) }
        }
    }

    public func storeServerKeyIfAbsent(named name: String, value: [UInt8]) async throws(StoreError) -> [UInt8] {
        guard !name.isEmpty, !value.isEmpty else { throw .invalid("a server key needs a name and a non-empty value") }
        let row = ServerKeyRow(name: name, value: Data(value), createdAt: Date().unixMilliseconds)
        return try await write("store server key '\(name)'") { db in
            // One transaction: whichever process commits first wins, and both return its key.
            try row.insert(db, onConflict: .ignore)
            guard let stored = try ServerKeyRow.fetchOne(db, key: name) else {
                throw StoreError.database("server key '\(name)' vanished right after it was stored")
            }
            return [UInt8](stored.value)
        }
    }

    public func setServerKey(named name: String, value: [UInt8]) async throws(StoreError) {
        guard !name.isEmpty, !value.isEmpty else { throw .invalid("a server key needs a name and a non-empty value") }
        let row = ServerKeyRow(name: name, value: Data(value), createdAt: Date().unixMilliseconds)
        try await write("store server key '\(name)'") { db in try row.upsert(db) }
    }

    // MARK: Transmission log

    public func logTransmission(_ record: TransmissionRecord) async throws(StoreError) {
        let operation = StoreOperation.logTransmission(record)
        try await write(Self.action(operation)) { db in try Self.perform(operation, in: db) }
    }

    private static func logTransmission(_ row: TransmissionRow, in db: Database) throws {
        // A burst's start inserts its row; its progress (in progress, with the length so far) and
        // its end update that row. A start is never an update: two bursts of a user starting in
        // the same millisecond (two connections, full duplex) each get a row.
        if row.endReason != TransmissionRecord.inProgress || row.durationMilliseconds > 0 {
            // One row: two bursts of a user starting in the same millisecond each end their own.
            try db.execute(sql: """
                UPDATE transmission SET duration_ms = ?, end_reason = ?
                WHERE id = (SELECT id FROM transmission
                            WHERE channel_id = ? AND user_id = ? AND started_at = ? AND end_reason = ?
                            ORDER BY id LIMIT 1)
                """, arguments: [row.durationMilliseconds, row.endReason, row.channelID, row.userID, row.startedAt,
                                 TransmissionRecord.inProgress])
            if db.changesCount > 0 { return }
        }
        try row.insert(db)
    }

    public func closeInterruptedTransmissions() async throws(StoreError) -> Int {
        try await write("close the transmissions a stopped server left in progress") { db in
            try db.execute(sql: "UPDATE transmission SET end_reason = ? WHERE end_reason = ?",
                           arguments: [TransmissionRecord.interrupted, TransmissionRecord.inProgress])
            return db.changesCount
        }
    }

    public func transmissions(of channel: UUID, limit: Int) async throws(StoreError) -> [TransmissionRecord] {
        try await read("read transmissions of channel \(channel)") { db in
            try TransmissionRow.filter(TransmissionRow.Columns.channelID == channel.uuidString)
                .order(TransmissionRow.Columns.startedAt.desc, TransmissionRow.Columns.id.desc)
                .limit(max(0, limit))
                .fetchAll(db).map { row throws(StoreError) in try row.record() }
        }
    }

    public func pruneTransmissions(startedBefore cutoff: Date, limit: Int) async throws(StoreError) -> Int {
        let before = cutoff.unixMilliseconds
        return try await write("prune the transmission log") { db in
            try db.execute(sql: """
                DELETE FROM transmission WHERE id IN
                    (SELECT id FROM transmission WHERE started_at < ? ORDER BY started_at LIMIT ?)
                """, arguments: [before, max(0, limit)])
            return db.changesCount
        }
    }

    // MARK: Audit trail

    public func recordAudit(_ record: AuditRecord) async throws(StoreError) {
        let row = try AuditRow(record)
        try await write("record '\(record.action)' in the audit trail") { db in try row.insert(db) }
    }

    public func auditRecords(channel: UUID?, limit: Int) async throws(StoreError) -> [AuditRecord] {
        try await read("read the audit trail") { db in
            var request = AuditRow.order(AuditRow.Columns.id.desc)
            if let channel { request = request.filter(AuditRow.Columns.channelID == channel.uuidString) }
            return try request.limit(max(0, limit)).fetchAll(db).map { row throws(StoreError) in try row.record() }
        }
    }

    public func pruneAudit(before cutoff: Date, limit: Int) async throws(StoreError) -> Int {
        let before = cutoff.unixMilliseconds
        return try await write("prune the audit trail") { db in
            try db.execute(sql: """
                DELETE FROM audit WHERE id IN (SELECT id FROM audit WHERE at < ? ORDER BY at LIMIT ?)
                """, arguments: [before, max(0, limit)])
            return db.changesCount
        }
    }

    // MARK: Closing

    public func close() async throws(StoreError) {
        do {
            // TRUNCATE leaves an empty WAL, so a copy of the main file alone is a complete backup.
            try await pool.writeWithoutTransaction { db in try db.execute(sql: "PRAGMA wal_checkpoint(TRUNCATE)") }
            try pool.close()
        } catch {
            throw Self.storeError("cannot close \(path)", error)
        }
    }

    // MARK: Access and errors

    private func read<T: Sendable>(_ action: String, _ body: @Sendable (Database) throws -> T) async throws(StoreError) -> T {
        do { return try await pool.read(body) } catch { throw Self.storeError("cannot \(action)", error) }
    }

    private func write<T: Sendable>(_ action: String, _ body: @Sendable (Database) throws -> T) async throws(StoreError) -> T {
        do { return try await pool.write(body) } catch { throw Self.storeError("cannot \(action)", error) }
    }

    /// Passes `StoreError`s thrown inside a transaction through; words everything else as a database
    /// error with a hint for the result codes an operator can do something about.
    static func storeError(_ context: String, _ error: any Error) -> StoreError {
        if let error = error as? StoreError { return error }
        guard let error = error as? DatabaseError else {
            if error is CancellationError { return .database("\(context): the task was cancelled") }
            return .database("\(context): \(error)")
        }
        let what = error.message ?? "SQLite error \(error.extendedResultCode.rawValue)"
        let hint: String
        // Conditions that pass on their own or once space is freed are `unavailable`: the same
        // statement can succeed later. Permissions and damage need an operator's change first, and
        // SQLITE_LOCKED is contention inside this process (a programming error), not another's lock.
        var transient = false
        switch error.resultCode {
        case .SQLITE_NOTADB, .SQLITE_CORRUPT:
            hint = "; the file is damaged or not a Squelch database: restore a backup, or move it aside to start empty"
        case .SQLITE_BUSY, .SQLITE_LOCKED:
            hint = "; another process held the database locked for longer than this one waits: try again once it is done"
            transient = error.resultCode == .SQLITE_BUSY
        case .SQLITE_CANTOPEN:
            hint = "; check that the directory exists and is writable"
        case .SQLITE_READONLY, .SQLITE_PERM, .SQLITE_AUTH:
            hint = "; check the permissions of the file and its directory"
        case .SQLITE_FULL, .SQLITE_IOERR:
            hint = "; check the disk (space, health)"
            // A page that reads back wrong stays wrong: retrying it would hold every later write.
            transient = error.extendedResultCode != .SQLITE_IOERR_DATA && error.extendedResultCode != .SQLITE_IOERR_CORRUPTFS
        default:
            hint = ""
        }
        let text = "\(context): \(what) (SQLite code \(error.extendedResultCode.rawValue))\(hint)"
        return transient ? .unavailable(text) : .database(text)
    }
}

/// Creates an empty file with mode 0600 unless one exists. SQLite gives the -wal and -shm files the
/// main file's permissions, so this keeps all three private; an empty file is a valid empty database.
private func createPrivateFileIfAbsent(_ path: String) {
    // O_EXCL: never truncates a file another process just created. Failures are left for SQLite to
    // report with its own message when it opens the path.
    let fd = open(path, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0o600)
    if fd >= 0 { close(fd) }
}

// MARK: - Rows

// Private row types keep GRDB out of the public records and fix the storage format: UUIDs as
// uppercase strings and dates as unix milliseconds, so what the sqlite3 shell shows is readable.

extension Date {
    /// Whole milliseconds since 1970, as stored (and as `RevocationRecord.voids` compares).
    var unixMilliseconds: Int64 { Int64((timeIntervalSince1970 * 1000).rounded()) }

    fileprivate init(unixMilliseconds: Int64) { self.init(timeIntervalSince1970: Double(unixMilliseconds) / 1000) }
}

private func uuid(_ text: String, in table: String) throws(StoreError) -> UUID {
    guard let id = UUID(uuidString: text) else { throw .database("\(table) row has a malformed channel id '\(text)'") }
    return id
}

private struct ChannelRow: Codable, FetchableRecord, PersistableRecord {
    static let databaseTableName = "channel"
    var id: String
    var name: String
    var image: String?
    var mode: String
    var maxBurstSeconds: Int
    var createdAt: Int64
    var updatedAt: Int64

    enum CodingKeys: String, CodingKey {
        case id, name, image, mode
        case maxBurstSeconds = "max_burst_seconds", createdAt = "created_at", updatedAt = "updated_at"
    }

    enum Columns {
        static let name = Column(CodingKeys.name)
        static let createdAt = Column(CodingKeys.createdAt)
    }

    init(_ record: ChannelRecord) {
        id = record.id.uuidString
        name = record.name
        image = record.image
        mode = record.mode.rawValue
        maxBurstSeconds = record.maxBurstSeconds
        createdAt = record.createdAt.unixMilliseconds
        updatedAt = record.updatedAt.unixMilliseconds
    }

    func record() throws(StoreError) -> ChannelRecord {
        guard let mode = TransmissionMode(rawValue: mode) else {
            throw .database("channel \(id) has an unknown mode '\(mode)'; was it written by a newer squelchd?")
        }
        return ChannelRecord(id: try uuid(id, in: "channel"), name: name, image: image, mode: mode, maxBurstSeconds: maxBurstSeconds,
                             createdAt: Date(unixMilliseconds: createdAt), updatedAt: Date(unixMilliseconds: updatedAt))
    }
}

private struct MemberRow: Codable, FetchableRecord, PersistableRecord {
    static let databaseTableName = "member"
    var channelID: String
    var userID: String
    var displayName: String
    var joinedAt: Int64
    var lastSeen: Int64
    var pushToken: String?
    var pushEnvironment: String?
    var pushRegisteredAt: Int64?
    var canTalk: Bool?
    var canListen: Bool?
    var role: String?
    var priority: Int64?
    var tokenID: String?
    var tokenIssuedAt: Int64?
    var tokenExpiresAt: Int64?
    /// JSON, written and read by hand (`unheardIDs`) so that a damaged value loses the list, not the row.
    var unheard: String?

    enum CodingKeys: String, CodingKey {
        case channelID = "channel_id", userID = "user_id", displayName = "display_name", joinedAt = "joined_at"
        case lastSeen = "last_seen", pushToken = "push_token", pushEnvironment = "push_environment"
        case pushRegisteredAt = "push_registered_at"
        case canTalk = "can_talk", canListen = "can_listen", role, priority, tokenID = "token_id"
        case tokenIssuedAt = "token_issued_at", tokenExpiresAt = "token_expires_at", unheard
    }

    enum Columns {
        static let channelID = Column(CodingKeys.channelID)
        static let userID = Column(CodingKeys.userID)
        static let joinedAt = Column(CodingKeys.joinedAt)
        static let lastSeen = Column(CodingKeys.lastSeen)
        static let pushToken = Column(CodingKeys.pushToken)
        static let pushEnvironment = Column(CodingKeys.pushEnvironment)
        static let pushRegisteredAt = Column(CodingKeys.pushRegisteredAt)
        static let unheard = Column(CodingKeys.unheard)
    }

    static func key(_ channel: UUID, _ user: String) -> [String: (any DatabaseValueConvertible)?] {
        [CodingKeys.channelID.rawValue: channel.uuidString, CodingKeys.userID.rawValue: user]
    }

    var key: [String: (any DatabaseValueConvertible)?] {
        [CodingKeys.channelID.rawValue: channelID, CodingKeys.userID.rawValue: userID]
    }

    init(_ record: MemberRecord) {
        channelID = record.channelID.uuidString
        userID = record.userID
        displayName = record.displayName
        joinedAt = record.joinedAt.unixMilliseconds
        lastSeen = record.lastSeen.unixMilliseconds
        pushToken = record.pushToken
        pushEnvironment = record.pushEnvironment?.rawValue
        pushRegisteredAt = record.pushRegisteredAt?.unixMilliseconds
        grant = record.grant
        unheardIDs = record.unheard
    }

    /// The stored subscription list. A value that doesn't read back as a list of strings (edited by
    /// hand, or damaged) counts as none: the member hears everyone until it says otherwise, rather
    /// than keeping its channel from loading.
    var unheardIDs: [String] {
        get {
            guard let unheard, let ids = try? JSONDecoder().decode([String].self, from: Data(unheard.utf8)) else { return [] }
            return ids
        }
        set { unheard = Self.unheardColumn(newValue) }
    }

    /// The column's value for a subscription list: NULL for none, as rows from before v5 have.
    static func unheardColumn(_ ids: [String]) -> String? {
        ids.isEmpty ? nil : (try? JSONEncoder().encode(ids.sorted())).map { String(decoding: $0, as: UTF8.self) }
    }

    /// The grant, if the row has one. A row edited by hand into something half-filled or out of range
    /// counts as having none (the member shows as listen-only until it joins again), rather than as an
    /// error that would keep its channel from loading.
    var grant: MemberGrant? {
        get {
            guard let canTalk, let canListen, let priority, (0...255).contains(priority), let tokenID,
                  let tokenIssuedAt, let tokenExpiresAt else { return nil }
            return MemberGrant(canTalk: canTalk, canListen: canListen, role: role, priority: UInt8(priority), tokenID: tokenID,
                               tokenIssuedAt: Date(unixMilliseconds: tokenIssuedAt), tokenExpiresAt: Date(unixMilliseconds: tokenExpiresAt))
        }
        set {
            canTalk = newValue?.canTalk
            canListen = newValue?.canListen
            role = newValue?.role
            priority = newValue.map { Int64($0.priority) }
            tokenID = newValue?.tokenID
            tokenIssuedAt = newValue?.tokenIssuedAt.unixMilliseconds
            tokenExpiresAt = newValue?.tokenExpiresAt.unixMilliseconds
        }
    }

    func record() throws(StoreError) -> MemberRecord {
        var environment: PushEnvironment?
        if let pushEnvironment {
            guard let parsed = PushEnvironment(rawValue: pushEnvironment) else {
                throw .database("member '\(userID)' of channel \(channelID) has an unknown push environment '\(pushEnvironment)'")
            }
            environment = parsed
        }
        return MemberRecord(channelID: try uuid(channelID, in: "member"), userID: userID, displayName: displayName,
                            joinedAt: Date(unixMilliseconds: joinedAt), lastSeen: Date(unixMilliseconds: lastSeen),
                            pushToken: pushToken, pushEnvironment: environment,
                            pushRegisteredAt: pushRegisteredAt.map(Date.init(unixMilliseconds:)), grant: grant,
                            unheard: unheardIDs)
    }
}

private struct ServerKeyRow: Codable, FetchableRecord, PersistableRecord {
    static let databaseTableName = "server_key"
    var name: String
    var value: Data
    var createdAt: Int64

    enum CodingKeys: String, CodingKey {
        case name, value, createdAt = "created_at"
    }
}

private struct TransmissionRow: Codable, FetchableRecord, PersistableRecord {
    static let databaseTableName = "transmission"
    /// Nil on insert: SQLite assigns it, and it orders bursts that started in the same millisecond.
    var id: Int64?
    var channelID: String
    var userID: String
    var startedAt: Int64
    var durationMilliseconds: Int
    var endReason: String

    enum CodingKeys: String, CodingKey {
        case id, channelID = "channel_id", userID = "user_id", startedAt = "started_at"
        case durationMilliseconds = "duration_ms", endReason = "end_reason"
    }

    enum Columns {
        static let id = Column(CodingKeys.id)
        static let channelID = Column(CodingKeys.channelID)
        static let startedAt = Column(CodingKeys.startedAt)
    }

    init(_ record: TransmissionRecord) {
        id = nil
        channelID = record.channelID.uuidString
        userID = record.userID
        startedAt = record.startedAt.unixMilliseconds
        durationMilliseconds = record.durationMilliseconds
        endReason = record.endReason
    }

    func record() throws(StoreError) -> TransmissionRecord {
        TransmissionRecord(channelID: try uuid(channelID, in: "transmission"), userID: userID,
                           startedAt: Date(unixMilliseconds: startedAt), durationMilliseconds: durationMilliseconds,
                           endReason: endReason)
    }
}

private struct AuditRow: Codable, FetchableRecord, PersistableRecord {
    static let databaseTableName = "audit"
    /// Nil on insert: SQLite assigns it, in the order the changes were made.
    var id: Int64?
    var at: Int64
    var source: String
    var actor: String?
    var action: String
    var channelID: String?
    var userID: String?
    /// A JSON object of strings.
    var details: String

    enum CodingKeys: String, CodingKey {
        case id, at, source, actor, action, channelID = "channel_id", userID = "user_id", details
    }

    enum Columns {
        static let id = Column(CodingKeys.id)
        static let channelID = Column(CodingKeys.channelID)
    }

    init(_ record: AuditRecord) throws(StoreError) {
        id = nil
        at = record.at.unixMilliseconds
        source = record.source
        actor = record.actor
        action = record.action
        channelID = record.channelID?.uuidString
        userID = record.userID
        do {
            let encoder = JSONEncoder()
            encoder.outputFormatting = .sortedKeys
            details = String(decoding: try encoder.encode(record.details), as: UTF8.self)
        } catch {
            throw .invalid("the audit record's details cannot be stored: \(error)")
        }
    }

    func record() throws(StoreError) -> AuditRecord {
        let fields: [String: String]
        do { fields = try JSONDecoder().decode([String: String].self, from: Data(details.utf8)) } catch {
            throw .database("audit record \(id ?? 0) has details that are not a JSON object of strings; the database was edited by hand or is damaged")
        }
        var record = AuditRecord(at: Date(unixMilliseconds: at), source: source, actor: actor, action: action,
                                 channelID: try channelID.map { id throws(StoreError) in try uuid(id, in: "audit") },
                                 userID: userID, details: fields)
        record.sequence = id ?? 0
        return record
    }
}

private struct RevocationRow: Codable, FetchableRecord, MutablePersistableRecord {
    static let databaseTableName = "revocation"
    /// Nil on insert: SQLite assigns it.
    var sequence: Int64?
    var channelID: String
    var userID: String?
    var tokenID: String?
    var revokedAt: Int64
    var expiresAt: Int64?
    var reason: String

    enum CodingKeys: String, CodingKey {
        case sequence, channelID = "channel_id", userID = "user_id", tokenID = "token_id", revokedAt = "revoked_at"
        case expiresAt = "expires_at", reason
    }

    enum Columns {
        static let sequence = Column(CodingKeys.sequence)
        static let channelID = Column(CodingKeys.channelID)
        static let userID = Column(CodingKeys.userID)
        static let tokenID = Column(CodingKeys.tokenID)
        static let revokedAt = Column(CodingKeys.revokedAt)
        static let expiresAt = Column(CodingKeys.expiresAt)
    }

    init(_ record: RevocationRecord) {
        sequence = nil
        channelID = record.channelID.uuidString
        userID = record.userID
        tokenID = record.tokenID
        revokedAt = record.revokedAt.unixMilliseconds
        expiresAt = record.expiresAt?.unixMilliseconds
        reason = record.reason
    }

    mutating func didInsert(_ inserted: InsertionSuccess) { sequence = inserted.rowID }

    func record() throws(StoreError) -> RevocationRecord {
        RevocationRecord(sequence: sequence ?? 0, channelID: try uuid(channelID, in: "revocation"), userID: userID, tokenID: tokenID,
                         revokedAt: Date(unixMilliseconds: revokedAt), expiresAt: expiresAt.map(Date.init(unixMilliseconds:)),
                         reason: reason)
    }
}
