import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import SquelchInfo
import SquelchTesting
import Synchronization
import Testing

/// Collects a pipe's output on a background reader, so a test can wait for a line with a deadline
/// instead of blocking in a read that may never return.
final class PipeCollector: Sendable {
    private let text = Mutex("")

    init(_ pipe: Pipe) {
        pipe.fileHandleForReading.readabilityHandler = { [weak self] handle in
            let chunk = handle.availableData
            if chunk.isEmpty { handle.readabilityHandler = nil; return }
            self?.append(chunk)
        }
    }

    private func append(_ chunk: Data) { text.withLock { $0 += String(decoding: chunk, as: UTF8.self) } }

    var contents: String { text.withLock { $0 } }

    /// Polls until `pattern` matches or `seconds` pass; returns the match.
    func wait(for pattern: String, seconds: Double) async -> String? {
        let deadline = Date().addingTimeInterval(seconds)
        while Date() < deadline {
            let now = contents
            if let range = now.range(of: pattern, options: .regularExpression) { return String(now[range]) }
            try? await Task.sleep(for: .milliseconds(50))
        }
        return nil
    }
}

extension Process {
    /// Waits for exit up to `seconds`; kills the process and returns false if it doesn't exit.
    func waitForExit(seconds: Double) async -> Bool {
        let deadline = Date().addingTimeInterval(seconds)
        while isRunning, Date() < deadline { try? await Task.sleep(for: .milliseconds(50)) }
        if isRunning { kill(processIdentifier, SIGKILL); waitUntilExit(); return false }
        waitUntilExit()
        return true
    }
}

/// Runs the built executables as a user would. They sit next to the test bundle in the build folder.
enum Executables {
    static let binDirectory = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent()
    static let repository = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

    static func url(_ name: String) -> URL {
        var dir = binDirectory
        // `swift test` may run the bundle from inside an .xctest directory.
        while !FileManager.default.fileExists(atPath: dir.appendingPathComponent(name).path), dir.path != "/" {
            dir.deleteLastPathComponent()
        }
        return dir.appendingPathComponent(name)
    }

    /// Development certificates from the real script (`make certs`), into `directory`.
    /// `squelchd serve` flags for the embedded APNs simulator with the dev certificates in `certs`, on free
    /// ports (a squelchd from `make run` may hold the default ones).
    static func simulatorArguments(certs: String) -> [String] {
        ["--apns-key", certs + "/AuthKey_DEVKEY0001.p8", "--apns-ca", certs + "/ca.pem",
         "--apns-simulator-cert", certs + "/apns-sim.pem", "--apns-simulator-key", certs + "/apns-sim.key",
         "--apns-simulator-port", "0", "--apns-simulator-control-port", "0"]
    }

    static func makeDevCertificates(into directory: String, names: [String] = []) throws {
        let script = Process()
        script.executableURL = repository.appendingPathComponent("certs/make-dev-certs.sh")
        script.arguments = names.flatMap { ["--name", $0] } + [directory]
        script.standardOutput = FileHandle.nullDevice
        try script.run()
        script.waitUntilExit()
        try #require(script.terminationStatus == 0, "certs/make-dev-certs.sh failed")
    }

    /// Runs to completion; returns exit status, stdout and stderr.
    /// Runs `name` to its end. `environment` adds to (or, with an empty value, unsets in) this process's.
    static func run(_ name: String, _ arguments: [String], environment: [String: String] = [:],
                    input: String? = nil) throws -> (status: Int32, out: String, err: String) {
        let process = Process()
        process.executableURL = url(name)
        process.arguments = arguments
        if !environment.isEmpty {
            var merged = ProcessInfo.processInfo.environment
            for (key, value) in environment { merged[key] = value.isEmpty ? nil : value }
            process.environment = merged
        }
        let out = Pipe(), err = Pipe()
        process.standardOutput = out
        process.standardError = err
        let stdin = Pipe()
        if input != nil { process.standardInput = stdin }
        try process.run()
        if let input {
            stdin.fileHandleForWriting.write(Data(input.utf8))
            try stdin.fileHandleForWriting.close()
        }
        let outData = out.fileHandleForReading.readDataToEndOfFile()
        let errData = err.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return (process.terminationStatus, String(decoding: outData, as: UTF8.self), String(decoding: errData, as: UTF8.self))
    }
}

