import ChannelProtocol
import ChannelStore
import ClusterPlacement
import Foundation
import Logging
import PostgresNIO
import Synchronization

/// The `ChannelStore` for a cluster: one PostgreSQL database that every squelchd node shares.
///
/// Built on postgres-nio's `PostgresClient`, whose pool hands out connections only while its `run()`
/// is going: the store runs it in a task of its own from `open` to `close`. Every call is bounded by
/// `operationTimeout`, so a database that stops answering gives `StoreError.unavailable` (which the
/// server's store writer keeps and retries) rather than a call that never returns.
public final class PostgresChannelStore: ChannelStore {
    public let location: PostgresLocation
    /// How long one call may take, waiting for a connection included, before it fails as unavailable.
    public let operationTimeout: Duration
    let client: PostgresClient
    let logger: Logger
    private let runner: Task<Void, Never>
    /// A cluster node's fencing of the writes `apply` makes for its channels (nil: none).
    let fencing = Mutex<Fencing?>(nil)

    /// Connects to the database at `location` and brings its schema up to date (several nodes
    /// starting at once take turns: see `migrate`). Fails, with the reason and what to check, when
    /// the database cannot be reached within `operationTimeout`.
    public static func open(_ location: PostgresLocation, operationTimeout: Duration = .seconds(10),
                            logger: Logger = Logger(label: "squelch.store.postgres")) async throws(StoreError) -> PostgresChannelStore {
        let store = PostgresChannelStore(location: location, operationTimeout: operationTimeout, logger: logger)
        do {
            try await store.migrate()
        } catch {
            try? await store.close()
            throw error
        }
        return store
    }

    private init(location: PostgresLocation, operationTimeout: Duration, logger: Logger) {
        self.location = location
        self.operationTimeout = operationTimeout
        self.logger = logger
        let client = PostgresClient(configuration: location.clientConfiguration(), backgroundLogger: logger)
        self.client = client
        runner = Task { await client.run() }
    }

    /// What a cluster node's writes for a channel must hold: its id, and the epoch it holds each
    /// channel under (nil: not held). `apply` refuses, as `StoreError.fenced`, a write for a channel
    /// whose placement row no longer names this node at that epoch, and holds the row (FOR SHARE)
    /// until it commits, so that no claim moves the channel in between.
    public struct Fencing: Sendable {
        public var node: NodeID
        public var epoch: @Sendable (UUID) -> Epoch?

        public init(node: NodeID, epoch: @escaping @Sendable (UUID) -> Epoch?) {
            self.node = node
            self.epoch = epoch
        }
    }

    /// Fences `apply`'s writes from now on (a cluster node calls it once, at start).
    public func fence(_ fencing: Fencing?) { self.fencing.withLock { $0 = fencing } }

    /// The notification channel of the revision trigger (`pg_notify`), one per change of a channel, a
    /// member's removal or a revocation.
    public static let changesChannel = "squelch_changes"

    /// A hint each time any process changes what `revision()` counts: LISTEN on a dedicated
    /// connection (the pool has none to spare for it), reconnected a second after it fails, with a
    /// hint at each (re)connection since changes made meanwhile were not heard. Notifications are
    /// lost while it is down: read `revision()` as the truth. Ends when the consumer stops.
    public func changes() -> AsyncStream<Void> {
        let (hints, continuation) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
        let task = listen(on: Self.changesChannel, connected: { continuation.yield() }, heard: { _ in continuation.yield() })
        continuation.onTermination = { _ in task.cancel() }
        return hints
    }

    /// The notification channel that carries device pushes between a cluster's nodes.
    public static let devicePushChannel = "squelch_device_pushes"

    /// Every payload any node sends with `notifyDevicePush`, as long as the consumer reads: LISTEN on
    /// a dedicated connection, reconnected a second after it fails. What is sent while it is down is
    /// not heard, as a push to a device with no stream is gone.
    public func devicePushes() -> AsyncStream<String> {
        let (payloads, continuation) = AsyncStream.makeStream(of: String.self, bufferingPolicy: .bufferingNewest(1_000))
        let task = listen(on: Self.devicePushChannel, connected: {}, heard: { continuation.yield($0) })
        continuation.onTermination = { _ in task.cancel() }
        return payloads
    }

    /// Sends `payload` (under PostgreSQL's 8,000-byte limit) to every node's `devicePushes()`.
    public func notifyDevicePush(_ payload: String) async throws(StoreError) {
        let logger = logger
        try await withConnection("send a device push to the other nodes") { connection in
            try await connection.execute("SELECT pg_notify(\(Self.devicePushChannel), \(payload))", logger: logger)
        }
    }

    /// LISTENs on `channel` until cancelled, on a connection of its own, again a second after it fails.
    private func listen(on channel: String, connected: @escaping @Sendable () -> Void,
                        heard: @escaping @Sendable (String) -> Void) -> Task<Void, Never> {
        let location = location, logger = logger
        return Task {
            while !Task.isCancelled {
                do {
                    let connection = try await PostgresConnection.connect(configuration: try location.connectionConfiguration(),
                                                                          id: 0, logger: logger)
                    try? await connection.listen(on: channel) { notifications in
                        // Here LISTEN is in effect: what was sent before it was not heard.
                        connected()
                        for try await notification in notifications { heard(notification.payload) }
                    }
                    try? await connection.close()
                } catch {
                    logger.debug("cannot listen on \(channel); trying again in a second", metadata: ["error": "\(error)"])
                }
                try? await Task.sleep(for: .seconds(1))
            }
        }
    }

