import ArgumentParser
import Foundation
import Logging
import ParticipantTokens
import ChannelStore
import PTTServer

/// `squelchd serve`. Every option can also come from the environment or a JSON config file;
/// `ServerConfiguration.load` merges them (flags > environment > file > defaults).
struct Serve: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Run the server until SIGTERM, SIGINT or SIGHUP (not under nohup).",
        discussion: """
            Settings come from, in rising precedence: defaults, a JSON config file (--config or \
            \(ServerConfiguration.configFileEnvironment); keys: \(ServerConfiguration.settings.map(\.key).joined(separator: ", "))), \
            SQUELCH_* environment variables, then these flags. The admin API key is set with \
            SQUELCH_ADMIN_KEY, "adminKey" in the config file or --admin-key-file; without one, a key is \
            generated into <data-dir>/admin-key (mode 0600) and reused. A bad setting, or a data directory \
            another squelchd serves, exits with status 78; a flag whose value doesn't parse ('--port abc'), \
            with 64, as any command-line mistake; a database that can't be opened, with 74.
            """)

    @Option(help: ArgumentHelp("JSON config file (env: \(ServerConfiguration.configFileEnvironment); default: none).", valueName: "path"))
    var config: String?

    @Option(help: ArgumentHelp(ServerConfiguration.help("dataDirectory", "Directory for the database and generated keys (created if missing)."), valueName: "path"))
    var dataDir: String?

    @Option(help: ArgumentHelp(ServerConfiguration.help("host", "UDP address the push-to-talk transport binds."), valueName: "address"))
    var host: String?

    // Numeric options take the next word whatever it is: a negative value ("-1") then reaches the
    // range checks, which say what to use, where the parser took it for a flag ("Missing value").
    @Option(parsing: .unconditional, help: ArgumentHelp(ServerConfiguration.help("port", "UDP port of the transport (0: any free port)."), valueName: "port"))
    var port: Int?

    @Option(help: ArgumentHelp(ServerConfiguration.help("adminHost", "Address of the admin HTTP API. Keep it on loopback unless a proxy authenticates."), valueName: "address"))
    var adminHost: String?

    @Option(parsing: .unconditional, help: ArgumentHelp(ServerConfiguration.help("adminPort", "Port of the admin HTTP API (0: any free port)."), valueName: "port"))
    var adminPort: Int?

    @Option(help: ArgumentHelp(ServerConfiguration.help("adminKeyFile", "File holding the admin API key (SQUELCH_ADMIN_KEY sets the key itself; without either, one is generated into <data-dir>/admin-key)."), valueName: "path"))
    var adminKeyFile: String?

    @Option(help: ArgumentHelp(ServerConfiguration.help("tokenKeyPath", "Participant-token signing key (P-256 private key, PEM); must exist when set. The token commands take the same setting."), valueName: "path"))
    var tokenKey: String?

    @Option(help: ArgumentHelp(ServerConfiguration.help("previousTokenKeyPath", "During a key rotation: the token key used before --token-key's. Tokens it signed are accepted until they expire; new ones are signed with the current key."), valueName: "path"))
    var previousTokenKey: String?

    @Option(help: ArgumentHelp(ServerConfiguration.help("certificateChainPath", "PEM certificate chain the server presents, leaf first."), valueName: "path"))
    var cert: String?

    @Option(help: ArgumentHelp(ServerConfiguration.help("privateKeyPath", "PEM private key of the leaf certificate."), valueName: "path"))
    var key: String?

    @Option(parsing: .unconditional, help: ArgumentHelp(ServerConfiguration.help("maxConnections", "Live connections beyond this are refused."), valueName: "n"))
    var maxConnections: Int?

    @Option(parsing: .unconditional, help: ArgumentHelp(ServerConfiguration.help("handshakesPerSecondPerAddress", "New connections accepted per second from one IP address (IPv6: one /64)."), valueName: "n"))
    var handshakesPerSecondPerAddress: Int?

    @Option(parsing: .unconditional, help: ArgumentHelp(ServerConfiguration.help("maxConnectionsPerAddress", "Connections open at once from one IP address (IPv6: one /64); raise it for a site with more members behind one NAT."), valueName: "n"))
    var maxConnectionsPerAddress: Int?

    @Option(parsing: .unconditional, help: ArgumentHelp(ServerConfiguration.help("fullDuplexMaxTalkers", "Simultaneous talkers in a full-duplex channel, 1-16."), valueName: "n"))
    var fullDuplexMaxTalkers: Int?

    @Option(parsing: .unconditional, help: ArgumentHelp(ServerConfiguration.help("disconnectGraceSeconds", "Seconds a dropped member keeps its place and the floor, 0-60."), valueName: "seconds"))
    var disconnectGraceSeconds: Double?

    @Option(parsing: .unconditional, help: ArgumentHelp(ServerConfiguration.help("maxQueue", "Floor requests a channel queues while the floor is taken, 0-256."), valueName: "n"))
    var maxQueue: Int?

    @Option(parsing: .unconditional, help: ArgumentHelp(ServerConfiguration.help("controlMessagesPerSecond", "Control messages one connection may send per second, twice as many in a burst; more are dropped (floor requests are denied with cause rateLimited). 1-1000000."), valueName: "n"))
    var controlMessagesPerSecond: Int?

    @Option(parsing: .unconditional, help: ArgumentHelp(ServerConfiguration.help("transmissionLogDays", "Days the transmission log keeps each burst (who talked, when, how long); older records are deleted hourly. 0 keeps them for good. 0-36500."), valueName: "days"))
    var transmissionLogDays: Int?

    @Option(parsing: .unconditional, help: ArgumentHelp(ServerConfiguration.help("auditDays", "Days the audit trail keeps each change made through the admin API or the squelchd commands (GET /v1/audit, squelchd audit); older records are deleted hourly. 0 keeps them for good. 0-36500."), valueName: "days"))
    var auditDays: Int?

    @Option(parsing: .unconditional, help: ArgumentHelp(ServerConfiguration.help("memberRetentionDays", "Days a member may stay away before it is forgotten: it leaves the roster and the wake list, and its device is told to leave the channel (a token it still holds lets it back in). Checked every minute, 20 members at a time. 0 keeps members until removed. 0-36500."), valueName: "days"))
    var memberRetentionDays: Int?

    @Option(help: ArgumentHelp(ServerConfiguration.help("logLevel", "Log level: trace, debug, info, notice, warning, error, critical."), valueName: "level"))
    var logLevel: String?

    @Option(help: ArgumentHelp(ServerConfiguration.help("apns", "Where wake pushes go: simulator (started inside squelchd), apple (api.push.apple.com and its sandbox, by each token's environment), off, or an https://host:port URL."), valueName: "target"))
    var apns: String?

    @Option(help: ArgumentHelp(ServerConfiguration.help("apnsKeyPath", "APNs provider key (.p8) that signs the push JWTs."), valueName: "path"))
    var apnsKey: String?

    @Option(help: ArgumentHelp(ServerConfiguration.help("apnsKeyID", "The .p8 key's 10-character Key ID."), valueName: "id"))
    var apnsKeyId: String?

    @Option(help: ArgumentHelp(ServerConfiguration.help("apnsTeamID", "The 10-character Apple Team ID."), valueName: "id"))
    var apnsTeamId: String?

    @Option(help: ArgumentHelp(ServerConfiguration.help("apnsTopic", "Push topic: <bundle id>.voip-ptt."), valueName: "topic"))
    var apnsTopic: String?

    @Option(help: ArgumentHelp(ServerConfiguration.help("apnsCAPath", "CA certificate trusted for the simulator or a custom APNs URL."), valueName: "path"))
    var apnsCa: String?

    @Option(parsing: .unconditional, help: ArgumentHelp(ServerConfiguration.help("apnsPoolSize", "HTTP/2 connections kept open to APNs, 1-64."), valueName: "n"))
    var apnsPoolSize: Int?

    @Option(parsing: .unconditional, help: ArgumentHelp(ServerConfiguration.help("apnsSimulatorPort", "Port of the embedded APNs simulator (0: any free port)."), valueName: "port"))
    var apnsSimulatorPort: Int?

    @Option(parsing: .unconditional, help: ArgumentHelp(ServerConfiguration.help("apnsSimulatorControlPort", "Port of the simulator's control API: push log, simulated devices."), valueName: "port"))
    var apnsSimulatorControlPort: Int?

    @Option(help: ArgumentHelp(ServerConfiguration.help("apnsSimulatorCertPath", "TLS certificate the embedded simulator serves."), valueName: "path"))
    var apnsSimulatorCert: String?

    @Option(help: ArgumentHelp(ServerConfiguration.help("apnsSimulatorKeyPath", "Private key of the simulator's certificate."), valueName: "path"))
    var apnsSimulatorKey: String?

    @Option(parsing: .unconditional, help: ArgumentHelp(ServerConfiguration.help("pushWakeSilenceSeconds", "A connected member silent this long (0.1-3600) is woken by push too, and shows as reconnecting in the roster."), valueName: "seconds"))
    var pushWakeSilenceSeconds: Double?

    var overrides: ConfigurationOverrides {
        var overrides = ConfigurationOverrides(
            dataDirectory: dataDir, host: host, port: port, adminHost: adminHost, adminPort: adminPort,
            adminKeyFile: adminKeyFile, certificateChainPath: cert, privateKeyPath: key, maxConnections: maxConnections,
            handshakesPerSecondPerAddress: handshakesPerSecondPerAddress,
            fullDuplexMaxTalkers: fullDuplexMaxTalkers, disconnectGraceSeconds: disconnectGraceSeconds, maxQueue: maxQueue,
            logLevel: logLevel, apns: apns, apnsKeyPath: apnsKey, apnsKeyID: apnsKeyId, apnsTeamID: apnsTeamId,
            apnsTopic: apnsTopic, apnsCAPath: apnsCa, apnsPoolSize: apnsPoolSize, apnsSimulatorPort: apnsSimulatorPort,
            apnsSimulatorControlPort: apnsSimulatorControlPort, apnsSimulatorCertPath: apnsSimulatorCert,
            apnsSimulatorKeyPath: apnsSimulatorKey, pushWakeSilenceSeconds: pushWakeSilenceSeconds)
        overrides.controlMessagesPerSecond = controlMessagesPerSecond
        overrides.maxConnectionsPerAddress = maxConnectionsPerAddress
        overrides.transmissionLogDays = transmissionLogDays
        overrides.auditDays = auditDays
        overrides.memberRetentionDays = memberRetentionDays
        overrides.tokenKeyPath = tokenKey
        overrides.previousTokenKeyPath = previousTokenKey
        return overrides
    }

    func run() async throws {
        let configuration: ServerConfiguration
        do {
            configuration = try ServerConfiguration.load(file: config, environment: ProcessInfo.processInfo.environment,
                                                         overrides: overrides)
        } catch {
            throw Self.configurationFailure(error)
        }
        let level = configuration.logLevel
        LoggingSystem.bootstrap { label in
            var handler = StreamLogHandler.standardError(label: label)
            handler.logLevel = level
            return BenignShutdownErrors(base: handler)
        }
        for (name, meant) in ServerConfiguration.unknownEnvironmentVariables(ProcessInfo.processInfo.environment) {
            Logger(label: "squelchd").warning("\(name) is not a squelchd setting and is ignored\(meant.map { " (did you mean \($0)?)" } ?? ""); 'squelchd serve --help' lists the settings")
        }
        let server: SquelchServer
        do { server = try SquelchServer(configuration: configuration) } catch {
            throw Self.configurationFailure(error)
        }
        do { try await server.run() } catch let error as ServerConfiguration.ConfigurationError {
            throw Self.configurationFailure(error)  // the admin key file, found only once the data directory exists
        } catch let error as TokenKeyError {
            throw Self.configurationFailure(error)
        } catch let error as ListenError {
            throw Self.configurationFailure(error)  // a port in use, an address this machine lacks
        } catch let error as DataDirectoryLock.InUse {
            throw Self.configurationFailure(error)
        } catch let error as DataDirectoryLock.Failure {
            throw Self.configurationFailure(error)
        } catch let error as StoreError {
            // A database that can't be opened (damaged, from a newer squelchd, unreadable): one line
            // and EX_IOERR, rather than ArgumentParser's "Error:" and 1.
            FileHandle.standardError.write(Data("squelchd: \(error)\n".utf8))
            throw ExitCode(74)
        }
    }

    /// One line, what went wrong and what to do, and EX_CONFIG.
    static func configurationFailure(_ error: any Error) -> ExitCode {
        FileHandle.standardError.write(Data("squelchd: \(error)\n".utf8))
        return ExitCode(78)  // EX_CONFIG
    }
}

