import ChannelProtocol
import Foundation
import SquelchInfo
import KeyFiles
import Logging
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Everything `squelchd serve` needs to start. Defaults are safe: everything binds to 127.0.0.1.
///
/// Each setting can come from four places; a later one wins: the defaults below, a JSON config file
/// (`--config`, or `SQUELCH_CONFIG`; keys are the property names), the environment (`SQUELCH_…`), and
/// command-line flags. `ServerConfiguration.settings` lists every setting with its key, variable, flag and
/// default; `load(file:environment:overrides:)` does the merge. Relative paths are relative to the
/// working directory, wherever they come from.
public struct ServerConfiguration: Sendable, Equatable {
    /// Where the database and generated keys live. Created (mode 0700) if missing.
    public var dataDirectory: String = "data"
    /// UDP address the push-to-talk transport binds.
    public var host: String = "127.0.0.1"
    /// UDP port of the transport; 0 picks a free port (tests).
    public var port: Int = 7700
    /// Admin HTTP API address. Keep it on loopback unless it sits behind an authenticating proxy.
    public var adminHost: String = "127.0.0.1"
    /// Admin HTTP API port; 0 picks a free port (tests).
    public var adminPort: Int = 7780
    /// The admin API's bearer key. When neither this nor `adminKeyFile` is set, `resolveAdminKey()`
    /// generates one into `<dataDirectory>/admin-key` (mode 0600) and reuses it afterwards.
    public var adminKey: String?
    /// A file holding the admin key (its whitespace trimmed), for keys kept out of the environment.
    public var adminKeyFile: String?
    /// The participant-token signing key (P-256, PEM). Nil: `<dataDirectory>/token-key.pem`, made on
    /// first run. Set, it must exist: a configured key that is missing is a mistake to report, not a
    /// reason to sign with a new key that no token issued so far matches.
    public var tokenKeyPath: String?
    /// The token key used before the current one (P-256, PEM), during a key rotation: tokens it signed
    /// are still accepted until they expire (at most 30 days), while new ones are signed with the
    /// current key. Nil: only the current key.
    public var previousTokenKeyPath: String?
    /// PEM chain the transport presents (leaf first).
    public var certificateChainPath: String = "certs/server-chain.pem"
    /// PEM private key of the leaf certificate.
    public var privateKeyPath: String = "certs/server.key"
    /// Live connections beyond this are refused (server busy).
    public var maxConnections: Int = 10_000
    /// New handshakes accepted per second from one IP address (IPv6: one /64). Raise it when many members share an
    /// address (a dispatch centre behind one NAT, a load test).
    public var handshakesPerSecondPerAddress: Int = 20
    /// Connections open at once from one IP address (IPv6: one /64); more are refused. Raise it for a
    /// site with more members than this behind one NAT address.
    public var maxConnectionsPerAddress: Int = 1_000
    /// Simultaneous talkers in a full-duplex channel.
    public var fullDuplexMaxTalkers: Int = 4
    /// How long a dropped member keeps its place (and the floor) before it counts as gone.
    public var disconnectGraceSeconds: Double = 2
    /// Floor requests a channel queues while the floor is taken.
    public var maxQueue: Int = 16
    /// Control messages one connection may send per second (and twice as many in a burst); more are
    /// dropped. Raise it only for load tests that request the floor in a tight loop.
    public var controlMessagesPerSecond: Int = 20
    /// Days the transmission log keeps each burst; older records are deleted every hour. 0 keeps them
    /// for good (then the log grows with every burst: about 100 bytes each).
    public var transmissionLogDays: Int = 365
    /// Days the audit trail keeps each administrator's change (`GET /v1/audit`, `squelchd audit`);
    /// older records are deleted every hour. 0 keeps them for good.
    public var auditDays: Int = 365
    /// Days a member may stay away before it is forgotten (leaves the roster and the wake list; its
    /// device is told to leave the channel; a token it still holds lets it join again). 0, the
    /// default, keeps members until an administrator removes them.
    public var memberRetentionDays: Int = 0
    public var logLevel: Logger.Level = .info
    /// Where wake pushes go: `simulator` (a local APNs simulator started inside squelchd, the default),
    /// `apple` (api.push.apple.com, or the sandbox for sandbox tokens), `off`, or an `https://host:port`
    /// URL of another APNs-compatible server.
    public var apns: String = "simulator"
    /// The APNs provider key (.p8) pushes are signed with.
    public var apnsKeyPath: String = "certs/AuthKey_DEVKEY0001.p8"
    /// The key's 10-character Key ID.
    public var apnsKeyID: String = "DEVKEY0001"
    /// The 10-character Team ID the key belongs to.
    public var apnsTeamID: String = "DEVTEAM001"
    /// `<bundle id>.voip-ptt` of the app the pushes wake.
    public var apnsTopic: String = "org.squelch.walkie.voip-ptt"
    /// CA that signs the simulator's (or a custom server's) certificate; unused with `apple`.
    public var apnsCAPath: String = "certs/ca.pem"
    /// HTTP/2 connections kept open to APNs (per environment with `apple`).
    public var apnsPoolSize: Int = 2
    /// Ports of the embedded simulator: APNs (HTTP/2, TLS) and its control API (push log, devices).
    public var apnsSimulatorPort: Int = 2197
    public var apnsSimulatorControlPort: Int = 2198
    /// TLS certificate and key the embedded simulator serves.
    public var apnsSimulatorCertPath: String = "certs/apns-sim.pem"
    public var apnsSimulatorKeyPath: String = "certs/apns-sim.key"
    /// A connected member silent this long still gets a wake push, and shows as `reconnecting` in the
    /// roster until it is heard again. A foreground client PINGs every 5 s, and every 500 ms while a
    /// PING goes unanswered, so one quiet for two keepalives and then some is asleep or gone as far as
    /// audio goes: a dispatcher sees that within about 12 s, not the 35 s this was while clients PINGed
    /// every 15 s (before 2026-11-24; set 35 for such clients, or their members flap).
    public var pushWakeSilenceSeconds: Double = 12

