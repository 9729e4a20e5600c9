import APNsSimulatorEmbedding
import ArgumentParser
import Foundation
import Logging
import ParticipantTokens
import ChannelStore
import PTTServer

/// `squelchd serve`. Every setting can also come from the environment or a JSON config file;
/// `ServerConfiguration.load` merges them (flags > environment > file > defaults). The settings'
/// flags and their help come from `ServerConfiguration.settings`, where each is declared once, so
/// they are read here from the arguments ArgumentParser leaves over.
struct Serve: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Run the server until SIGTERM, SIGINT or SIGHUP (not under nohup).",
        discussion: """
            Settings come from, in rising precedence: defaults, a JSON config file (--config or \
            \(ServerConfiguration.configFileEnvironment); its keys are the names in quotes below), \
            SQUELCH_* environment variables, then these flags. The admin API key is set with \
            SQUELCH_ADMIN_KEY, "adminKey" in the config file or --admin-key-file; without one, a key is \
            generated into <data-dir>/admin-key (mode 0600) and reused. A bad setting, or a data directory \
            another squelchd serves, exits with status 78; a flag whose value doesn't parse ('--port abc'), \
            with 64, as any command-line mistake; a database that can't be opened, with 74.

            SETTINGS:
            \(settingsHelp)
            """)

    /// Every setting as ArgumentParser lists options: the flag and its value, then its help,
    /// wrapped here to fit 80 columns (ArgumentParser would rewrap it without the indent).
    static var settingsHelp: String {
        ServerConfiguration.settings.map { setting in
            let flag = setting.flag.map { "\($0) <\(setting.valueName)>" } ?? "\(setting.environment) (no flag)"
            return (["  " + flag] + wrapped(setting.helpText, width: 72).map { "      " + $0 }).joined(separator: "\n")
        }.joined(separator: "\n")
    }

    /// `text` in lines of at most `width` characters, broken at spaces.
    static func wrapped(_ text: String, width: Int) -> [String] {
        var lines: [String] = [], line = ""
        for word in text.split(separator: " ") {
            if !line.isEmpty, line.count + 1 + word.count > width {
                lines.append(line)
                line = ""
            }
            line += (line.isEmpty ? "" : " ") + word
        }
        if !line.isEmpty { lines.append(line) }
        return lines
    }

    @Option(help: ArgumentHelp("JSON config file (env: \(ServerConfiguration.configFileEnvironment); default: none).", valueName: "path"))
    var config: String?

    @Argument(parsing: .allUnrecognized, help: ArgumentHelp("Settings, each as --flag value (listed under SETTINGS).", valueName: "setting"))
    var settings: [String] = []

    /// The settings' flags as a layer; one that doesn't parse is a command-line mistake (exit 64).
    var overrides: ConfigurationOverrides {
        get throws {
            do { return try ServerConfiguration.flagOverrides(settings) } catch { throw ValidationError(error.description) }
        }
    }

    func validate() throws { _ = try overrides }

    func run() async throws {
        let overrides = try self.overrides
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
        var server: SquelchServer
        do { server = try SquelchServer(configuration: configuration) } catch {
            throw Self.configurationFailure(error)
        }
        server.embeddedPush = EmbeddedAPNsSimulator.factory
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
