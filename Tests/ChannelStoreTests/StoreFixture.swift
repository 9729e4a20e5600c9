import ChannelStore
@testable import ChannelStorePostgres
import ChannelStoreSQLite
import Foundation
import GRDB
import PostgresNIO
import PostgresTesting
import Testing

/// The stores the contract runs against.
enum StoreBackend: String, CaseIterable, Sendable, CustomTestStringConvertible {
    case sqlite, postgres
    var testDescription: String { rawValue }
}

/// One test's empty database, and the stores it opens on it (each `open()` is another connection,
/// as another process or node would have). Stores still open at the end are closed.
final class StoreFixture: Sendable {
    enum Database: Sendable {
        case sqlite(directory: String)
        case postgres(PostgresLocation)
    }

    let database: Database
    private let opened = Opened()

    init(_ backend: StoreBackend) async throws {
        switch backend {
        case .sqlite:
            let directory = FileManager.default.temporaryDirectory.appendingPathComponent("channel-store-\(UUID())").path
            try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
            database = .sqlite(directory: directory)
        case .postgres:
            database = .postgres(try await PostgresTestServer.shared.makeDatabase())
        }
    }

    deinit {
        let opened = opened, database = database
        Task {
            for store in await opened.stores { try? await store.close() }
            if case .sqlite(let directory) = database { try? FileManager.default.removeItem(atPath: directory) }
        }
    }

    func open() async throws -> any ChannelStore {
        let store: any ChannelStore
        switch database {
        case .sqlite(let directory): store = try SQLiteChannelStore(directory: directory)
        case .postgres(let location): store = try await PostgresChannelStore.open(location)
        }
        await opened.add(store)
        return store
    }

    /// Runs SQL on the database behind the stores' backs: a row edited by hand, or damaged.
    func execute(_ sql: String) async throws {
        switch database {
        case .sqlite(let directory):
            try await DatabaseQueue(path: directory + "/" + SQLiteChannelStore.defaultFileName).write { db in try db.execute(sql: sql) }
        case .postgres(let location):
            let store = try await PostgresChannelStore.open(location)
            defer { Task { try? await store.close() } }
            try await store.client.query(PostgresQuery(unsafeSQL: sql))
        }
    }

    /// The number a `SELECT count(*) …` returns, read behind the stores' backs.
    func count(_ sql: String) async throws -> Int {
        switch database {
        case .sqlite(let directory):
            return try await DatabaseQueue(path: directory + "/" + SQLiteChannelStore.defaultFileName).read { db in
                try Int.fetchOne(db, sql: sql) ?? 0
            }
        case .postgres(let location):
            let store = try await PostgresChannelStore.open(location)
            defer { Task { try? await store.close() } }
            let rows = try await store.client.query(PostgresQuery(unsafeSQL: sql)).collect()
            return Int(try rows.first?.decode(Int64.self) ?? 0)
        }
    }

    private actor Opened {
        var stores: [any ChannelStore] = []
        func add(_ store: any ChannelStore) { stores.append(store) }
    }
}
