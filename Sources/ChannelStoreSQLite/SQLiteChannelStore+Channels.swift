import ChannelProtocol
import ChannelStore
import Foundation
import GRDB

extension SQLiteChannelStore {

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
}
