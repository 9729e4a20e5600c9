import ChannelProtocol
import ChannelStorePostgres
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
/// command-line flags. `ServerConfiguration.settings` (ServerSettings.swift) declares every setting
/// once, with its key, variable, flag and help; a property here without a row there fails a test.
/// `load(file:environment:overrides:)` does the merge. Relative paths are relative to the working
/// directory, wherever they come from.
public struct ServerConfiguration: Sendable, Equatable {
    /// Where the database and generated keys live. Created (mode 0700) if missing.
    public var dataDirectory: String = "data"
    /// The PostgreSQL database a cluster's nodes share (`postgres://…`). Nil: SQLite in the data
    /// directory, the embedded default. Keys and certificates stay in the data directory either way.
    public var database: String?
    /// This node's id in a cluster. Nil: one generated at the first start and kept in
    /// `<dataDirectory>/node-id`.
    public var nodeID: String?
    /// Where clients reach this node's voice transport, as redirects to it say. Nil: `host`, which
    /// must then not be a wildcard address.
    public var advertiseHost: String?
    /// How long a channel's lease lasts without renewal in a cluster: after a node dies, its channels
    /// wait this long before another node takes them; a node cut off from the database for this long
    /// stops serving them. Renewed every second.
    public var leaseSeconds: Double = 5
    /// In a cluster, how long a stopping node (SIGTERM) waits for bursts in progress before it hands
    /// their channels over anyway.
    public var drainSeconds: Double = 30
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
    /// Live connections beyond this are refused (server busy); the device push service takes as many
    /// streams.
    public var maxConnections: Int = 10_000
    /// New handshakes accepted per second from one IP address (IPv6: one /64). Raise it when many members share an
    /// address (a dispatch centre behind one NAT, a load test).
    public var handshakesPerSecondPerAddress: Int = 20
    /// Connections open at once from one IP address (IPv6: one /64); more are refused. Raise it for a
    /// site with more members than this behind one NAT address.
    public var maxConnectionsPerAddress: Int = 1_000
    /// Threads the relay uses: one reads every datagram and decides, the others write and send the
    /// copies of some talkers' packets (`FanoutWorkers`). Default: one per core.
    public var relayThreads: Int = ProcessInfo.processInfo.activeProcessorCount
    static let relayThreadsRange = 1...64
    /// Simultaneous talkers in a full-duplex channel.
    public var fullDuplexMaxTalkers: Int = 4
    /// How long a dropped member keeps its place (and the floor) before it counts as gone.
    public var disconnectGraceSeconds: Double = 2
    /// Floor requests a channel queues while the floor is taken.
    public var maxQueue: Int = 16
    /// Control messages one connection may send per second (and twice as many in a burst); more are
    /// dropped. Raise it only for load tests that request the floor in a tight loop.
    public var controlMessagesPerSecond: Int = 20
    /// Floor grants a member may have per minute (`HubConfiguration.floorGrantsPerMinute`).
    public var floorGrantsPerMinute: Int = 15
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
    /// squelchd's own push service for devices Apple doesn't serve (Linux walkies): HTTPS on TCP at
    /// `host`, with the transport's certificate. `voice` (the default): TCP at the voice port's number,
    /// so a device finds it knowing only the server's address; a port number (0: any free one); or
    /// `off`.
    public var devicePushPort: String = "voice"
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
        if let database {
            do { _ = try PostgresLocation(url: database) } catch {
                throw .invalidValue("\(error.description); set it with \(Self.setting("database").howToSet)")
            }
            try check(advertiseHost != nil || !Self.isWildcard(host), "advertiseHost",
                      "the voice transport listens on every address (\(host)), so a redirect cannot say which one clients reach this node at; set the address or name clients use")
        }
        if let nodeID {
            try check(!nodeID.isEmpty && nodeID.utf8.count <= 64 && nodeID.allSatisfy { $0.isLetter || $0.isNumber || "-_.".contains($0) },
                      "nodeID", "the node id '\(nodeID)' must be 1-64 letters, digits, '-', '_' or '.'")
        }
        if let advertiseHost { try check(!advertiseHost.isEmpty && advertiseHost.utf8.count <= 255, "advertiseHost", "the advertised host is empty or too long") }
        try check(drainSeconds.isFinite && (0...600).contains(drainSeconds), "drainSeconds",
                  "the drain wait of \(drainSeconds) s is out of range; use 0-600")
        try check(leaseSeconds.isFinite && (2...60).contains(leaseSeconds), "leaseSeconds",
                  "the lease of \(leaseSeconds) s is out of range; use 2-60 (5 is the default: how long a dead node's channels wait)")
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
        try check(Self.relayThreadsRange.contains(relayThreads), "relayThreads",
                  "relay threads \(relayThreads) is out of range; use \(Self.relayThreadsRange.lowerBound)-\(Self.relayThreadsRange.upperBound)")
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
        try check(Self.controlMessageRateRange.contains(floorGrantsPerMinute), "floorGrantsPerMinute",
                  "floor grant rate \(floorGrantsPerMinute) is out of range; use \(Self.controlMessageRateRange.lowerBound)-\(Self.controlMessageRateRange.upperBound) per minute")
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
        switch devicePushListen {
        case nil:
            try check(false, "devicePushPort", "device push port '\(devicePushPort)' is not voice, off or a port (0-65535)")
        case .port(let port)?:
            try check(Self.portRange.contains(port), "devicePushPort", "device push port \(port) is out of range; use voice, off, 1-65535, or 0")
        default:
            break
        }
        // The device push service is TCP, as the admin API and the simulator are: the voice port's
        // number, free for UDP, may be one of theirs.
        let devicePort: Int? = switch devicePushListen {
        case .voicePort?: port
        case .port(let port)?: port
        default: nil
        }
        if let devicePort, devicePort != 0 {
            let overlaps = { (other: String) in other == self.host || Self.isWildcard(other) || Self.isWildcard(self.host) }
            try check(devicePort != adminPort || !overlaps(adminHost), "devicePushPort",
                      "the device push service and the admin API would both take TCP port \(devicePort) on \(host); give one of them another port (--device-push-port, --admin-port)")
            if pushTarget == .simulator {
                for (other, name) in [(apnsSimulatorPort, "APNs simulator's port"), (apnsSimulatorControlPort, "APNs simulator's control port")] {
                    try check(devicePort != other || !overlaps("127.0.0.1"), "devicePushPort",
                              "the device push service and the \(name) would both take TCP port \(devicePort); give one of them another port")
                }
            }
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
}
