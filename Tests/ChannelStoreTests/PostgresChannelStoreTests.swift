import ChannelStore
@testable import ChannelStorePostgres
import Foundation
import PostgresNIO
import PostgresTesting
import SquelchTesting
import Synchronization
import Testing

/// What only the PostgreSQL store has: its URL, nodes migrating one database at once, versions from a
/// newer squelchd, and a database that does not answer.
@Suite struct PostgresChannelStoreTests {
    @Test(arguments: [
        ("postgres://squelch:secret@db.example.com:6543/voice?sslmode=require",
         PostgresLocation(endpoint: .tcp(host: "db.example.com", port: 6543), username: "squelch", password: "secret",
                          database: "voice", tls: .require)),
        ("postgresql://ann@localhost/squelch",
         PostgresLocation(endpoint: .tcp(host: "localhost", port: 5432), username: "ann", database: "squelch", tls: .prefer)),
        ("postgres://ann@/squelch?host=/run/postgresql&port=5433",
         PostgresLocation(endpoint: .unixSocket(directory: "/run/postgresql", port: 5433), username: "ann", database: "squelch")),
        ("postgres://ann@[::1]:5432/squelch?sslmode=verify-full",
         PostgresLocation(endpoint: .tcp(host: "::1", port: 5432), username: "ann", database: "squelch", tls: .verifyFull)),
    ])
    func databaseURLsAreRead(url: String, expected: PostgresLocation) throws {
        #expect(try PostgresLocation(url: url) == expected)
        #expect(try PostgresLocation(url: expected.url) == expected, "the URL a location gives reads back as itself")
    }

    @Test(arguments: [
        ("mysql://ann@db/squelch", "must start with postgres://"),
        ("postgres://db.example.com/squelch", "names no user"),
        ("postgres://ann@db.example.com", "names no database"),
        ("postgres://ann@db.example.com:99999/squelch", "not a port number"),
        ("postgres://ann@db.example.com/squelch?sslmode=sometimes", "sslmode 'sometimes'"),
        ("postgres://ann@db.example.com/squelch?pool=5", "unknown parameter 'pool'"),
        ("postgres://ann@/squelch", "names no host"),
    ])
    func badDatabaseURLsAreRefusedSayingWhy(url: String, expected: String) {
        #expect(throws: StoreError.self) { try PostgresLocation(url: url) }
        do { _ = try PostgresLocation(url: url) } catch {
            #expect(error.description.contains(expected), "\(error)")
        }
    }

    @Test func thePasswordIsNeverShown() throws {
        let location = try PostgresLocation(url: "postgres://squelch:hunter2@db.example.com/voice")
        #expect(!location.description.contains("hunter2") && location.description.contains("squelch:***@db.example.com"))
        let unparsable = PostgresLocation.redacted("postgres://squelch:hunter2@db.example.com:x/voice")
        #expect(!unparsable.contains("hunter2"))
    }

    @Test func nodesStartingTogetherMigrateOnceAndAgree() async throws {
        let location = try await PostgresTestServer.shared.makeDatabase()
        let stores = try await withThrowingTaskGroup(of: PostgresChannelStore.self) { group in
            for _ in 0 ..< 4 { group.addTask { try await PostgresChannelStore.open(location) } }
            return try await group.reduce(into: []) { $0.append($1) }
        }
        let keys = try await withThrowingTaskGroup(of: [UInt8].self) { group in
            for (index, store) in stores.enumerated() {
                group.addTask { try await store.storeServerKeyIfAbsent(named: "reset", value: [UInt8(index + 1)]) }
            }
            return try await group.reduce(into: []) { $0.append($1) }
        }
        #expect(Set(keys).count == 1, "every node reads the one key that was stored first: \(keys)")
        let applied = try await stores[0].client.query("SELECT id FROM schema_migration ORDER BY id")
            .collect().map { try $0.decode(String.self) }
        #expect(applied == PostgresChannelStore.migrations.map(\.id))
        #expect(try await stores[0].revision() == 0)
        for store in stores { try await store.close() }
    }