    public static let portRange = 0...65_535
    public static let maxConnectionsRange = 1...1_000_000
    public static let handshakeRateRange = 1...1_000_000
    public static let fullDuplexMaxTalkersRange = 1...ChannelLimits.maxSimultaneousTalkers
    public static let disconnectGraceRange: ClosedRange<Double> = 0...60
    public static let maxQueueRange = 0...256
    public static let controlMessageRateRange = 1...1_000_000
    public static let transmissionLogDaysRange = 0...36_500
    public static let auditDaysRange = 0...36_500
    public static let memberRetentionDaysRange = 0...36_500
    public static let minimumAdminKeyLength = 16
    /// File name of the generated admin key inside the data directory.
    public static let adminKeyFileName = "admin-key"
    public static let tokenKeyFileName = "token-key.pem"

    /// Where the participant-token key is: `tokenKeyPath`, or its default in the data directory.
    public var resolvedTokenKeyPath: String {
        tokenKeyPath ?? URL(fileURLWithPath: dataDirectory).appendingPathComponent(Self.tokenKeyFileName).path
    }

    public init() {}

    public enum ConfigurationError: Error, CustomStringConvertible, Equatable {
        /// A value out of range or of the wrong kind; the message names the setting and how to set it.
        case invalidValue(String)
        case dataDirectory(path: String, reason: String)
        /// The config file is missing, unreadable or not a JSON object.
        case configFile(path: String, problem: String)
        case unknownSetting(key: String, file: String, valid: [String])
        case adminKey(path: String, reason: String)

        public var description: String {
            switch self {
            case .invalidValue(let message):
                return message
            case .dataDirectory(let path, let reason):
                return "data directory \(path): \(reason); pass a writable directory with --data-dir (or SQUELCH_DATA_DIR)"
            case .configFile(let path, let problem):
                return "config file \(path): \(problem)"
            case .unknownSetting(let key, let file, let valid):
                return "config file \(file): unknown setting \"\(key)\"; valid settings are \(valid.joined(separator: ", "))"
            case .adminKey(let path, let reason):
                return "admin key file \(path): \(reason)"
            }
        }
    }

    // MARK: - Settings table

    /// One setting: its key in the config file (the property name), its environment variable, its
    /// flag (nil when there is none: the admin key is kept off the command line, where `ps` shows it)
    /// and its default as help text shows it.
    public struct Setting {
        public let key: String
        public let environment: String
        public let flag: String?
        public let defaultDescription: String
        let kind: Kind

        enum Kind {
            case string(WritableKeyPath<ConfigurationOverrides, String?>)
            case int(WritableKeyPath<ConfigurationOverrides, Int?>)
            case double(WritableKeyPath<ConfigurationOverrides, Double?>)
        }

        /// "--port, SQUELCH_PORT or "port" in the config file": how to set it, for error messages.
        public var howToSet: String {
            (flag.map { "\($0), " } ?? "") + "\(environment) or \"\(key)\" in the config file"
        }
    }

    /// Environment variable naming the config file when `--config` is not given.
    public static let configFileEnvironment = "SQUELCH_CONFIG"

    /// The `SQUELCH_…` variables in `environment` that name no setting, each with the setting's
    /// variable it most likely meant (nil if none is close): a typo such as `SQUELCH_PROT` would
    /// otherwise be ignored without a word, and the server start on the default it was to replace.
    public static func unknownEnvironmentVariables(_ environment: [String: String]) -> [(name: String, meant: String?)] {
        var known: Set<String> = [configFileEnvironment]
        for setting in settings { known.insert(setting.environment) }
        let candidates = known.sorted()
        var unknown: [(name: String, meant: String?)] = []
        for name in environment.keys.sorted() where name.hasPrefix("SQUELCH_") && !known.contains(name) {
            var best: (name: String, distance: Int)?
            for candidate in candidates {
                // A word spelled out (`…_DATA_DIRECTORY` for `…_DATA_DIR`) counts as one typo.
                let distance = name.hasPrefix(candidate) || candidate.hasPrefix(name) ? 1 : SquelchInfo.editDistance(name, candidate)
                if distance < (best?.distance ?? Int.max) { best = (candidate, distance) }
            }
            unknown.append((name, best.flatMap { $0.distance <= 3 ? $0.name : nil }))
        }
        return unknown
    }