@Suite struct ExecutableTests {
    @Test(arguments: ["squelchd", "walkie", "squelch-bench"])
    func everyExecutableAnswersHelpAndVersion(name: String) throws {
        let version = try Executables.run(name, ["--version"])
        #expect(version.status == 0)
        #expect(version.out.trimmingCharacters(in: .whitespacesAndNewlines) == SquelchInfo.version)
        let help = try Executables.run(name, ["--help"])
        #expect(help.status == 0)
        #expect(help.out.contains("USAGE: \(name)"))
    }

    /// A token on the command line is readable by every local user: walkie says so and how to avoid
    /// it; `--token -` reads it from standard input instead.
    @Test func aTokenOnTheCommandLineIsWarnedAboutAndStandardInputTakesOne() throws {
        let given = try Executables.run("walkie", ["talk", "--token", "not-a-token", "--file", "/nonexistent.wav"])
        #expect(given.status != 0 && given.err.contains("can be read by every user of this machine") && given.err.contains("--token -"), "\(given.err)")
        let piped = try Executables.run("walkie", ["talk", "--token", "-", "--file", "/nonexistent.wav"], input: "not-a-token\n")
        #expect(piped.status == given.status && !piped.err.contains("every user"), "\(piped.err)")
        #expect(piped.err.contains("not a valid token"), "the token read from standard input was checked: \(piped.err)")
        let empty = try Executables.run("walkie", ["talk", "--token", "-", "--file", "/nonexistent.wav"], input: "")
        #expect(empty.status != 0 && empty.err.contains("read no token from standard input"), "\(empty.err)")
    }

    /// Every line walkie prints goes through `say` (stdout) or `fail` (stderr), and both replace control
    /// characters: text from the network (close reasons anyone on the path can forge, refusal reasons)
    /// cannot carry an OSC 52 clipboard write or a clear-screen sequence to the terminal. Carried here by
    /// arguments, which reach the same two functions.
    @Test func walkiesLinesCarryNoEscapeSequences() throws {
        let hostile = "x\u{1B}]52;c;ZXZpbA==\u{07}\u{1B}[2J"
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("walkie-\(UUID())-" + hostile).path
        let failed = try Executables.run("walkie", ["join", "--token-file", directory + "/token"])
        #expect(failed.status != 0 && failed.err.contains("\u{FFFD}]52;c;ZXZpbA==\u{FFFD}\u{FFFD}[2J/token"), "\(failed.err.debugDescription)")
        let said = try Executables.run("walkie", ["status", "--state-dir", directory])
        #expect(said.out.contains("no saved channel in") && said.out.contains("\u{FFFD}[2J"), "\(said.out.debugDescription)")
        for text in [failed.err, said.out, said.err] {
            #expect(!text.unicodeScalars.contains { $0.value == 0x1B || $0.value == 0x07 }, "\(text.debugDescription)")
        }
    }

    @Test func walkieListsTheNullDevice() throws {
        // No sound card here, but ALSA's configuration always defines the null device.
        let result = try Executables.run("walkie", ["devices"])
        #expect(result.status == 0)
        #expect(result.out.contains("null"))
    }

    /// A negative number reaches the range check, which says what to use; the argument parser took
    /// "-1" for a flag and said "Missing value for '--disconnect-grace-seconds <seconds>'".
    @Test func aNegativeNumberIsRefusedForItsRangeNotAsAMissingValue() throws {
        let data = FileManager.default.temporaryDirectory.appendingPathComponent("sq-\(UUID())").path
        defer { try? FileManager.default.removeItem(atPath: data) }
        let result = try Executables.run("squelchd", ["serve", "--disconnect-grace-seconds", "-1", "--data-dir", data])
        #expect(result.status == 78 && result.err.contains("disconnect grace -1 s is out of range; use 0-60 seconds"), "\(result.err)")
        #expect(!result.err.contains("Missing value"), "\(result.err)")
    }

    @Test func squelchdRefusesAMissingCertificateInOneLine() throws {
        let result = try Executables.run("squelchd", ["serve", "--cert", "/nonexistent/chain.pem", "--data-dir",
                                                      FileManager.default.temporaryDirectory.appendingPathComponent("sq-\(UUID())").path])
        #expect(result.status == 78)
        let lines = result.err.split(separator: "\n")
        #expect(lines.count == 1)
        #expect(result.err.contains("/nonexistent/chain.pem") && result.err.contains("make certs"))
    }