/// Hummingbird logs, at error level and from tasks of its own, two things that only mean its server
/// was stopped while starting or already closed: when squelchd gives up at start (a port in use) or
/// stops at once (a second signal). They would come after, and bury, the one line that says what
/// went wrong; they are logged at debug instead.
struct BenignShutdownErrors: LogHandler {
    var base: StreamLogHandler

    static func isBenign(_ event: LogEvent) -> Bool {
        guard event.level == .error, event.source == "HummingbirdCore" else { return false }
        let text = event.message.description
        return text == "Server shutdown error: Already closed" || text.hasPrefix("Waiting on child channel: CancellationError")
    }

    func log(event: LogEvent) {
        guard Self.isBenign(event) else { return base.log(event: event) }
        guard base.logLevel <= .debug else { return }
        var quiet = event
        quiet.level = .debug
        base.log(event: quiet)
    }

    var metadataProvider: Logger.MetadataProvider? {
        get { base.metadataProvider }
        set { base.metadataProvider = newValue }
    }
    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { base[metadataKey: key] }
        set { base[metadataKey: key] = newValue }
    }
    var metadata: Logger.Metadata {
        get { base.metadata }
        set { base.metadata = newValue }
    }
    var logLevel: Logger.Level {
        get { base.logLevel }
        set { base.logLevel = newValue }
    }
}
