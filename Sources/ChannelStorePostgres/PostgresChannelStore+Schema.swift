import ChannelStore
import Foundation
import PostgresNIO

extension PostgresChannelStore {
    /// One schema version: statements run in order, in the transaction that records it.
    struct Migration: Sendable {
        var id: String
        var statements: [String]
    }

    /// Every node runs these at start; the advisory lock makes nodes that start together take turns,
    /// and PostgreSQL's transactional DDL means a version is applied whole or not at all. A database
    /// that has a version this build does not know was upgraded by a newer squelchd: refused.
    static let migrations: [Migration] = [
        Migration(id: "v1", statements: [
            // Dates are unix milliseconds, as in the SQLite store (`Date.unixMilliseconds`), so both
            // keep exactly the same values.
            """
            CREATE TABLE channel (
                id uuid PRIMARY KEY, name text NOT NULL, image text, mode text NOT NULL,
                max_burst_seconds bigint NOT NULL, created_at bigint NOT NULL, updated_at bigint NOT NULL)
            """,
            """
            CREATE TABLE member (
                channel_id uuid NOT NULL REFERENCES channel (id) ON DELETE CASCADE,
                user_id text NOT NULL, display_name text NOT NULL, joined_at bigint NOT NULL, last_seen bigint NOT NULL,
                push_token text, push_environment text, push_registered_at bigint,
                can_talk boolean, can_listen boolean, role text, priority bigint,
                token_id text, token_issued_at bigint, token_expires_at bigint,
                unheard text[],
                PRIMARY KEY (channel_id, user_id))
            """,
            "CREATE TABLE server_key (name text PRIMARY KEY, value bytea NOT NULL, created_at bigint NOT NULL)",
            // No foreign key: the log outlives the channel it was spoken on.
            """
            CREATE TABLE transmission (
                id bigserial PRIMARY KEY, channel_id uuid NOT NULL, user_id text NOT NULL,
                started_at bigint NOT NULL, duration_ms bigint NOT NULL, end_reason text NOT NULL)
            """,
            "CREATE INDEX transmission_by_channel ON transmission (channel_id, started_at)",
            "CREATE INDEX transmission_by_time ON transmission (started_at)",
            "CREATE INDEX transmission_in_progress ON transmission (end_reason) WHERE end_reason = 'inProgress'",
            """
            CREATE TABLE revocation (
                sequence bigserial PRIMARY KEY,
                channel_id uuid NOT NULL REFERENCES channel (id) ON DELETE CASCADE,
                user_id text, token_id text, revoked_at bigint NOT NULL, expires_at bigint, reason text NOT NULL)
            """,
            "CREATE INDEX revocation_by_member ON revocation (channel_id, user_id)",
            "CREATE INDEX revocation_by_token ON revocation (token_id)",
            // No foreign key to channel: the record of a channel's deletion outlives the channel.
            """
            CREATE TABLE audit (
                id bigserial PRIMARY KEY, at bigint NOT NULL, source text NOT NULL, actor text, action text NOT NULL,
                channel_id uuid, user_id text, details jsonb NOT NULL)
            """,
            "CREATE INDEX audit_by_time ON audit (at)",
            "CREATE INDEX audit_by_channel ON audit (channel_id, id)",
            "CREATE TABLE meta (key text PRIMARY KEY, value bigint NOT NULL)",
            "INSERT INTO meta (key, value) VALUES ('revision', 0)",
            // A trigger rather than Swift code, so that edits by any node (or psql) move the revision
            // that servers poll; the notification is the hint a listening node acts on at once, with
            // the table and channel, and the revision stays the truth (notifications are lost while a
            // listener is disconnected).
            """
            CREATE FUNCTION squelch_changed() RETURNS trigger LANGUAGE plpgsql AS $$
            DECLARE changed jsonb;
            BEGIN
                IF TG_OP = 'DELETE' THEN changed := to_jsonb(OLD); ELSE changed := to_jsonb(NEW); END IF;
                UPDATE meta SET value = value + 1 WHERE key = 'revision';
                PERFORM pg_notify('squelch_changes', json_build_object(
                    'table', TG_TABLE_NAME, 'op', TG_OP,
                    'channel', coalesce(changed->>'channel_id', changed->>'id'))::text);
                RETURN NULL;
            END $$
            """,
            "CREATE TRIGGER channel_changed AFTER INSERT OR UPDATE OR DELETE ON channel FOR EACH ROW EXECUTE FUNCTION squelch_changed()",
            "CREATE TRIGGER member_deleted AFTER DELETE ON member FOR EACH ROW EXECUTE FUNCTION squelch_changed()",
            "CREATE TRIGGER revocation_inserted AFTER INSERT ON revocation FOR EACH ROW EXECUTE FUNCTION squelch_changed()",
        ]),
        Migration(id: "v2-cluster", statements: [
            // Times here are the database's clock only (`now()`, microseconds since 1970): nodes'
            // clocks are never compared with it or with each other (ClusterPlacement).
            """
            CREATE TABLE node (
                id text PRIMARY KEY, voice_host text NOT NULL, voice_port integer NOT NULL, admin_url text,
                state text NOT NULL, load bigint NOT NULL, heartbeat_us bigint NOT NULL, started_us bigint NOT NULL)
            """,
            // Rows are never deleted, so that a channel's epoch only grows. Epoch 0 with no home is a
            // placeholder a first claim inserts to have a row to lock: it means "never placed".
            """
            CREATE TABLE placement (
                channel_id uuid PRIMARY KEY, home text NOT NULL, epoch bigint NOT NULL, lease_expires_us bigint NOT NULL)
            """,
            "CREATE INDEX placement_by_home ON placement (home)",
        ]),
        // The APNs provider JWT every node sends, per team and key: minted by one node when due and
        // shared, because Apple counts refreshes per team (PostgresChannelStore+ProviderToken).
        Migration(id: "v3-apns-provider-token", statements: [
            "CREATE TABLE apns_provider_token (key text PRIMARY KEY, jwt text NOT NULL, issued_us bigint NOT NULL)",
        ]),
    ]

