import ChannelStore
import ChannelStorePostgres
import ChannelStoreSQLite
import Foundation
import Logging

extension ServerConfiguration {
    /// Where the channels live: the data directory's SQLite file, or the cluster's PostgreSQL.
    public enum StoreLocation: Sendable, CustomStringConvertible {
        case sqlite(directory: String)
        case postgres(PostgresLocation)

        public var description: String {
            switch self {
            case .sqlite(let directory):
                URL(fileURLWithPath: directory).appendingPathComponent(SQLiteChannelStore.defaultFileName).standardizedFileURL.path
            case .postgres(let location): location.description
            }
        }
    }

    public func storeLocation() throws(ConfigurationError) -> StoreLocation {
        guard let database else { return .sqlite(directory: dataDirectory) }
        do { return .postgres(try PostgresLocation(url: database)) } catch {
            throw .invalidValue("\(error.description); set it with \(Self.setting("database").howToSet)")
        }
    }

    /// Whether nodes share what this node keeps: the database, and through it the keys every node
    /// must agree on (token key, admin key, the transport's reset and address-token keys).
    public var sharesDatabase: Bool { database != nil }

    /// Opens the store this configuration names (the SQLite file is made if missing).
    public func openStore(logger: Logger) async throws -> any ChannelStore {
        switch try storeLocation() {
        case .sqlite(let directory): return try SQLiteChannelStore(directory: directory)
        case .postgres(let location): return try await PostgresChannelStore.open(location, logger: logger)
        }
    }
}
