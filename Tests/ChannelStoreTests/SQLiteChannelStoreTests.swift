import ChannelProtocol
@testable import ChannelStore
@testable import ChannelStoreSQLite
import Foundation
import GRDB
import Testing

/// What only the SQLite store has: a file in the data directory, its permissions and durability,
/// processes opening it at once, and the upgrades of schemas written by earlier squelchd versions.
@Suite final class SQLiteChannelStoreTests: Sendable {
    let directory: String
    var path: String { directory + "/" + SQLiteChannelStore.defaultFileName }

    init() throws {
        directory = FileManager.default.temporaryDirectory.appendingPathComponent("channel-store-\(UUID())").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
    }

    deinit { try? FileManager.default.removeItem(atPath: directory) }

    func open() throws -> SQLiteChannelStore { try SQLiteChannelStore(directory: directory) }

    func makeChannel(_ name: String = "Ops") -> ChannelRecord { StoreContractTests().makeChannel(name) }

    @Test func aVersion1DatabaseIsUpgradedWithItsData() async throws {
        // A data directory written by a squelchd that only knew v1.
        let channel = makeChannel()
        do {
            let pool = try DatabasePool(path: path)
            try SQLiteChannelStore.migrator.migrate(pool, upTo: "v1")
            try await pool.write { db in
                try db.execute(sql: "INSERT INTO channel (id, name, mode, max_burst_seconds, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?)",
                               arguments: [channel.id.uuidString, "Ops", "halfDuplex", 45, 0, 0])
            }
            try pool.close()
        }
        let store = try open()
        #expect(try await store.channel(channel.id)?.name == "Ops")
        _ = try await store.revoke(.member(channel: channel.id, user: "ann", at: ms(), reason: "removed"))
        #expect(try await store.revocations(after: 0, channel: nil).count == 1)
    }

    /// Revocations an older squelchd stored as typed (lower case, a trailing newline) void their
    /// token after the upgrade; two rows that turn out to be one token leave the first.
    @Test func revocationsStoredAsTypedStillVoidTheirTokenAfterTheUpgrade() async throws {
        let channel = makeChannel()
        let token = UUID()
        let other = UUID()
        do {
            let pool = try DatabasePool(path: path)
            try SQLiteChannelStore.migrator.migrate(pool, upTo: "v6-transmissions-in-progress")
            try await pool.write { db in
                try db.execute(sql: "INSERT INTO channel (id, name, mode, max_burst_seconds, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?)",
                               arguments: [channel.id.uuidString, "Ops", "halfDuplex", 45, 0, 0])
                for (id, reason) in [(token.uuidString.lowercased() + "\n", "phone lost"),
                                     (" " + other.uuidString.lowercased(), "left the crew"), ("not-a-uuid", "typo")] {
                    try db.execute(sql: "INSERT INTO revocation (channel_id, token_id, revoked_at, reason) VALUES (?, ?, ?, ?)",
                                   arguments: [channel.id.uuidString, id, 1_000, reason])
                }
                // The same token revoked again, whole, by a build that stored it canonically.
                try db.execute(sql: "INSERT INTO revocation (channel_id, user_id, token_id, revoked_at, expires_at, reason) VALUES (?, ?, ?, ?, ?, ?)",
                               arguments: [channel.id.uuidString, "ann", token.uuidString, 2_000, 4_000_000_000_000, "again"])
            }
            try pool.close()
        }
        let store = try open()
        let issued = Date(timeIntervalSince1970: 0)
        let hit = try await store.revocation(channel: channel.id, user: "ann", tokenID: token.uuidString, issuedAt: issued)
        #expect(hit?.reason == "phone lost")
        // The first revocation stands and learned the later one's user and expiry, so it is pruned in time.
        #expect(hit?.userID == "ann" && hit?.expiresAt == Date(timeIntervalSince1970: 4_000_000_000))
        #expect(try await store.revocation(channel: channel.id, user: "bob", tokenID: other.uuidString, issuedAt: issued)?.reason == "left the crew")
        let all = try await store.revocations(after: 0, channel: channel.id)
        #expect(all.map(\.tokenID) == [token.uuidString, other.uuidString, "not-a-uuid"])
    }