    /// Any number that all squelchd nodes agree on, so that their migrations take turns.
    static let migrationLock: Int64 = 0x5351_5545_4C43_4801  // "SQUELCH" 1

    func migrate() async throws(StoreError) {
        let logger = logger
        let migrations = Self.migrations
        let lock = Self.migrationLock
        let applied = try await transaction("prepare the schema of \(location)") { connection -> [String] in
            try await connection.execute("SELECT pg_advisory_xact_lock(\(lock))", logger: logger)
            try await connection.execute("""
                CREATE TABLE IF NOT EXISTS schema_migration (id text PRIMARY KEY, applied_at bigint NOT NULL)
                """, logger: logger)
            let done = Set(try await connection.rows("SELECT id FROM schema_migration", logger: logger) { try $0.decode(String.self) })
            let known = Set(migrations.map(\.id))
            let unknown = done.subtracting(known)
            if !unknown.isEmpty {
                throw StoreError.database("the database has schema version(s) \(unknown.sorted().joined(separator: ", ")) from a newer squelchd; run that version, or restore a backup made before the upgrade")
            }
            var appliedNow: [String] = []
            for migration in migrations where !done.contains(migration.id) {
                for statement in migration.statements {
                    try await connection.execute(PostgresQuery(unsafeSQL: statement), logger: logger)
                }
                let now = Date().unixMilliseconds
                try await connection.execute("INSERT INTO schema_migration (id, applied_at) VALUES (\(migration.id), \(now))", logger: logger)
                appliedNow.append(migration.id)
            }
            return appliedNow
        }
        if !applied.isEmpty { logger.info("database schema brought up to date", metadata: ["applied": "\(applied.joined(separator: ","))"]) }
    }
}
