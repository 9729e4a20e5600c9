import Foundation
import Logging
import SquelchInfo

/// Every setting of `squelchd serve`, each declared once: its config-file key (the property's
/// name), environment variable, flag, help and where its value goes. Loading (file, environment,
/// flags), the command line and its help are all driven from `ServerConfiguration.settings`.
extension ServerConfiguration {
    public struct Setting: Sendable {
        public let key: String
        public let environment: String
        /// Nil when there is none: the admin key is kept off the command line, where `ps` shows it.
        public let flag: String?
        /// What the flag's value is, in help ("path", "port", "n").
        public let valueName: String
        /// What the setting does, for help.
        public let help: String
        let kind: Kind
        /// The default as help shows it, where the value itself would not say it ("none").
        let defaultText: String?

        init(key: String, environment: String, flag: String?, valueName: String, kind: Kind, defaultText: String? = nil,
             help: String) {
            self.key = key
            self.environment = environment
            self.flag = flag
            self.valueName = valueName
            self.help = help
            self.kind = kind
            self.defaultText = defaultText
        }

        /// Where the value goes, and so how text becomes one.
        enum Kind: Sendable {
            case text(WritableKeyPath<ServerConfiguration, String> & Sendable)
            case optionalText(WritableKeyPath<ServerConfiguration, String?> & Sendable)
            /// An address; "[::1]", as a URL writes an IPv6 address, is the address ::1.
            case host(WritableKeyPath<ServerConfiguration, String> & Sendable)
            case whole(WritableKeyPath<ServerConfiguration, Int> & Sendable)
            case number(WritableKeyPath<ServerConfiguration, Double> & Sendable)
            case logLevel
        }

        /// "--port, SQUELCH_PORT or "port" in the config file": how to set it, for error messages.
        public var howToSet: String {
            (flag.map { "\($0), " } ?? "") + "\(environment) or \"\(key)\" in the config file"
        }

        /// The default as help and examples show it.
        public var defaultDescription: String {
            if let defaultText { return defaultText }
            let defaults = ServerConfiguration()
            switch kind {
            case .text(let path), .host(let path): return defaults[keyPath: path]
            case .optionalText(let path): return defaults[keyPath: path] ?? "none"
            case .whole(let path): return "\(defaults[keyPath: path])"
            case .number(let path): return SquelchInfo.plainNumber(defaults[keyPath: path])
            case .logLevel: return defaults.logLevel.rawValue
            }
        }

        /// Help for the flag: what it does, then where else it can be set and its default.
        public var helpText: String {
            "\(help) (env: \(environment); config file: \"\(key)\"; default: \(defaultDescription))"
        }

        /// `text` (from the environment or a flag) as this setting's value; nil when it is not of
        /// the setting's kind, which `expected` names.
        func value(parsing text: String) -> SettingValue? {
            switch kind {
            case .text, .optionalText, .host, .logLevel: return .text(text)
            case .whole: return Int(text).map(SettingValue.whole)
            case .number: return Double(text).flatMap { $0.isFinite ? .number($0) : nil }
            }
        }

        /// What a value of this setting is, in words.
        var expected: String {
            switch kind {
            case .text, .optionalText, .host, .logLevel: return "a string"
            case .whole: return "a whole number"
            case .number: return "a number"
            }
        }
    }