    @Test func schemaVersionIsRecorded() async throws {
        try await open().close()
        let applied = try await DatabaseQueue(path: path).read { db in
            try String.fetchAll(db, sql: "SELECT identifier FROM grdb_migrations ORDER BY identifier")
        }
        #expect(applied == ["v1", "v2-revocations", "v3-member-grants", "v4-transmission-by-time", "v5-member-subscriptions",
                            "v6-transmissions-in-progress", "v7-canonical-token-ids", "v8-audit"])
    }

    @Test func filesArePrivateAndCommitsAreFullySynced() async throws {
        let store = try open()
        try await store.createChannel(makeChannel())
        for file in [path, path + "-wal", path + "-shm"] {
            let mode = try #require(try FileManager.default.attributesOfItem(atPath: file)[.posixPermissions] as? Int)
            #expect(mode & 0o077 == 0, "\(file) has mode \(String(mode, radix: 8))")
        }
        let synchronous = try await store.pool.write { db in try Int.fetchOne(db, sql: "PRAGMA synchronous") }
        #expect(synchronous == 2)  // FULL
        let journal = try await store.pool.read { db in try String.fetchOne(db, sql: "PRAGMA journal_mode") }
        #expect(journal == "wal")
    }

    @Test func processesOpeningANewFileAtOnceAgree() async throws {
        let directory = self.directory
        let results = await withTaskGroup(of: StoreError?.self) { group in
            // Eight at once: with two migrations, each its own transaction, an opener can find another
            // half-way through (CI caught that with four).
            for _ in 0..<8 {
                group.addTask {
                    do throws(StoreError) { _ = try SQLiteChannelStore(directory: directory); return nil } catch { return error }
                }
            }
            return await group.reduce(into: [StoreError?]()) { $0.append($1) }
        }
        #expect(results.compactMap { $0 }.isEmpty, "\(results)")
        #expect(try await open().revision() == 0)
    }

    @Test func aCorruptFileIsRefusedClearly() throws {
        var bytes = [UInt8](repeating: 0, count: 8192)
        for i in bytes.indices { bytes[i] = .random(in: 0...255) }
        #expect(FileManager.default.createFile(atPath: path, contents: Data(bytes)))
        var thrown: StoreError?
        do { _ = try open() } catch let error as StoreError { thrown = error }
        guard case .database(let text)? = thrown else { Issue.record("expected a database error, got \(String(describing: thrown))"); return }
        #expect(text.contains(path) && text.contains("not a database"), "\(text)")
        #expect(text.contains("restore a backup"), "\(text)")
    }

    @Test func aNewerSchemaIsRefused() async throws {
        try await open().close()
        try await DatabaseQueue(path: path).write { db in try db.execute(sql: "INSERT INTO grdb_migrations (identifier) VALUES ('v9-future')") }
        var thrown: StoreError?
        do { _ = try open() } catch let error as StoreError { thrown = error }
        guard case .database(let text)? = thrown else { Issue.record("expected a database error, got \(String(describing: thrown))"); return }
        #expect(text.contains("newer squelchd") && text.contains("v9-future"), "\(text)")
    }

    @Test func aVersion2MemberRowReadsWithoutAGrant() async throws {
        let channel = makeChannel()
        do {
            let pool = try DatabasePool(path: path)
            try SQLiteChannelStore.migrator.migrate(pool, upTo: "v2-revocations")
            try await pool.write { db in
                try db.execute(sql: "INSERT INTO channel (id, name, mode, max_burst_seconds, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?)",
                               arguments: [channel.id.uuidString, "Ops", "halfDuplex", 45, 0, 0])
                try db.execute(sql: "INSERT INTO member (channel_id, user_id, display_name, joined_at, last_seen, push_token) VALUES (?, 'ann', 'Ann', 0, 0, 'abcd')",
                               arguments: [channel.id.uuidString])
            }
            try pool.close()
        }
        let store = try open()
        let ann = try #require(try await store.member(channel: channel.id, user: "ann"))
        #expect(ann.grant == nil && ann.pushToken == "abcd")
    }
}