    /// Every setting, in help order.
    public static var settings: [Setting] {
        let defaults = ServerConfiguration()
        return [
            Setting(key: "dataDirectory", environment: "SQUELCH_DATA_DIR", flag: "--data-dir",
                    defaultDescription: defaults.dataDirectory, kind: .string(\.dataDirectory)),
            Setting(key: "host", environment: "SQUELCH_HOST", flag: "--host",
                    defaultDescription: defaults.host, kind: .string(\.host)),
            Setting(key: "port", environment: "SQUELCH_PORT", flag: "--port",
                    defaultDescription: "\(defaults.port)", kind: .int(\.port)),
            Setting(key: "adminHost", environment: "SQUELCH_ADMIN_HOST", flag: "--admin-host",
                    defaultDescription: defaults.adminHost, kind: .string(\.adminHost)),
            Setting(key: "adminPort", environment: "SQUELCH_ADMIN_PORT", flag: "--admin-port",
                    defaultDescription: "\(defaults.adminPort)", kind: .int(\.adminPort)),
            Setting(key: "adminKey", environment: "SQUELCH_ADMIN_KEY", flag: nil,
                    defaultDescription: "generated into <data-dir>/\(adminKeyFileName)", kind: .string(\.adminKey)),
            Setting(key: "adminKeyFile", environment: "SQUELCH_ADMIN_KEY_FILE", flag: "--admin-key-file",
                    defaultDescription: "none", kind: .string(\.adminKeyFile)),
            Setting(key: "tokenKeyPath", environment: "SQUELCH_TOKEN_KEY", flag: "--token-key",
                    defaultDescription: "<data-dir>/\(tokenKeyFileName), made on first run", kind: .string(\.tokenKeyPath)),
            Setting(key: "previousTokenKeyPath", environment: "SQUELCH_PREVIOUS_TOKEN_KEY", flag: "--previous-token-key",
                    defaultDescription: "none", kind: .string(\.previousTokenKeyPath)),
            Setting(key: "certificateChainPath", environment: "SQUELCH_CERT", flag: "--cert",
                    defaultDescription: defaults.certificateChainPath, kind: .string(\.certificateChainPath)),
            Setting(key: "privateKeyPath", environment: "SQUELCH_KEY", flag: "--key",
                    defaultDescription: defaults.privateKeyPath, kind: .string(\.privateKeyPath)),
            Setting(key: "maxConnections", environment: "SQUELCH_MAX_CONNECTIONS", flag: "--max-connections",
                    defaultDescription: "\(defaults.maxConnections)", kind: .int(\.maxConnections)),
            Setting(key: "handshakesPerSecondPerAddress", environment: "SQUELCH_HANDSHAKES_PER_SECOND_PER_ADDRESS",
                    flag: "--handshakes-per-second-per-address",
                    defaultDescription: "\(defaults.handshakesPerSecondPerAddress)", kind: .int(\.handshakesPerSecondPerAddress)),
            Setting(key: "maxConnectionsPerAddress", environment: "SQUELCH_MAX_CONNECTIONS_PER_ADDRESS",
                    flag: "--max-connections-per-address",
                    defaultDescription: "\(defaults.maxConnectionsPerAddress)", kind: .int(\.maxConnectionsPerAddress)),
            Setting(key: "fullDuplexMaxTalkers", environment: "SQUELCH_FULL_DUPLEX_MAX_TALKERS", flag: "--full-duplex-max-talkers",
                    defaultDescription: "\(defaults.fullDuplexMaxTalkers)", kind: .int(\.fullDuplexMaxTalkers)),
            Setting(key: "disconnectGraceSeconds", environment: "SQUELCH_DISCONNECT_GRACE_SECONDS", flag: "--disconnect-grace-seconds",
                    defaultDescription: "\(SquelchInfo.plainNumber(defaults.disconnectGraceSeconds))", kind: .double(\.disconnectGraceSeconds)),
            Setting(key: "maxQueue", environment: "SQUELCH_MAX_QUEUE", flag: "--max-queue",
                    defaultDescription: "\(defaults.maxQueue)", kind: .int(\.maxQueue)),
            Setting(key: "controlMessagesPerSecond", environment: "SQUELCH_CONTROL_MESSAGES_PER_SECOND", flag: "--control-messages-per-second",
                    defaultDescription: "\(defaults.controlMessagesPerSecond)", kind: .int(\.controlMessagesPerSecond)),
            Setting(key: "transmissionLogDays", environment: "SQUELCH_TRANSMISSION_LOG_DAYS", flag: "--transmission-log-days",
                    defaultDescription: "\(defaults.transmissionLogDays)", kind: .int(\.transmissionLogDays)),
            Setting(key: "auditDays", environment: "SQUELCH_AUDIT_DAYS", flag: "--audit-days",
                    defaultDescription: "\(defaults.auditDays)", kind: .int(\.auditDays)),
            Setting(key: "memberRetentionDays", environment: "SQUELCH_MEMBER_RETENTION_DAYS", flag: "--member-retention-days",
                    defaultDescription: "\(defaults.memberRetentionDays)", kind: .int(\.memberRetentionDays)),
            Setting(key: "logLevel", environment: "SQUELCH_LOG_LEVEL", flag: "--log-level",
                    defaultDescription: defaults.logLevel.rawValue, kind: .string(\.logLevel)),
            Setting(key: "apns", environment: "SQUELCH_APNS", flag: "--apns",
                    defaultDescription: defaults.apns, kind: .string(\.apns)),
            Setting(key: "apnsKeyPath", environment: "SQUELCH_APNS_KEY", flag: "--apns-key",
                    defaultDescription: defaults.apnsKeyPath, kind: .string(\.apnsKeyPath)),
            Setting(key: "apnsKeyID", environment: "SQUELCH_APNS_KEY_ID", flag: "--apns-key-id",
                    defaultDescription: defaults.apnsKeyID, kind: .string(\.apnsKeyID)),
            Setting(key: "apnsTeamID", environment: "SQUELCH_APNS_TEAM_ID", flag: "--apns-team-id",
                    defaultDescription: defaults.apnsTeamID, kind: .string(\.apnsTeamID)),
            Setting(key: "apnsTopic", environment: "SQUELCH_APNS_TOPIC", flag: "--apns-topic",
                    defaultDescription: defaults.apnsTopic, kind: .string(\.apnsTopic)),
            Setting(key: "apnsCAPath", environment: "SQUELCH_APNS_CA", flag: "--apns-ca",
                    defaultDescription: defaults.apnsCAPath, kind: .string(\.apnsCAPath)),
            Setting(key: "apnsPoolSize", environment: "SQUELCH_APNS_POOL_SIZE", flag: "--apns-pool-size",
                    defaultDescription: "\(defaults.apnsPoolSize)", kind: .int(\.apnsPoolSize)),
            Setting(key: "apnsSimulatorPort", environment: "SQUELCH_APNS_SIMULATOR_PORT", flag: "--apns-simulator-port",
                    defaultDescription: "\(defaults.apnsSimulatorPort)", kind: .int(\.apnsSimulatorPort)),
            Setting(key: "apnsSimulatorControlPort", environment: "SQUELCH_APNS_SIMULATOR_CONTROL_PORT",
                    flag: "--apns-simulator-control-port",
                    defaultDescription: "\(defaults.apnsSimulatorControlPort)", kind: .int(\.apnsSimulatorControlPort)),
            Setting(key: "apnsSimulatorCertPath", environment: "SQUELCH_APNS_SIMULATOR_CERT", flag: "--apns-simulator-cert",
                    defaultDescription: defaults.apnsSimulatorCertPath, kind: .string(\.apnsSimulatorCertPath)),
            Setting(key: "apnsSimulatorKeyPath", environment: "SQUELCH_APNS_SIMULATOR_KEY", flag: "--apns-simulator-key",
                    defaultDescription: defaults.apnsSimulatorKeyPath, kind: .string(\.apnsSimulatorKeyPath)),
            Setting(key: "pushWakeSilenceSeconds", environment: "SQUELCH_PUSH_WAKE_SILENCE_SECONDS", flag: "--push-wake-silence-seconds",
                    defaultDescription: "\(SquelchInfo.plainNumber(defaults.pushWakeSilenceSeconds))", kind: .double(\.pushWakeSilenceSeconds)),
        ]
    }