    @Test func aSchemaFromANewerSquelchdIsRefused() async throws {
        let location = try await PostgresTestServer.shared.makeDatabase()
        let store = try await PostgresChannelStore.open(location)
        try await store.client.query("INSERT INTO schema_migration (id, applied_at) VALUES ('v99-future', 0)")
        try await store.close()
        let error = await #expect(throws: StoreError.self) { try await PostgresChannelStore.open(location) }
        #expect(error?.description.contains("v99-future") == true && error?.description.contains("newer squelchd") == true,
                "\(String(describing: error))")
    }

    @Test func aDatabaseThatDoesNotAnswerIsUnavailableAndNamed() async throws {
        // A port that completes TCP and then says nothing, like a server stopped with SIGSTOP.
        let silent = try #require(HeldPort(tcpListening: true))
        let location = PostgresLocation(endpoint: .tcp(host: "127.0.0.1", port: silent.port), username: "squelch",
                                        password: "secret", database: "voice", tls: .disable)
        let started = ContinuousClock.now
        let error = await #expect(throws: StoreError.self) {
            try await PostgresChannelStore.open(location, operationTimeout: .seconds(1))
        }
        #expect(error?.isTransient == true, "\(String(describing: error))")
        #expect(error?.description.contains("127.0.0.1:\(silent.port)") == true && error?.description.contains("secret") == false,
                "\(String(describing: error))")
        #expect(ContinuousClock.now - started < .seconds(10))
    }

    /// A change made through another connection (another node, `squelchd channel`) is hinted at once
    /// by LISTEN/NOTIFY; a member joining (no revision change) is not.
    @Test func changesMadeElsewhereAreHinted() async throws {
        let location = try await PostgresTestServer.shared.makeDatabase()
        let listening = try await PostgresChannelStore.open(location), other = try await PostgresChannelStore.open(location)
        let hints = Mutex(0)
        let consumer = Task { for await _ in listening.changes() { hints.withLock { $0 += 1 } } }
        #expect(await eventually(seconds: 5) { hints.withLock { $0 } == 1 }, "a hint once listening")
        let channel = ChannelRecord(name: "Ops")
        try await other.createChannel(channel)
        #expect(await eventually(seconds: 5) { hints.withLock { $0 } == 2 }, "a hint for the new channel")
        try await other.upsertMember(MemberRecord(channelID: channel.id, userID: "ann", displayName: "Ann"))
        try await Task.sleep(for: .milliseconds(300))
        #expect(hints.withLock { $0 } == 2, "joins do not make nodes reload")
        try await other.removeMember(channel: channel.id, user: "ann")
        #expect(await eventually(seconds: 5) { hints.withLock { $0 } == 3 }, "a hint for the removal")
        consumer.cancel()
        try await listening.close()
        try await other.close()
    }

    /// The cluster's APNs provider JWT: the first node to store one wins, a swap replaces only the JWT
    /// it names (so nodes that found it due together mint one between them), and ages are the
    /// database's clock.
    @Test func theSharedProviderTokenIsSwappedOnlyInPlaceOfTheOneNamed() async throws {
        let location = try await PostgresTestServer.shared.makeDatabase()
        let one = try await PostgresChannelStore.open(location), two = try await PostgresChannelStore.open(location)
        let key = "DEVTEAM001.DEVKEY0001"
        #expect(try await one.providerToken(key: key) == nil)
        let first = try await one.replaceProviderToken(key: key, replacing: nil, with: "jwt-a")
        #expect(first.jwt == "jwt-a" && (0..<5_000_000).contains(first.ageMicroseconds))
        #expect(try await two.replaceProviderToken(key: key, replacing: nil, with: "jwt-b").jwt == "jwt-a", "the first stored wins")
        let racing = try await withThrowingTaskGroup(of: String.self) { group in
            for (store, jwt) in [(one, "jwt-c"), (two, "jwt-d")] {
                group.addTask { try await store.replaceProviderToken(key: key, replacing: "jwt-a", with: jwt).jwt }
            }
            return try await group.reduce(into: [String]()) { $0.append($1) }
        }
        #expect(Set(racing).count == 1 && ["jwt-c", "jwt-d"].contains(racing[0]), "one swap of two: \(racing)")
        #expect(try await two.replaceProviderToken(key: key, replacing: "jwt-a", with: "jwt-e").jwt == racing[0])
        #expect(try await one.providerToken(key: "OTHERTEAM.KEY") == nil, "one JWT per team and key")
        try await one.close()
        try await two.close()
    }
}
