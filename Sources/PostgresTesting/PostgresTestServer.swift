import ChannelStorePostgres
import Foundation
import SquelchTesting
#if canImport(Glibc)
import Glibc
#endif

/// A private PostgreSQL server for tests: Debian's PostgreSQL (`make deps` installs it), initialised
/// in a temporary directory, listening on 127.0.0.1 on a free port and a Unix socket in that
/// directory, run as an unprivileged user when the tests run as root (initdb and postgres refuse
/// root). Durability is off (fsync), which a test never needs and which makes each database cheap.
///
/// A watchdog shell started with the server stops it and removes its directory when the test process
/// exits, however it exits (`kill -9` included), so no server outlives the tests.
public actor PostgresTestServer {
    /// One server for a whole test process, started by the first test that asks; each test then takes
    /// a fresh database of its own with `makeDatabase()`.
    public static let shared = PostgresTestServer()

    /// The user the server runs as when the tests run as root.
    public static let systemUser = "squelch-pg"
    /// The database superuser the tests connect as (trust authentication, loopback only).
    public static let superuser = "squelch"

    private struct Running: Sendable {
        var directory: String
        var port: Int
        var binaries: String
        /// The `setpriv` prefix when the server runs as `systemUser`.
        var asUser: [String]
        /// The watchdog shell's process id.
        var watchdog: Int32

        /// No durability (tests never need it, and it makes databases cheap), loopback only.
        var serverOptions: String {
            "-p \(port) -k \(directory) -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=300"
        }

        func pgctl(_ arguments: [String], what: String) async throws {
            try await PostgresTestServer.run("/usr/bin/env", asUser + [binaries + "/pg_ctl", "-D", directory + "/data"] + arguments, what: what)
        }
    }

    /// Stops the server as an operator's restart does (`pg_ctl stop -m fast`: connections are cut),
    /// waits `downFor`, and starts it again on the same port. For tests of a database outage: use a
    /// server of the test's own (`PostgresTestServer()`), not `shared`.
    public func restart(downFor pause: Duration = .zero) async throws {
        let server = try await start()
        try await server.pgctl(["stop", "-w", "-m", "fast"], what: "stop PostgreSQL")
        if pause > .zero { try await Task.sleep(for: pause) }
        try await server.pgctl(["start", "-w", "-t", "30", "-l", server.directory + "/postgres.log", "-o", server.serverOptions],
                               what: "start PostgreSQL again")
    }

    /// The one start, which every caller awaits: actors are reentrant, so a flag would let two
    /// tests that ask at once start two servers.
    private var starting: Task<Running, any Error>?
    private var databases = 0

    public init() {}

    /// A new empty database on this server (started if it is not yet), as a store location.
    public func makeDatabase(file: String = #fileID, line: Int = #line) async throws -> PostgresLocation {
        let server = try await start()
        databases += 1
        let name = "test_\(getpid())_\(databases)"
        try await Self.run(server.binaries + "/createdb", ["-h", "127.0.0.1", "-p", "\(server.port)", "-U", Self.superuser, name],
                           what: "create database \(name)")
        return PostgresLocation(endpoint: .tcp(host: "127.0.0.1", port: server.port), username: Self.superuser, database: name,
                                tls: .disable)
    }

    /// The server's port on 127.0.0.1.
    public func port() async throws -> Int { try await start().port }

    private func start() async throws -> Running {
        if starting == nil { starting = Task { try await Self.launch() } }
        guard let starting else { throw CancellationError() }
        return try await starting.value
    }

    private static func launch() async throws -> Running {
        let binaries = try Self.findBinaries()
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("squelch-pg-\(UUID().uuidString.prefix(8))").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let asUser: [String]
        do {
            asUser = try await Self.dropPrivileges(owning: directory)
            try await Self.run("/usr/bin/env", asUser + [binaries + "/initdb", "-D", directory + "/data", "-A", "trust", "-U", Self.superuser,
                                                        "-E", "UTF8", "--locale=C", "--no-sync"],
                               what: "initialise a PostgreSQL data directory with \(binaries)/initdb")
        } catch {
            try? FileManager.default.removeItem(atPath: directory)
            throw error
        }
        // A port free now (the socket is closed at once): nothing else on this machine races for it.
        guard let port = HeldPort(tcpListening: true)?.port else { throw PostgresTestError("no free TCP port on 127.0.0.1") }
        let running = Running(directory: directory, port: port, binaries: binaries, asUser: asUser, watchdog: 0)
        try await running.pgctl(["start", "-w", "-t", "30", "-l", directory + "/postgres.log", "-o", running.serverOptions],
                                what: "start PostgreSQL on port \(port)")
        // The watchdog: once this process is gone, the server stops and its directory goes.
        let quoted = (asUser + [binaries + "/pg_ctl", "-D", directory + "/data", "stop", "-m", "immediate"]).map { "'" + $0 + "'" }.joined(separator: " ")
        let script = """
            while kill -0 \(getpid()) 2>/dev/null; do sleep 0.5; done
            /usr/bin/env \(quoted) >/dev/null 2>&1; rm -rf '\(directory)'
            """
        let watchdog = Process()
        watchdog.executableURL = URL(fileURLWithPath: "/bin/sh")
        watchdog.arguments = ["-c", script]
        watchdog.standardOutput = FileHandle.nullDevice
        watchdog.standardError = FileHandle.nullDevice
        try watchdog.run()
        var started = running
        started.watchdog = watchdog.processIdentifier
        return started
    }

    /// Where initdb, postgres, createdb and pg_isready are: Debian keeps the server's programs under
    /// /usr/lib/postgresql/VERSION/bin; the newest version wins.
    static func findBinaries() throws -> String {
        let root = "/usr/lib/postgresql"
        let versions = ((try? FileManager.default.contentsOfDirectory(atPath: root)) ?? [])
            .compactMap(Int.init).sorted(by: >)
        for version in versions where FileManager.default.isExecutableFile(atPath: "\(root)/\(version)/bin/initdb") {
            return "\(root)/\(version)/bin"
        }
        throw PostgresTestError("PostgreSQL's server programs are not installed (no \(root)/*/bin/initdb); run `make deps`, which installs Debian's postgresql package")
    }

    /// The `setpriv` prefix that runs a command as `systemUser` when this process is root (creating
    /// that user if missing, and giving it `directory`); none otherwise.
    static func dropPrivileges(owning directory: String) async throws -> [String] {
        guard getuid() == 0 else { return [] }
        if (try? await run("/usr/bin/id", ["-u", systemUser], what: "look up user \(systemUser)")) == nil {
            try await run("/usr/sbin/useradd", ["--system", "--no-create-home", "--shell", "/usr/sbin/nologin", systemUser],
                          what: "create the unprivileged user \(systemUser) that runs the test database")
        }
        try await run("/bin/chown", ["-R", "\(systemUser):\(systemUser)", directory], what: "give \(directory) to \(systemUser)")
        return ["setpriv", "--reuid=\(systemUser)", "--regid=\(systemUser)", "--clear-groups", "--"]
    }

    /// Runs a program to its end on a thread of its own (not the cooperative pool, which tests need
    /// free), and fails with its output if it exits non-zero.
    ///
    /// posix_spawn and waitpid rather than Foundation's `Process`: `pg_ctl start` leaves the server
    /// running with whatever descriptors it inherited, and `Process` on Linux learns of an exit from
    /// a descriptor its child holds, so it waited for the server to stop. Here the child gets only
    /// /dev/null and an output file on its standard descriptors, and `waitpid` sees its exit.
    @discardableResult
    static func run(_ program: String, _ arguments: [String], what: String) async throws -> String {
        try await withCheckedThrowingContinuation { continuation in
            Thread {
                let path = FileManager.default.temporaryDirectory.appendingPathComponent("squelch-pg-run-\(UUID().uuidString)").path
                defer { unlink(path) }
                var actions = posix_spawn_file_actions_t()
                posix_spawn_file_actions_init(&actions)
                defer { posix_spawn_file_actions_destroy(&actions) }
                posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
                posix_spawn_file_actions_addopen(&actions, 1, path, O_WRONLY | O_CREAT | O_TRUNC, 0o644)
                posix_spawn_file_actions_adddup2(&actions, 1, 2)
                let argv = ([program] + arguments).map { strdup($0) } + [nil]
                defer { for pointer in argv { free(pointer) } }
                var pid: pid_t = 0
                let spawned = posix_spawn(&pid, program, &actions, nil, argv, environ)
                guard spawned == 0 else {
                    continuation.resume(throwing: PostgresTestError("cannot \(what): \(program) did not start (\(String(cString: strerror(spawned))))"))
                    return
                }
                var status: Int32 = 0
                while waitpid(pid, &status, 0) == -1 && errno == EINTR {}
                let text = (try? String(contentsOfFile: path, encoding: .utf8)) ?? ""
                // WIFEXITED and WEXITSTATUS, which Swift does not import.
                let exited = status & 0x7F == 0, code = (status >> 8) & 0xFF
                if exited && code == 0 {
                    continuation.resume(returning: text)
                } else {
                    continuation.resume(throwing: PostgresTestError("cannot \(what): \(program) \(exited ? "exited with \(code)" : "was killed by signal \(status & 0x7F)"): \(text)"))
                }
            }.start()
        }
    }
}

public struct PostgresTestError: Error, CustomStringConvertible {
    public var description: String
    init(_ description: String) { self.description = description }
}