    static func setting(_ key: String) -> Setting {
        guard let setting = settings.first(where: { $0.key == key }) else { preconditionFailure("no setting \(key)") }
        return setting
    }

    /// Help text for a flag: the abstract, then where else it can be set and its default.
    public static func help(_ key: String, _ abstract: String) -> String {
        let setting = setting(key)
        return "\(abstract) (env: \(setting.environment); config file: \"\(setting.key)\"; default: \(setting.defaultDescription))"
    }

    // MARK: - Loading

    /// The configuration from, in rising precedence, the defaults, the JSON config file at `file` (or
    /// at `$SQUELCH_CONFIG` when `file` is nil), `environment`'s `SQUELCH_…` variables and `overrides`
    /// (the command-line flags). Empty variables count as unset. The result is validated.
    public static func load(file: String?, environment: [String: String],
                            overrides: ConfigurationOverrides = ConfigurationOverrides()) throws(ConfigurationError) -> ServerConfiguration {
        var configuration = ServerConfiguration()
        if let path = file ?? environment[configFileEnvironment].flatMap({ $0.isEmpty ? nil : $0 }) {
            try configuration.apply(try fileOverrides(path: path))
        }
        try configuration.apply(try environmentOverrides(environment, except: overrides))
        try configuration.apply(overrides)
        try configuration.validate()
        return configuration
    }

    /// Lays `layer`'s values over these. Within one layer, setting both the admin key and its file
    /// is an error; across layers the later one replaces the other.
    mutating func apply(_ layer: ConfigurationOverrides) throws(ConfigurationError) {
        if let value = layer.dataDirectory { dataDirectory = value }
        // "[::1]", as a URL writes an IPv6 address, is the address ::1.
        if let value = layer.host { host = Self.unbracketed(value) }
        if let value = layer.port { port = value }
        if let value = layer.adminHost { adminHost = Self.unbracketed(value) }
        if let value = layer.adminPort { adminPort = value }
        if layer.adminKey != nil, layer.adminKeyFile != nil {
            throw .invalidValue("both adminKey and adminKeyFile are set; set one of them")
        }
        if let value = layer.adminKey { adminKey = value; adminKeyFile = nil }
        if let value = layer.adminKeyFile { adminKeyFile = value; adminKey = nil }
        if let value = layer.tokenKeyPath { tokenKeyPath = value }
        if let value = layer.previousTokenKeyPath { previousTokenKeyPath = value }
        if let value = layer.certificateChainPath { certificateChainPath = value }
        if let value = layer.privateKeyPath { privateKeyPath = value }
        if let value = layer.maxConnections { maxConnections = value }
        if let value = layer.handshakesPerSecondPerAddress { handshakesPerSecondPerAddress = value }
        if let value = layer.maxConnectionsPerAddress { maxConnectionsPerAddress = value }
        if let value = layer.fullDuplexMaxTalkers { fullDuplexMaxTalkers = value }
        if let value = layer.disconnectGraceSeconds { disconnectGraceSeconds = value }
        if let value = layer.maxQueue { maxQueue = value }
        if let value = layer.controlMessagesPerSecond { controlMessagesPerSecond = value }
        if let value = layer.transmissionLogDays { transmissionLogDays = value }
        if let value = layer.auditDays { auditDays = value }
        if let value = layer.memberRetentionDays { memberRetentionDays = value }
        if let value = layer.apns { apns = value }
        if let value = layer.apnsKeyPath { apnsKeyPath = value }
        if let value = layer.apnsKeyID { apnsKeyID = value }
        if let value = layer.apnsTeamID { apnsTeamID = value }
        if let value = layer.apnsTopic { apnsTopic = value }
        if let value = layer.apnsCAPath { apnsCAPath = value }
        if let value = layer.apnsPoolSize { apnsPoolSize = value }
        if let value = layer.apnsSimulatorPort { apnsSimulatorPort = value }
        if let value = layer.apnsSimulatorControlPort { apnsSimulatorControlPort = value }
        if let value = layer.apnsSimulatorCertPath { apnsSimulatorCertPath = value }
        if let value = layer.apnsSimulatorKeyPath { apnsSimulatorKeyPath = value }
        if let value = layer.pushWakeSilenceSeconds { pushWakeSilenceSeconds = value }
        if let value = layer.logLevel {
            guard let level = Logger.Level(rawValue: value.lowercased()) else {
                let levels = Logger.Level.allCases.map(\.rawValue).joined(separator: ", ")
                throw .invalidValue("log level '\(value)' is not one of \(levels); set it with \(Self.setting("logLevel").howToSet)")
            }
            logLevel = level
        }
    }

    /// A JSON value as the config file holds it.
    enum JSONValue: Decodable {
        case null, number(Double), bool(Bool), string(String), other

        init(from decoder: any Decoder) throws {
            let container = try decoder.singleValueContainer()
            if container.decodeNil() { self = .null }
            else if let number = try? container.decode(Double.self) { self = .number(number) }
            else if let bool = try? container.decode(Bool.self) { self = .bool(bool) }
            else if let string = try? container.decode(String.self) { self = .string(string) }
            else { self = .other }
        }

        var kindDescription: String {
            switch self {
            case .null: return "null"
            case .number(let number): return SquelchInfo.plainNumber(number)
            case .bool(let bool): return "\(bool)"
            case .string(let string): return "\"\(string)\""
            case .other: return "an array or object"
            }
        }
    }

