import ChannelProtocol
import ChannelStore
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

    func read<T: Sendable>(_ action: String, _ body: @Sendable (Database) throws -> T) async throws(StoreError) -> T {
        do { return try await pool.read(body) } catch { throw Self.storeError("cannot \(action)", error) }
    }

    func write<T: Sendable>(_ action: String, _ body: @Sendable (Database) throws -> T) async throws(StoreError) -> T {
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
