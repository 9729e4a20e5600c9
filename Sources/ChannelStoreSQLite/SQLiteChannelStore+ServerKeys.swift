import ChannelProtocol
import ChannelStore
import Foundation
import GRDB

extension SQLiteChannelStore {

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
}