    /// Every setting, in help order.
    public static let settings: [Setting] = [
        Setting(key: "dataDirectory", environment: "SQUELCH_DATA_DIR", flag: "--data-dir", valueName: "path", kind: .text(\.dataDirectory),
                help: "Directory for the database and generated keys (created if missing)."),
        Setting(key: "database", environment: "SQUELCH_DATABASE", flag: "--database", valueName: "url", kind: .optionalText(\.database), defaultText: "SQLite in <data-dir>/squelch.sqlite",
                help: "PostgreSQL database shared by a cluster's nodes: postgres://user:password@host:5432/name?sslmode=require. Put a password in SQUELCH_DATABASE or the config file, not on the command line, where ps shows it. Keys and certificates stay in --data-dir."),
        Setting(key: "nodeID", environment: "SQUELCH_NODE_ID", flag: "--node-id", valueName: "id", kind: .optionalText(\.nodeID), defaultText: "generated once into <data-dir>/node-id",
                help: "This node's name in a cluster (with --database): 1-64 letters, digits, '-', '_' or '.'."),
        Setting(key: "advertiseHost", environment: "SQUELCH_ADVERTISE_HOST", flag: "--advertise-host", valueName: "address", kind: .optionalText(\.advertiseHost), defaultText: "--host",
                help: "In a cluster, the address or name clients reach this node's voice transport at (what redirects to it say); needed when --host is 0.0.0.0 or ::."),
        Setting(key: "leaseSeconds", environment: "SQUELCH_LEASE_SECONDS", flag: "--lease-seconds", valueName: "seconds", kind: .number(\.leaseSeconds),
                help: "In a cluster, how long a channel's lease lasts unrenewed, 2-60: a dead node's channels move after it; a node cut off from the database stops serving them after it. The same on every node."),
        Setting(key: "drainSeconds", environment: "SQUELCH_DRAIN_SECONDS", flag: "--drain-seconds", valueName: "seconds", kind: .number(\.drainSeconds),
                help: "In a cluster, how long a node stopping on SIGTERM waits for bursts in progress before it hands their channels to other nodes, 0-600."),
        Setting(key: "host", environment: "SQUELCH_HOST", flag: "--host", valueName: "address", kind: .host(\.host),
                help: "UDP address the push-to-talk transport binds."),
        Setting(key: "port", environment: "SQUELCH_PORT", flag: "--port", valueName: "port", kind: .whole(\.port),
                help: "UDP port of the transport (0: any free port)."),
        Setting(key: "adminHost", environment: "SQUELCH_ADMIN_HOST", flag: "--admin-host", valueName: "address", kind: .host(\.adminHost),
                help: "Address of the admin HTTP API. Keep it on loopback unless a proxy authenticates."),
        Setting(key: "adminPort", environment: "SQUELCH_ADMIN_PORT", flag: "--admin-port", valueName: "port", kind: .whole(\.adminPort),
                help: "Port of the admin HTTP API (0: any free port)."),
        Setting(key: "adminKey", environment: "SQUELCH_ADMIN_KEY", flag: nil, valueName: "key", kind: .optionalText(\.adminKey), defaultText: "generated into <data-dir>/\(adminKeyFileName)",
                help: "The admin API key itself; kept off the command line, where ps shows it."),
        Setting(key: "adminKeyFile", environment: "SQUELCH_ADMIN_KEY_FILE", flag: "--admin-key-file", valueName: "path", kind: .optionalText(\.adminKeyFile), defaultText: "none",
                help: "File holding the admin API key (SQUELCH_ADMIN_KEY sets the key itself; without either, one is generated into <data-dir>/admin-key)."),
        Setting(key: "tokenKeyPath", environment: "SQUELCH_TOKEN_KEY", flag: "--token-key", valueName: "path", kind: .optionalText(\.tokenKeyPath), defaultText: "<data-dir>/\(tokenKeyFileName), made on first run",
                help: "Participant-token signing key (P-256 private key, PEM); must exist when set. The token commands take the same setting."),
        Setting(key: "previousTokenKeyPath", environment: "SQUELCH_PREVIOUS_TOKEN_KEY", flag: "--previous-token-key", valueName: "path", kind: .optionalText(\.previousTokenKeyPath), defaultText: "none",
                help: "During a key rotation: the token key used before --token-key's. Tokens it signed are accepted until they expire; new ones are signed with the current key."),
        Setting(key: "certificateChainPath", environment: "SQUELCH_CERT", flag: "--cert", valueName: "path", kind: .text(\.certificateChainPath),
                help: "PEM certificate chain the server presents, leaf first."),
        Setting(key: "privateKeyPath", environment: "SQUELCH_KEY", flag: "--key", valueName: "path", kind: .text(\.privateKeyPath),
                help: "PEM private key of the leaf certificate."),
        Setting(key: "maxConnections", environment: "SQUELCH_MAX_CONNECTIONS", flag: "--max-connections", valueName: "n", kind: .whole(\.maxConnections),
                help: "Live connections beyond this are refused (and as many device push streams)."),
        Setting(key: "handshakesPerSecondPerAddress", environment: "SQUELCH_HANDSHAKES_PER_SECOND_PER_ADDRESS", flag: "--handshakes-per-second-per-address", valueName: "n", kind: .whole(\.handshakesPerSecondPerAddress),
                help: "New connections accepted per second from one IP address (IPv6: one /64)."),
        Setting(key: "maxConnectionsPerAddress", environment: "SQUELCH_MAX_CONNECTIONS_PER_ADDRESS", flag: "--max-connections-per-address", valueName: "n", kind: .whole(\.maxConnectionsPerAddress),
                help: "Connections open at once from one IP address (IPv6: one /64); raise it for a site with more members behind one NAT."),
        Setting(key: "relayThreads", environment: "SQUELCH_RELAY_THREADS", flag: "--relay-threads", valueName: "n", kind: .whole(\.relayThreads),
                defaultText: "one per core",
                help: "Threads that relay voice: one decides, the rest send copies of some talkers' packets, 1-64."),
        Setting(key: "fullDuplexMaxTalkers", environment: "SQUELCH_FULL_DUPLEX_MAX_TALKERS", flag: "--full-duplex-max-talkers", valueName: "n", kind: .whole(\.fullDuplexMaxTalkers),
                help: "Simultaneous talkers in a full-duplex channel, 1-16."),
        Setting(key: "disconnectGraceSeconds", environment: "SQUELCH_DISCONNECT_GRACE_SECONDS", flag: "--disconnect-grace-seconds", valueName: "seconds", kind: .number(\.disconnectGraceSeconds),
                help: "Seconds a dropped member keeps its place and the floor, 0-60."),
        Setting(key: "maxQueue", environment: "SQUELCH_MAX_QUEUE", flag: "--max-queue", valueName: "n", kind: .whole(\.maxQueue),
                help: "Floor requests a channel queues while the floor is taken, 0-256."),
        Setting(key: "controlMessagesPerSecond", environment: "SQUELCH_CONTROL_MESSAGES_PER_SECOND", flag: "--control-messages-per-second", valueName: "n", kind: .whole(\.controlMessagesPerSecond),
                help: "Control messages one connection may send per second, twice as many in a burst; more are dropped (floor requests are denied with cause rateLimited). 1-1000000."),
        Setting(key: "floorGrantsPerMinute", environment: "SQUELCH_FLOOR_GRANTS_PER_MINUTE", flag: "--floor-grants-per-minute", valueName: "n", kind: .whole(\.floorGrantsPerMinute),
                help: "Times a member may start talking per minute, on average, with a fifth of that (at least 3) in a row; more requests are denied with cause rateLimited and how long to wait. Each grant reaches every member of the channel. 1-1000000."),
        Setting(key: "transmissionLogDays", environment: "SQUELCH_TRANSMISSION_LOG_DAYS", flag: "--transmission-log-days", valueName: "days", kind: .whole(\.transmissionLogDays),
                help: "Days the transmission log keeps each burst (who talked, when, how long); older records are deleted hourly. 0 keeps them for good. 0-36500."),
        Setting(key: "auditDays", environment: "SQUELCH_AUDIT_DAYS", flag: "--audit-days", valueName: "days", kind: .whole(\.auditDays),
                help: "Days the audit trail keeps each change made through the admin API or the squelchd commands (GET /v1/audit, squelchd audit); older records are deleted hourly. 0 keeps them for good. 0-36500."),
        Setting(key: "memberRetentionDays", environment: "SQUELCH_MEMBER_RETENTION_DAYS", flag: "--member-retention-days", valueName: "days", kind: .whole(\.memberRetentionDays),
                help: "Days a member may stay away before it is forgotten: it leaves the roster and the wake list, and its device is told to leave the channel (a token it still holds lets it back in). Checked every minute, 20 members at a time. 0 keeps members until removed. 0-36500."),
        Setting(key: "logLevel", environment: "SQUELCH_LOG_LEVEL", flag: "--log-level", valueName: "level", kind: .logLevel,
                help: "Log level: trace, debug, info, notice, warning, error, critical."),
        Setting(key: "apns", environment: "SQUELCH_APNS", flag: "--apns", valueName: "target", kind: .text(\.apns),
                help: "Where wake pushes go: simulator (started inside squelchd), apple (api.push.apple.com and its sandbox, by each token's environment), off, or an https://host:port URL."),
        Setting(key: "apnsKeyPath", environment: "SQUELCH_APNS_KEY", flag: "--apns-key", valueName: "path", kind: .text(\.apnsKeyPath),
                help: "APNs provider key (.p8) that signs the push JWTs."),
        Setting(key: "apnsKeyID", environment: "SQUELCH_APNS_KEY_ID", flag: "--apns-key-id", valueName: "id", kind: .text(\.apnsKeyID),
                help: "The .p8 key's 10-character Key ID."),
        Setting(key: "apnsTeamID", environment: "SQUELCH_APNS_TEAM_ID", flag: "--apns-team-id", valueName: "id", kind: .text(\.apnsTeamID),
                help: "The 10-character Apple Team ID."),
        Setting(key: "apnsTopic", environment: "SQUELCH_APNS_TOPIC", flag: "--apns-topic", valueName: "topic", kind: .text(\.apnsTopic),
                help: "Push topic: <bundle id>.voip-ptt."),
        Setting(key: "apnsCAPath", environment: "SQUELCH_APNS_CA", flag: "--apns-ca", valueName: "path", kind: .text(\.apnsCAPath),
                help: "CA certificate trusted for the simulator or a custom APNs URL."),
        Setting(key: "apnsPoolSize", environment: "SQUELCH_APNS_POOL_SIZE", flag: "--apns-pool-size", valueName: "n", kind: .whole(\.apnsPoolSize),
                help: "HTTP/2 connections kept open to APNs, 1-64."),
        Setting(key: "apnsSimulatorPort", environment: "SQUELCH_APNS_SIMULATOR_PORT", flag: "--apns-simulator-port", valueName: "port", kind: .whole(\.apnsSimulatorPort),
                help: "Port of the embedded APNs simulator (0: any free port)."),
        Setting(key: "apnsSimulatorControlPort", environment: "SQUELCH_APNS_SIMULATOR_CONTROL_PORT", flag: "--apns-simulator-control-port", valueName: "port", kind: .whole(\.apnsSimulatorControlPort),
                help: "Port of the simulator's control API: push log, simulated devices."),
        Setting(key: "apnsSimulatorCertPath", environment: "SQUELCH_APNS_SIMULATOR_CERT", flag: "--apns-simulator-cert", valueName: "path", kind: .text(\.apnsSimulatorCertPath),
                help: "TLS certificate the embedded simulator serves."),
        Setting(key: "apnsSimulatorKeyPath", environment: "SQUELCH_APNS_SIMULATOR_KEY", flag: "--apns-simulator-key", valueName: "path", kind: .text(\.apnsSimulatorKeyPath),
                help: "Private key of the simulator's certificate."),
        Setting(key: "devicePushPort", environment: "SQUELCH_DEVICE_PUSH_PORT", flag: "--device-push-port", valueName: "port", kind: .text(\.devicePushPort),
                help: "TCP port of the device push service, which wakes Linux walkies anywhere (HTTPS on --host, with --cert): voice (the voice port's number), a port (0: any free one), or off."),
        Setting(key: "pushWakeSilenceSeconds", environment: "SQUELCH_PUSH_WAKE_SILENCE_SECONDS", flag: "--push-wake-silence-seconds", valueName: "seconds", kind: .number(\.pushWakeSilenceSeconds),
                help: "A connected member silent this long (0.1-3600) is woken by push too, and shows as reconnecting in the roster."),
    ]

