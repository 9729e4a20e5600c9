import ArgumentParser
import Foundation
import Logging
import PTTServer
import SquelchInfo

@main
struct Squelchd: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "squelchd",
        abstract: "The Squelch push-to-talk server.",
        discussion: "Start it with 'squelchd serve'. Everything binds to 127.0.0.1 unless you say otherwise.",
        version: SquelchInfo.version,
        subcommands: [Serve.self])
}

struct Serve: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Run the server until SIGTERM or SIGINT.")

    @Option(help: "Directory for the database and generated keys (created if missing).")
    var dataDir = ServerConfiguration().dataDirectory

    @Option(help: "Address of the admin HTTP API. Keep it on loopback unless a proxy authenticates.")
    var adminHost = ServerConfiguration().adminHost

    @Option(help: "Port of the admin HTTP API (0: any free port).")
    var adminPort = ServerConfiguration().adminPort

    @Option(help: "PEM certificate chain the server presents, leaf first.")
    var cert = ServerConfiguration().certificateChainPath

    @Option(help: "PEM private key of the leaf certificate.")
    var key = ServerConfiguration().privateKeyPath

    @Option(help: "Log level: trace, debug, info, notice, warning, error, critical.")
    var logLevel: String = "info"

    func run() async throws {
        guard let level = Logger.Level(rawValue: logLevel) else {
            throw ValidationError("unknown log level '\(logLevel)'; use trace, debug, info, notice, warning, error or critical")
        }
        LoggingSystem.bootstrap { label in
            var handler = StreamLogHandler.standardError(label: label)
            handler.logLevel = level
            return handler
        }
        var config = ServerConfiguration()
        config.dataDirectory = dataDir
        config.adminHost = adminHost
        config.adminPort = adminPort
        config.certificateChainPath = cert
        config.privateKeyPath = key
        let server: SquelchServer
        do { server = try SquelchServer(configuration: config) } catch {
            // One line, what went wrong and what to do, and a non-zero exit.
            FileHandle.standardError.write(Data("squelchd: \(error)\n".utf8))
            throw ExitCode(78)  // EX_CONFIG
        }
        try await server.run()
    }
}