    /// Closes every connection. Calls made afterwards fail with a database error.
    public func close() async throws(StoreError) {
        runner.cancel()
        await runner.value
    }

    // MARK: Access

    /// Runs `body` on one pooled connection, within the deadline.
    func withConnection<T: Sendable>(_ action: String, _ body: @escaping @Sendable (PostgresConnection) async throws -> T) async throws(StoreError) -> T {
        let client = client
        do {
            return try await withDeadline(operationTimeout, action) {
                try await client.withConnection { connection in try await body(connection) }
            }
        } catch {
            throw storeError("cannot \(action)", error)
        }
    }

    /// Runs `body` in one transaction: committed if it returns, rolled back if it throws.
    func transaction<T: Sendable>(_ action: String, _ body: @escaping @Sendable (PostgresConnection) async throws -> T) async throws(StoreError) -> T {
        let logger = logger
        return try await withConnection(action) { connection in
            try await connection.execute("BEGIN", logger: logger)
            do {
                let value = try await body(connection)
                try await connection.execute("COMMIT", logger: logger)
                return value
            } catch {
                // A connection that failed mid-transaction is closed by the pool; nothing to undo.
                try? await connection.execute("ROLLBACK", logger: logger)
                throw error
            }
        }
    }

    /// The rows of one statement, decoded.
    func rows<T: Sendable>(_ action: String, _ query: PostgresQuery,
                           _ decode: @escaping @Sendable (PostgresRow) throws -> T) async throws(StoreError) -> [T] {
        let logger = logger
        return try await withConnection(action) { connection in try await connection.rows(query, logger: logger, decode) }
    }

    /// Fails with `unavailable` when `body` has not finished within `timeout`, and cancels it.
    private func withDeadline<T: Sendable>(_ timeout: Duration, _ action: String,
                                           _ body: @escaping @Sendable () async throws -> T) async throws -> T {
        let location = location
        return try await withThrowingTaskGroup(of: T.self) { group in
            group.addTask { try await body() }
            group.addTask {
                try await Task.sleep(for: timeout)
                throw StoreError.unavailable("cannot \(action): PostgreSQL at \(location) did not answer within \(timeout); check that it is running and reachable, and that the URL is right")
            }
            defer { group.cancelAll() }
            guard let first = try await group.next() else { throw CancellationError() }
            return first
        }
    }

    // MARK: Errors

    /// Words a failure for an operator: what could not be done, why, and what to check. Conditions
    /// that pass on their own (the server restarting, a connection lost, a deadlock, too many
    /// connections) are `unavailable`, so that the store writer tries again.
    func storeError(_ context: String, _ error: any Error) -> StoreError {
        if let error = error as? StoreError { return error }
        if error is CancellationError { return .database("\(context): the task was cancelled") }
        guard let error = error as? PSQLError else { return .database("\(context): \(error)") }
        switch error.code {
        case .server:
            let state = error.serverInfo?[.sqlState] ?? "?"
            let what = error.serverInfo?[.message] ?? "PostgreSQL error"
            let text = "\(context): \(what) (SQLSTATE \(state))\(Self.hint(sqlState: state))"
            return Self.isTransient(sqlState: state) ? .unavailable(text) : .database(text)
        case .connectionError, .serverClosedConnection, .uncleanShutdown, .sslUnsupported:
            let cause = error.underlying.map { " (\($0))" } ?? ""
            return .unavailable("\(context): the connection to PostgreSQL at \(location) failed\(cause); check that the server is running and reachable")
        case .poolClosed, .clientClosedConnection:
            return .database("\(context): the store is closed")
        default:
            return .database("\(context): \(error.code)")
        }
    }

    /// SQLSTATE classes that pass without anyone changing anything.
    static func isTransient(sqlState state: String) -> Bool {
        // 08 connection exception, 40 transaction rollback (serialization failure, deadlock),
        // 53 insufficient resources (disk full, too many connections), 57 operator intervention
        // (shutdown, restart, cannot connect now), 58 system error (I/O), 55P03 lock not available.
        ["08", "40", "53", "57", "58"].contains(String(state.prefix(2))) || state == "55P03"
    }

    static func hint(sqlState state: String) -> String {
        switch state.prefix(2) {
        case "28": "; check the user and password in the database URL"
        case "3D": "; create the database first (createdb), or fix its name in the URL"
        case "42" where state == "42501": "; grant the user the rights to create tables in the database"
        case "53": "; check the database server's disk and its max_connections"
        default: ""
        }
    }
}

extension PostgresConnection {
    /// Runs a statement that returns no rows.
    func execute(_ query: PostgresQuery, logger: Logger) async throws {
        for try await _ in try await self.query(query, logger: logger) {}
    }

    /// Runs a statement and decodes every row it returns.
    func rows<T>(_ query: PostgresQuery, logger: Logger, _ decode: (PostgresRow) throws -> T) async throws -> [T] {
        var decoded: [T] = []
        for try await row in try await self.query(query, logger: logger) { decoded.append(try decode(row)) }
        return decoded
    }

    /// How many rows a statement with `RETURNING 1` touched.
    func count(_ query: PostgresQuery, logger: Logger) async throws -> Int {
        try await rows(query, logger: logger) { _ in () }.count
    }
}