    /// The setting with config-file key `key`.
    public static func setting(_ key: String) -> Setting {
        guard let setting = settings.first(where: { $0.key == key }) else { preconditionFailure("no setting \(key)") }
        return setting
    }

    /// The setting `flag` ("--port") sets, if any.
    public static func setting(flag: String) -> Setting? { settings.first { $0.flag == flag } }

    /// Help text for a flag that sets `key` in another command (the token commands take the token
    /// key): `abstract`, then where else it can be set and its default.
    public static func help(_ key: String, _ abstract: String) -> String {
        let setting = setting(key)
        return "\(abstract) (env: \(setting.environment); config file: \"\(setting.key)\"; default: \(setting.defaultDescription))"
    }
}

/// A setting's value as one layer gives it, before it is checked: text, or a number.
public enum SettingValue: Sendable, Equatable, ExpressibleByStringLiteral, ExpressibleByIntegerLiteral, ExpressibleByFloatLiteral {
    case text(String)
    case whole(Int)
    case number(Double)

    public init(stringLiteral value: String) { self = .text(value) }
    public init(integerLiteral value: Int) { self = .whole(value) }
    public init(floatLiteral value: Double) { self = .number(value) }
}

/// One layer of settings (the config file, the environment or the command line), by config-file
/// key: a setting the layer leaves out keeps its value from the layers below.
public struct ConfigurationOverrides: Sendable, Equatable, ExpressibleByDictionaryLiteral {
    public private(set) var values: [String: SettingValue]

    public init(_ values: [String: SettingValue] = [:]) {
        for key in values.keys where !ServerConfiguration.settings.contains(where: { $0.key == key }) {
            preconditionFailure("\(key) is not a setting")
        }
        self.values = values
    }

    public init(dictionaryLiteral elements: (String, SettingValue)...) {
        self.init(Dictionary(elements, uniquingKeysWith: { _, last in last }))
    }

    public subscript(key: String) -> SettingValue? {
        get { values[key] }
        set {
            precondition(ServerConfiguration.settings.contains { $0.key == key }, "\(key) is not a setting")
            values[key] = newValue
        }
    }
}
