import ChannelStore
import Foundation
import PostgresNIO

extension PostgresChannelStore {

    public func serverKey(named name: String) async throws(StoreError) -> [UInt8]? {
        try await rows("read server key '\(name)'", "SELECT value FROM server_key WHERE name = \(name)") {
            [UInt8](try $0.decode(Data.self))
        }.first
    }

    public func storeServerKeyIfAbsent(named name: String, value: [UInt8]) async throws(StoreError) -> [UInt8] {
        guard !name.isEmpty, !value.isEmpty else { throw .invalid("a server key needs a name and a non-empty value") }
        let now = Date().unixMilliseconds
        let logger = logger
        // Whichever node commits first wins: a concurrent INSERT waits for it, does nothing, and the
        // SELECT (a new snapshot under READ COMMITTED) reads the winner's key. All nodes share it.
        let stored = try await withConnection("store server key '\(name)'") { connection in
            try await connection.execute("""
                INSERT INTO server_key (name, value, created_at) VALUES (\(name), \(Data(value)), \(now))
                ON CONFLICT (name) DO NOTHING
                """, logger: logger)
            return try await connection.rows("SELECT value FROM server_key WHERE name = \(name)", logger: logger) {
                [UInt8](try $0.decode(Data.self))
            }.first
        }
        guard let stored else { throw .database("server key '\(name)' vanished right after it was stored") }
        return stored
    }

    public func setServerKey(named name: String, value: [UInt8]) async throws(StoreError) {
        guard !name.isEmpty, !value.isEmpty else { throw .invalid("a server key needs a name and a non-empty value") }
        let now = Date().unixMilliseconds
        let logger = logger
        try await withConnection("store server key '\(name)'") { connection in
            try await connection.execute("""
                INSERT INTO server_key (name, value, created_at) VALUES (\(name), \(Data(value)), \(now))
                ON CONFLICT (name) DO UPDATE SET value = excluded.value, created_at = excluded.created_at
                """, logger: logger)
        }
    }
}
