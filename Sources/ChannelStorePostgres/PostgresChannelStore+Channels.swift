import ChannelProtocol
import ChannelStore
import Foundation
import PostgresNIO

extension PostgresChannelStore {

    public func createChannel(_ channel: ChannelRecord) async throws(StoreError) {
        try channel.validate()
        let logger = logger
        let inserted = try await withConnection("create channel \(channel.id)") { connection in
            try await connection.count("""
                INSERT INTO channel (id, name, image, mode, max_burst_seconds, created_at, updated_at)
                VALUES (\(channel.id), \(channel.name), \(channel.image), \(channel.mode.rawValue), \(Int64(channel.maxBurstSeconds)),
                        \(channel.createdAt.unixMilliseconds), \(channel.updatedAt.unixMilliseconds))
                ON CONFLICT (id) DO NOTHING RETURNING 1
                """, logger: logger)
        }
        if inserted == 0 { throw .invalid("a channel with id \(channel.id) exists") }
    }

    public func channel(_ id: UUID) async throws(StoreError) -> ChannelRecord? {
        try await rows("read channel \(id)", "SELECT \(unescaped: ChannelColumns.list) FROM channel WHERE id = \(id)",
                       ChannelColumns.record).first
    }

    public func channels() async throws(StoreError) -> [ChannelRecord] {
        // ASCII-only case folding ("C"), as SQLite's NOCASE: both stores list channels alike.
        try await rows("list channels", """
            SELECT \(unescaped: ChannelColumns.list) FROM channel ORDER BY lower(name COLLATE "C"), created_at
            """, ChannelColumns.record)
    }

    public func updateChannel(_ channel: ChannelRecord) async throws(StoreError) -> ChannelRecord {
        try channel.validate()
        let now = Date().unixMilliseconds
        // Creation time is the store's fact, not something an edit can move.
        let updated = try await rows("update channel \(channel.id)", """
            UPDATE channel SET name = \(channel.name), image = \(channel.image), mode = \(channel.mode.rawValue),
                max_burst_seconds = \(Int64(channel.maxBurstSeconds)), updated_at = \(now)
            WHERE id = \(channel.id) RETURNING \(unescaped: ChannelColumns.list)
            """, ChannelColumns.record)
        guard let record = updated.first else { throw .channelNotFound(channel.id) }
        return record
    }

    public func deleteChannel(_ id: UUID) async throws(StoreError) {
        let logger = logger
        let deleted = try await withConnection("delete channel \(id)") { connection in
            try await connection.count("DELETE FROM channel WHERE id = \(id) RETURNING 1", logger: logger)
        }
        if deleted == 0 { throw .channelNotFound(id) }
    }

    public func revision() async throws(StoreError) -> Int64 {
        try await rows("read the revision", "SELECT value FROM meta WHERE key = 'revision'") { try $0.decode(Int64.self) }.first ?? 0
    }
}