    /// The keys of the file's outer object that appear more than once, in order. Foundation's
    /// decoder keeps the first of a repeated key without a word, and no reader here reports them;
    /// the file has been decoded already (valid JSON), so this only walks its tokens: strings (with
    /// their escapes) and nesting, a key being a string at depth 1 followed by a colon.
    static func duplicateTopLevelKeys(in data: Data) -> [String] {
        let bytes = [UInt8](data)
        var seen: Set<String> = [], repeated: [String] = []
        var depth = 0, index = 0
        while index < bytes.count {
            switch bytes[index] {
            case UInt8(ascii: "{"), UInt8(ascii: "["): depth += 1
            case UInt8(ascii: "}"), UInt8(ascii: "]"): depth -= 1
            case UInt8(ascii: "\""):
                let start = index
                index += 1
                while index < bytes.count, bytes[index] != UInt8(ascii: "\"") {
                    index += bytes[index] == UInt8(ascii: "\\") ? 2 : 1
                }
                guard depth == 1, index < bytes.count else { break }
                var next = index + 1
                while next < bytes.count, [UInt8(ascii: " "), UInt8(ascii: "\t"), UInt8(ascii: "\n"), UInt8(ascii: "\r")].contains(bytes[next]) {
                    next += 1
                }
                guard next < bytes.count, bytes[next] == UInt8(ascii: ":"),
                      let key = try? JSONDecoder().decode(String.self, from: Data(bytes[start...index])) else { break }
                if !seen.insert(key).inserted, !repeated.contains(key) { repeated.append(key) }
            default: break
            }
            index += 1
        }
        return repeated
    }