    @Test func squelchdNamesAPortInUseAndWarnsOfLooseSecrets() throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("squelchd-port-\(UUID())")
        defer { try? FileManager.default.removeItem(at: dir) }
        let certs = dir.appendingPathComponent("certs").path
        try Executables.makeDevCertificates(into: certs)
        // Another process holds the UDP port.
        let held = try #require(HeldPort(tcpListening: false))
        let port = held.port
        // An admin key any local user can read (a backup restored with the wrong mode): a warning.
        let keyFile = dir.appendingPathComponent("admin.key").path
        try "a-key-long-enough-for-squelchd-0123456789\n".write(toFile: keyFile, atomically: true, encoding: .utf8)
        try FileManager.default.setAttributes([.posixPermissions: 0o644], ofItemAtPath: keyFile)
        let result = try Executables.run("squelchd", ["serve", "--port", "\(port)", "--admin-port", "0", "--apns", "off",
                                                      "--admin-key-file", keyFile,
                                                      "--data-dir", dir.appendingPathComponent("data").path,
                                                      "--cert", certs + "/server-chain.pem", "--key", certs + "/server.key"])
        #expect(result.status == 78)
        let last = result.err.split(separator: "\n").last.map(String.init) ?? ""
        #expect(last == "squelchd: the voice transport (UDP) can't listen on 127.0.0.1:\(port): the port is in use (another squelchd?); "
                + "stop that process or choose another port with --port, SQUELCH_PORT or \"port\" in the config file", "\(result.err)")
        // It started from an empty directory, and said so, with the absolute path.
        #expect(result.err.contains("no database in \(dir.appendingPathComponent("data").path)"))
        #expect(result.err.contains("the admin key \(keyFile) is open to other users (mode 0644)"), "\(result.err)")
        #expect(!result.err.contains("token-key.pem is open"), "the key it made itself is 0600")

        // The transport's own key readable by everyone, and the CA's certificate served as the
        // server's: both warned of.
        try FileManager.default.setAttributes([.posixPermissions: 0o644], ofItemAtPath: certs + "/ca.key")
        let asCA = try Executables.run("squelchd", ["serve", "--port", "\(port)", "--admin-port", "0", "--apns", "off",
                                                    "--data-dir", dir.appendingPathComponent("data").path,
                                                    "--cert", certs + "/ca.pem", "--key", certs + "/ca.key"])
        #expect(asCA.err.contains("the transport's private key \(certs)/ca.key is open to other users (mode 0644)"), "\(asCA.err)")
        #expect(asCA.err.contains("is a CA certificate"), "\(asCA.err)")
        withExtendedLifetime(held) {}  // the port stays taken until squelchd has tried it (both runs stop there)

        // A key file too short to be a key stops the start before anything is made in the data
        // directory (it used to come after the database and the token key).
        let short = dir.appendingPathComponent("short.key").path
        try "short\n".write(toFile: short, atomically: true, encoding: .utf8)
        let fresh = dir.appendingPathComponent("fresh").path
        let refused = try Executables.run("squelchd", ["serve", "--port", "0", "--admin-port", "0", "--apns", "off", "--admin-key-file", short,
                                                       "--data-dir", fresh, "--cert", certs + "/server-chain.pem", "--key", certs + "/server.key"])
        #expect(refused.status == 78 && refused.err.contains(short), "\(refused.err)")
        #expect(!FileManager.default.fileExists(atPath: fresh + "/squelch.sqlite") && !FileManager.default.fileExists(atPath: fresh + "/token-key.pem"))
    }

    /// The embedded APNs simulator's port taken: said in words, with the settings to change, not as
    /// NIO's "bind(descriptor:ptr:bytes:): Address already in use) (errno: 98))".
    @Test func squelchdNamesASimulatorPortInUse() throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("squelchd-sim-port-\(UUID())")
        defer { try? FileManager.default.removeItem(at: dir) }
        let certs = dir.appendingPathComponent("certs").path
        try Executables.makeDevCertificates(into: certs)
        let held = try #require(HeldPort(tcpListening: true))
        let result = try Executables.run("squelchd", ["serve", "--port", "0", "--admin-port", "0", "--apns-simulator-port", "\(held.port)",
                                                      "--apns-simulator-control-port", "0", "--data-dir", dir.appendingPathComponent("data").path,
                                                      "--cert", certs + "/server-chain.pem", "--key", certs + "/server.key",
                                                      "--apns-key", certs + "/AuthKey_DEVKEY0001.p8", "--apns-simulator-cert", certs + "/apns-sim.pem",
                                                      "--apns-simulator-key", certs + "/apns-sim.key", "--apns-ca", certs + "/ca.pem"])
        #expect(result.status == 78, "\(result.err)")
        #expect(result.err.contains("the embedded APNs simulator could not start: cannot listen for the APNs simulator (HTTP/2) on 127.0.0.1:\(held.port) "
                                    + "(the port is in use, perhaps by another squelchd)"), "\(result.err)")
        #expect(result.err.contains("--apns-simulator-port"), "\(result.err)")
        #expect(!result.err.contains("errno"), "\(result.err)")
        withExtendedLifetime(held) {}
    }

    /// squelchd serving the network with the development certificate, which names only loopback
    /// addresses, says that clients elsewhere will refuse it; with a certificate the script made for
    /// another name too, it doesn't.
    @Test func squelchdWarnsOfALoopbackCertificateServedToTheNetwork() async throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("squelchd-names-\(UUID())")
        defer { try? FileManager.default.removeItem(at: dir) }
        let certs = dir.appendingPathComponent("certs").path
        try Executables.makeDevCertificates(into: certs)
        func serve(pushes: [String] = ["--apns", "off"]) async throws -> String {
            let process = Process()
            process.executableURL = Executables.url("squelchd")
            process.arguments = ["serve", "--host", "0.0.0.0", "--port", "0", "--admin-port", "0",
                                 "--data-dir", dir.appendingPathComponent("data").path,
                                 "--cert", certs + "/server-chain.pem", "--key", certs + "/server.key"] + pushes
            let err = Pipe()
            process.standardError = err
            let log = PipeCollector(err)
            try process.run()
            defer { if process.isRunning { kill(process.processIdentifier, SIGKILL) } }
            #expect(await log.wait(for: #"voice transport listening"#, seconds: 20) != nil, "\(log.contents)")
            process.terminate()
            #expect(await process.waitForExit(seconds: 15))
            return log.contents
        }
        let loopbackOnly = try await serve()
        #expect(loopbackOnly.contains("the voice transport listens on 0.0.0.0, beyond this machine, but its certificate is only for localhost, 127.0.0.1, ::1: clients on other machines will refuse it"),
                "\(loopbackOnly)")
        try Executables.makeDevCertificates(into: certs, names: ["voice.example.org"])
        let named = try await serve()
        #expect(!named.contains("clients on other machines will refuse it"), "\(named)")
        #expect(!named.contains("APNs simulator, which wakes no real phone"), "\(named)")
        // Serving the network with pushes still going to the embedded simulator (the default):
        // real phones are never woken, and /healthz says pushes are fine. Said at start.
        let simulated = try await serve(pushes: Executables.simulatorArguments(certs: certs))
        #expect(simulated.contains("wake pushes go to the embedded APNs simulator, which wakes no real phone"), "\(simulated)")
    }

    /// Starts the real server on a free port with certificates from the real script, asks /healthz,
    /// then stops it with SIGTERM and expects a clean exit.
    @Test func squelchdServesHealthAndStopsOnSIGTERM() async throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("squelchd-e2e-\(UUID())")
        let certs = dir.appendingPathComponent("certs").path
        try Executables.makeDevCertificates(into: certs)

        let process = Process()
        process.executableURL = Executables.url("squelchd")
        process.arguments = ["serve", "--admin-port", "0", "--data-dir", dir.appendingPathComponent("data").path,
                             "--cert", certs + "/server-chain.pem", "--key", certs + "/server.key"]
            + Executables.simulatorArguments(certs: certs)
        let err = Pipe()
        process.standardError = err
        let log = PipeCollector(err)
        try process.run()
        defer { if process.isRunning { kill(process.processIdentifier, SIGKILL) } }

        // Wait for the server to name its port.
        let line = await log.wait(for: #"listening on http://127\.0\.0\.1:\d+"#, seconds: 20)
        let portText = try #require(line?.split(separator: ":").last, "no port in log: \(log.contents)")
        let bound = try #require(Int(portText))
        // The admin API may answer before the voice transport is up, and /healthz rightly says 503
        // until it is: ask once both are listening.
        #expect(await log.wait(for: #"voice transport listening"#, seconds: 20) != nil, "\(log.contents)")
        let url = try #require(URL(string: "http://127.0.0.1:\(bound)/healthz"))
        let (body, response) = try await URLSession.shared.data(from: url)
        #expect((response as? HTTPURLResponse)?.statusCode == 200)
        let health = try JSONSerialization.jsonObject(with: body) as? [String: Any]
        #expect(health?["status"] as? String == "ok")
        #expect((health?["certificate"] as? String)?.contains("squelchd (dev)") == true)

        process.terminate()  // SIGTERM
        let exited = await process.waitForExit(seconds: 15)
        #expect(exited, "squelchd did not stop within 15 s of SIGTERM")
        #expect(process.terminationReason == .exit)
        #expect(process.terminationStatus == 0)
    }
}