    static func fileOverrides(path: String) throws(ConfigurationError) -> ConfigurationOverrides {
        let data: Data
        var isDirectory: ObjCBool = false
        let exists = FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory)
        guard exists, !isDirectory.boolValue, let read = FileManager.default.contents(atPath: path) else {
            let reason = !exists ? "no such file" : isDirectory.boolValue ? "it is a directory, not a JSON file" : "cannot read it (check its permissions)"
            throw .configFile(path: path, problem: "\(reason); check the path given with --config or \(configFileEnvironment)")
        }
        data = read
        let object: [String: JSONValue]
        do { object = try JSONDecoder().decode([String: JSONValue].self, from: data) } catch {
            let why: String
            if case DecodingError.dataCorrupted(let context) = error, let underlying = context.underlyingError {
                why = "it is not valid JSON (\(underlying.localizedDescription))"
            } else if case DecodingError.typeMismatch = error {
                why = "it must hold one JSON object"
            } else {
                why = "it is not valid JSON"
            }
            throw .configFile(path: path, problem: "\(why); write one JSON object such as {\"port\": 7700, \"logLevel\": \"info\"}")
        }
        if let repeated = duplicateTopLevelKeys(in: data).first {
            throw .configFile(path: path, problem: "\"\(repeated)\" is set more than once; keep one (this reader takes the first, most JSON tools the last, so an override added at the end would be ignored)")
        }
        let settings = self.settings
        var layer = ConfigurationOverrides()
        for (key, value) in object.sorted(by: { $0.key < $1.key }) {
            guard let setting = settings.first(where: { $0.key == key }) else {
                throw .unknownSetting(key: key, file: path, valid: settings.map(\.key))
            }
            func wrongType(_ expected: String) -> ConfigurationError {
                .configFile(path: path, problem: "\"\(key)\" must be \(expected), not \(value.kindDescription); for example \"\(key)\": \(example(setting))")
            }
            if case .null = value { continue }  // null: keep the default
            switch setting.kind {
            case .string(let path):
                guard case .string(let string) = value else { throw wrongType("a string") }
                layer[keyPath: path] = string
            case .int(let path):
                guard case .number(let number) = value, number.rounded() == number, abs(number) < 1e15 else {
                    throw wrongType("a whole number")
                }
                layer[keyPath: path] = Int(number)
            case .double(let path):
                guard case .number(let number) = value else { throw wrongType("a number") }
                layer[keyPath: path] = number
            }
        }
        return layer
    }

    static func example(_ setting: Setting) -> String {
        switch setting.kind {
        case .string: return "\"\(setting.key == "adminKey" ? "<key>" : setting.defaultDescription)\""
        case .int, .double: return setting.defaultDescription
        }
    }

    /// The environment's layer. A setting a flag sets (`flags`) is not read from it: the flag wins
    /// anyway, and a bad value it replaces must not stop the start ("--port 7700" with a stale
    /// SQUELCH_PORT=abc exited 78).
    static func environmentOverrides(_ environment: [String: String],
                                     except flags: ConfigurationOverrides = ConfigurationOverrides()) throws(ConfigurationError) -> ConfigurationOverrides {
        var layer = ConfigurationOverrides()
        for setting in settings {
            guard let raw = environment[setting.environment], !raw.isEmpty else { continue }
            let text = raw.trimmingCharacters(in: .whitespaces)
            switch setting.kind {
            case .string(let path):
                guard flags[keyPath: path] == nil else { continue }
                layer[keyPath: path] = setting.key == "adminKey" ? raw : text
            case .int(let path):
                guard flags[keyPath: path] == nil else { continue }
                guard let value = Int(text) else {
                    throw .invalidValue("\(setting.environment)='\(raw)' is not a whole number; set it to one such as \(setting.defaultDescription), or unset it")
                }
                layer[keyPath: path] = value
            case .double(let path):
                guard flags[keyPath: path] == nil else { continue }
                guard let value = Double(text), value.isFinite else {
                    throw .invalidValue("\(setting.environment)='\(raw)' is not a number; set it to one such as \(setting.defaultDescription), or unset it")
                }
                layer[keyPath: path] = value
            }
        }
        return layer
    }

    // MARK: - Checks

    /// `host` without the brackets a URL puts around an IPv6 address ("[::1]" is ::1).
    static func unbracketed(_ host: String) -> String {
        host.hasPrefix("[") && host.hasSuffix("]") ? String(host.dropFirst().dropLast()) : host
    }

    /// `host` as it goes in a URL or before ":port": an IPv6 address in brackets.
    public static func urlHost(_ host: String) -> String { host.contains(":") ? "[\(host)]" : host }

    /// Whether `host` (as given to `--admin-host` or `--host`) reaches this machine only: a loopback
    /// address or `localhost`. A name that resolves elsewhere, or a wildcard, does not.
    public static func isLoopback(_ host: String) -> Bool {
        let bare = unbracketed(host)
        if bare.lowercased() == "localhost" { return true }
        var v4 = in_addr()
        if inet_pton(AF_INET, bare, &v4) == 1 { return UInt32(bigEndian: v4.s_addr) >> 24 == 127 }
        var v6 = in6_addr()
        guard inet_pton(AF_INET6, bare, &v6) == 1 else { return false }
        return withUnsafeBytes(of: &v6) { Array($0) } == Array(repeating: 0, count: 15) + [1]
    }

    /// Checks every value; the error names the setting, what is wrong and how to set it.
    public func validate() throws(ConfigurationError) {
        func check(_ ok: Bool, _ key: String, _ problem: String) throws(ConfigurationError) {
            guard !ok else { return }
            throw .invalidValue("\(problem); set it with \(Self.setting(key).howToSet)")
        }
        try check(!dataDirectory.isEmpty, "dataDirectory", "the data directory is empty")
        try check(!host.isEmpty, "host", "the UDP host is empty; use an address such as 127.0.0.1 or 0.0.0.0")
        try check(Self.portRange.contains(port), "port", "UDP port \(port) is out of range; use 1-65535, or 0 for any free port")
        try check(!adminHost.isEmpty, "adminHost", "the admin host is empty; use an address such as 127.0.0.1")
        try check(Self.portRange.contains(adminPort), "adminPort", "admin port \(adminPort) is out of range; use 1-65535, or 0 for any free port")
        if let adminKey {
            try check(adminKey.count >= Self.minimumAdminKeyLength, "adminKey",
                      "the admin key is \(adminKey.count) characters; use at least \(Self.minimumAdminKeyLength), or leave it unset to have one generated")
            try check(adminKey.unicodeScalars.allSatisfy { $0.value > 0x20 && $0.value < 0x7F }, "adminKey",
                      "the admin key must be printable ASCII without spaces (it travels in an HTTP header)")
        }
        if let adminKeyFile { try check(!adminKeyFile.isEmpty, "adminKeyFile", "the admin key file path is empty") }
        if let tokenKeyPath { try check(!tokenKeyPath.isEmpty, "tokenKeyPath", "the token key path is empty; leave it unset to use <data-dir>/\(Self.tokenKeyFileName)") }
        if let previousTokenKeyPath {
            try check(!previousTokenKeyPath.isEmpty, "previousTokenKeyPath", "the previous token key path is empty; leave it unset when no rotation is under way")
            try check(previousTokenKeyPath != resolvedTokenKeyPath, "previousTokenKeyPath",
                      "the previous token key is the current one (\(previousTokenKeyPath)); point it at the key used before the rotation")
        }
        try check(!certificateChainPath.isEmpty, "certificateChainPath", "the certificate chain path is empty")
        try check(!privateKeyPath.isEmpty, "privateKeyPath", "the private key path is empty")
        try check(Self.handshakeRateRange.contains(handshakesPerSecondPerAddress), "handshakesPerSecondPerAddress",
                  "handshakes per second per address \(handshakesPerSecondPerAddress) is out of range; use \(Self.handshakeRateRange.lowerBound)-\(Self.handshakeRateRange.upperBound)")
        try check(Self.maxConnectionsRange.contains(maxConnectionsPerAddress), "maxConnectionsPerAddress",
                  "maximum connections per address \(maxConnectionsPerAddress) is out of range; use \(Self.maxConnectionsRange.lowerBound)-\(Self.maxConnectionsRange.upperBound)")
        try check(Self.maxConnectionsRange.contains(maxConnections), "maxConnections",
                  "maximum connections \(maxConnections) is out of range; use \(Self.maxConnectionsRange.lowerBound)-\(Self.maxConnectionsRange.upperBound)")
        try check(Self.fullDuplexMaxTalkersRange.contains(fullDuplexMaxTalkers), "fullDuplexMaxTalkers",
                  "full-duplex talkers \(fullDuplexMaxTalkers) is out of range; use \(Self.fullDuplexMaxTalkersRange.lowerBound)-\(Self.fullDuplexMaxTalkersRange.upperBound)")
        try check(disconnectGraceSeconds.isFinite && Self.disconnectGraceRange.contains(disconnectGraceSeconds), "disconnectGraceSeconds",
                  "disconnect grace \(SquelchInfo.plainNumber(disconnectGraceSeconds)) s is out of range; use 0-\(SquelchInfo.plainNumber(Self.disconnectGraceRange.upperBound)) seconds")
        try check(Self.maxQueueRange.contains(maxQueue), "maxQueue",
                  "floor queue length \(maxQueue) is out of range; use \(Self.maxQueueRange.lowerBound)-\(Self.maxQueueRange.upperBound)")
        try check(Self.controlMessageRateRange.contains(controlMessagesPerSecond), "controlMessagesPerSecond",
                  "control message rate \(controlMessagesPerSecond) is out of range; use \(Self.controlMessageRateRange.lowerBound)-\(Self.controlMessageRateRange.upperBound) per second")
        try check(Self.transmissionLogDaysRange.contains(transmissionLogDays), "transmissionLogDays",
                  "transmission log retention \(transmissionLogDays) days is out of range; use 1-\(Self.transmissionLogDaysRange.upperBound) days, or 0 to keep the log for good")
        try check(Self.auditDaysRange.contains(auditDays), "auditDays",
                  "audit trail retention \(auditDays) days is out of range; use 1-\(Self.auditDaysRange.upperBound) days, or 0 to keep the trail for good")
        try check(Self.memberRetentionDaysRange.contains(memberRetentionDays), "memberRetentionDays",
                  "member retention \(memberRetentionDays) days is out of range; use 1-\(Self.memberRetentionDaysRange.upperBound) days, or 0 to keep members until removed")
        try validateAPNs()
    }

    /// Where pushes go, as `apns` names it.
    public enum PushTarget: Sendable, Equatable {
        case off, simulator, apple
        case custom(host: String, port: Int)
    }

    /// `apns` parsed; `validate()` has already refused anything else.
    public var pushTarget: PushTarget {
        switch apns.lowercased() {
        case "off": return .off
        case "simulator": return .simulator
        case "apple": return .apple
        default:
            let url = URL(string: apns)
            return .custom(host: url?.host ?? "", port: url?.port ?? 443)
        }
    }

    func validateAPNs() throws(ConfigurationError) {
        func check(_ ok: Bool, _ key: String, _ problem: String) throws(ConfigurationError) {
            guard !ok else { return }
            throw .invalidValue("\(problem); set it with \(Self.setting(key).howToSet)")
        }
        if !["off", "simulator", "apple"].contains(apns.lowercased()) {
            let url = URL(string: apns)
            let path = url?.path ?? ""
            try check(url?.scheme == "https" && !(url?.host ?? "").isEmpty && (path.isEmpty || path == "/"), "apns",
                      "apns '\(apns)' is not simulator, apple, off or an https://host[:port] URL")
            // Foundation takes any number for the port: 99999 would connect to 34463 (it wraps).
            if let port = url?.port {
                try check((1...65_535).contains(port), "apns", "apns '\(apns)' has port \(port); the port must be 1-65535")
            }
        }
        try check(pushWakeSilenceSeconds.isFinite && pushWakeSilenceSeconds >= 0.1 && pushWakeSilenceSeconds <= 3600, "pushWakeSilenceSeconds",
                  "push wake silence \(SquelchInfo.plainNumber(pushWakeSilenceSeconds)) s is out of range; use 0.1-3600 seconds")
        guard pushTarget != .off else { return }
        try check(apnsKeyID.count == 10, "apnsKeyID", "the APNs key ID '\(apnsKeyID)' must be the 10-character Key ID from the Apple Developer account")
        try check(apnsTeamID.count == 10, "apnsTeamID", "the APNs team ID '\(apnsTeamID)' must be the 10-character Team ID")
        try check(apnsTopic.hasSuffix(".voip-ptt") && apnsTopic.count > 9, "apnsTopic",
                  "the APNs topic '\(apnsTopic)' must be '<bundle id>.voip-ptt' for pushtotalk pushes")
        try check((1...64).contains(apnsPoolSize), "apnsPoolSize", "APNs pool size \(apnsPoolSize) is out of range; use 1-64")
        if pushTarget == .apple {
            // The development defaults only work against the simulator: Apple would refuse every push
            // (InvalidProviderToken), logged once, while /healthz says ok and nobody is woken.
            let defaults = ServerConfiguration()
            try check(apnsKeyID != defaults.apnsKeyID, "apnsKeyID",
                      "apns is apple but the key ID is the development one (\(defaults.apnsKeyID)); set the Key ID of your APNs key from the Apple Developer account")
            try check(apnsTeamID != defaults.apnsTeamID, "apnsTeamID",
                      "apns is apple but the team ID is the development one (\(defaults.apnsTeamID)); set your 10-character Team ID")
            try check(URL(fileURLWithPath: apnsKeyPath).lastPathComponent != URL(fileURLWithPath: defaults.apnsKeyPath).lastPathComponent, "apnsKeyPath",
                      "apns is apple but the key is the development one (\(defaults.apnsKeyPath)); point it at the .p8 key Apple issued")
            try check(apnsTopic != defaults.apnsTopic, "apnsTopic",
                      "apns is apple but the topic is the example app's (\(defaults.apnsTopic)); set '<your app's bundle id>.voip-ptt'")
        }
        try check(Self.portRange.contains(apnsSimulatorPort), "apnsSimulatorPort", "simulator port \(apnsSimulatorPort) is out of range; use 1-65535, or 0")
        try check(Self.portRange.contains(apnsSimulatorControlPort), "apnsSimulatorControlPort",
                  "simulator control port \(apnsSimulatorControlPort) is out of range; use 1-65535, or 0")
        // All three are TCP ports of this one process: a clash would otherwise be reported as a port
        // in use by "another squelchd?". The simulator listens on 127.0.0.1, so the admin API takes
        // the same port only there, on a wildcard, or on localhost.
        if pushTarget == .simulator {
            try check(apnsSimulatorPort == 0 || apnsSimulatorPort != apnsSimulatorControlPort, "apnsSimulatorControlPort",
                      "the APNs simulator's port and its control port are both \(apnsSimulatorPort); give them different ports")
            let adminSharesLoopback = ["0.0.0.0", "::", "localhost"].contains(adminHost.lowercased()) || adminHost.hasPrefix("127.")
            for (key, port, name) in [("apnsSimulatorPort", apnsSimulatorPort, "the APNs simulator's port"),
                                      ("apnsSimulatorControlPort", apnsSimulatorControlPort, "the APNs simulator's control port")] where adminSharesLoopback {
                try check(port == 0 || port != adminPort, key, "the admin API and \(name) are both set to port \(port); give them different ports (--admin-port, or the simulator's)")
            }
        }
    }

    /// Checks the values and creates the data directory.
    public func prepare() throws(ConfigurationError) {
        try validate()
        var isDirectory: ObjCBool = false
        if FileManager.default.fileExists(atPath: dataDirectory, isDirectory: &isDirectory) {
            guard isDirectory.boolValue else { throw .dataDirectory(path: dataDirectory, reason: "it exists but is not a directory") }
        } else {
            do {
                try FileManager.default.createDirectory(atPath: dataDirectory, withIntermediateDirectories: true,
                                                        attributes: [.posixPermissions: 0o700])
            } catch {
                throw .dataDirectory(path: dataDirectory, reason: "cannot create it (\(KeyFiles.problem(error, at: dataDirectory)))")
            }
        }
        guard FileManager.default.isWritableFile(atPath: dataDirectory) else {
            throw .dataDirectory(path: dataDirectory, reason: "it is not writable")
        }
    }

    // MARK: - Admin key

    /// Path of the generated admin key.
    public var generatedAdminKeyPath: String {
        URL(fileURLWithPath: dataDirectory).appendingPathComponent(Self.adminKeyFileName).path
    }

    /// Where `resolveAdminKey` finds the key, in words (a 401 says it).
    public var adminKeySource: String {
        if adminKey != nil { return "the one set with SQUELCH_ADMIN_KEY or \"adminKey\" in the config file" }
        // No path: the 401 goes to whoever asks, before any key.
        if adminKeyFile != nil { return "the one in the file set with --admin-key-file, SQUELCH_ADMIN_KEY_FILE or \"adminKeyFile\" in the config file" }
        return "the one in <data-dir>/\(URL(fileURLWithPath: generatedAdminKeyPath).lastPathComponent)"
    }

    /// The admin API key: `adminKey` if set, else the contents of `adminKeyFile`, else the key in
    /// `<dataDirectory>/admin-key`, generated there (mode 0600) on first use. Call after `prepare()`.
    public func resolveAdminKey() throws(ConfigurationError) -> String {
        if let adminKey { return adminKey }
        if let adminKeyFile {
            return try Self.readAdminKey(at: adminKeyFile,
                                         advice: "point --admin-key-file (or SQUELCH_ADMIN_KEY_FILE) at a file holding a key of at least \(Self.minimumAdminKeyLength) characters")
        }
        let path = generatedAdminKeyPath
        let advice = "delete it and restart to generate a new key (clients then need the new one)"
        if FileManager.default.fileExists(atPath: path) { return try Self.readAdminKey(at: path, advice: advice) }
        let key = Self.generateAdminKey()
        let outcome: KeyFiles.Outcome
        do { outcome = try KeyFiles.createOnce(at: path, contents: Array((key + "\n").utf8)) } catch {
            throw .adminKey(path: path, reason: error.description)
        }
        // Another process may have made the key a moment ago: then its key is the one to use.
        if outcome == .exists { return try Self.readAdminKey(at: path, advice: advice) }
        return key
    }

    /// 32 random bytes from the system generator, base64url without padding (43 characters).
    public static func generateAdminKey() -> String {
        var generator = SystemRandomNumberGenerator()
        let bytes = (0..<32).map { _ in UInt8.random(in: .min ... .max, using: &generator) }
        return Data(bytes).base64EncodedString()
            .replacingOccurrences(of: "+", with: "-")
            .replacingOccurrences(of: "/", with: "_")
            .replacingOccurrences(of: "=", with: "")
    }

    static func readAdminKey(at path: String, advice: String) throws(ConfigurationError) -> String {
        let text: String
        do { text = try String(contentsOfFile: path, encoding: .utf8) } catch {
            let problem = KeyFiles.problem(error, at: path)
            // Someone else's file is to be given back, not replaced.
            let fix = problem == "permission denied" ? "run squelchd as the user that owns it, or give it to this one (keep it mode 600)" : advice
            throw .adminKey(path: path, reason: "cannot read it (\(problem)); \(fix)")
        }
        let key = text.trimmingCharacters(in: .whitespacesAndNewlines)
        guard key.count >= minimumAdminKeyLength, key.unicodeScalars.allSatisfy({ $0.value > 0x20 && $0.value < 0x7F }) else {
            throw .adminKey(path: path, reason: "it does not hold a key of at least \(minimumAdminKeyLength) printable characters; \(advice)")
        }
        return key
    }
}

/// One layer of settings (the config file, the environment or the command line): nil leaves the value
/// from the layers below. Field names are `ServerConfiguration`'s; `logLevel` is checked when applied.
public struct ConfigurationOverrides: Sendable, Equatable {
    public var dataDirectory: String?
    public var host: String?
    public var port: Int?
    public var adminHost: String?
    public var adminPort: Int?
    public var adminKey: String?
    public var adminKeyFile: String?
    public var tokenKeyPath: String?
    public var previousTokenKeyPath: String?
    public var certificateChainPath: String?
    public var privateKeyPath: String?
    public var maxConnections: Int?
    public var handshakesPerSecondPerAddress: Int?
    public var maxConnectionsPerAddress: Int?
    public var fullDuplexMaxTalkers: Int?
    public var disconnectGraceSeconds: Double?
    public var maxQueue: Int?
    public var controlMessagesPerSecond: Int?
    public var transmissionLogDays: Int?
    public var auditDays: Int?
    public var memberRetentionDays: Int?
    public var logLevel: String?
    public var apns: String?
    public var apnsKeyPath: String?
    public var apnsKeyID: String?
    public var apnsTeamID: String?
    public var apnsTopic: String?
    public var apnsCAPath: String?
    public var apnsPoolSize: Int?
    public var apnsSimulatorPort: Int?
    public var apnsSimulatorControlPort: Int?
    public var apnsSimulatorCertPath: String?
    public var apnsSimulatorKeyPath: String?
    public var pushWakeSilenceSeconds: Double?

    public init(dataDirectory: String? = nil, host: String? = nil, port: Int? = nil, adminHost: String? = nil,
                adminPort: Int? = nil, adminKey: String? = nil, adminKeyFile: String? = nil,
                certificateChainPath: String? = nil, privateKeyPath: String? = nil, maxConnections: Int? = nil, handshakesPerSecondPerAddress: Int? = nil,
                fullDuplexMaxTalkers: Int? = nil, disconnectGraceSeconds: Double? = nil, maxQueue: Int? = nil,
                logLevel: String? = nil, apns: String? = nil, apnsKeyPath: String? = nil, apnsKeyID: String? = nil,
                apnsTeamID: String? = nil, apnsTopic: String? = nil, apnsCAPath: String? = nil, apnsPoolSize: Int? = nil,
                apnsSimulatorPort: Int? = nil, apnsSimulatorControlPort: Int? = nil, apnsSimulatorCertPath: String? = nil,
                apnsSimulatorKeyPath: String? = nil, pushWakeSilenceSeconds: Double? = nil) {
        self.dataDirectory = dataDirectory
        self.host = host
        self.port = port
        self.adminHost = adminHost
        self.adminPort = adminPort
        self.adminKey = adminKey
        self.adminKeyFile = adminKeyFile
        self.certificateChainPath = certificateChainPath
        self.privateKeyPath = privateKeyPath
        self.maxConnections = maxConnections
        self.handshakesPerSecondPerAddress = handshakesPerSecondPerAddress
        self.fullDuplexMaxTalkers = fullDuplexMaxTalkers
        self.disconnectGraceSeconds = disconnectGraceSeconds
        self.maxQueue = maxQueue
        self.logLevel = logLevel
        self.apns = apns
        self.apnsKeyPath = apnsKeyPath
        self.apnsKeyID = apnsKeyID
        self.apnsTeamID = apnsTeamID
        self.apnsTopic = apnsTopic
        self.apnsCAPath = apnsCAPath
        self.apnsPoolSize = apnsPoolSize
        self.apnsSimulatorPort = apnsSimulatorPort
        self.apnsSimulatorControlPort = apnsSimulatorControlPort
        self.apnsSimulatorCertPath = apnsSimulatorCertPath
        self.apnsSimulatorKeyPath = apnsSimulatorKeyPath
        self.pushWakeSilenceSeconds = pushWakeSilenceSeconds
    }
}
