import APNs
import ChannelStore
import ChannelStoreSQLite
import ChannelStorePostgres
import Foundation
import NIOConcurrencyHelpers
import NIOCore
import Hummingbird
import KeyFiles
import Logging
import ParticipantTokens
import ServiceLifecycle
import UnixSignals
import Wire

/// The squelchd process: loads its identity, prepares the data directory and runs its services until
/// SIGTERM or SIGINT, then shuts them down gracefully.
public struct SquelchServer: Sendable {
    public let configuration: ServerConfiguration
    public let identity: ServerIdentity
    private let logger: Logger
    /// How long a graceful shutdown may take before the services still running are cancelled. Without
    /// a limit an admin client that sends half a request, or a disk that stops answering, holds the
    /// process until the service manager kills it (systemd after 90 s), and members are never told
    /// the server is going away. 30 s is far more than a healthy stop takes (well under a second);
    /// after it, cancelled, the store writer may still spend up to its 10 s retry budget on a failing
    /// database, so the worst case is about 40 s.
    public var shutdownLimit: Duration = .seconds(30)
    /// Makes the push service run inside this process when `apns` is `simulator` (squelchd's is
    /// the APNs simulator, `EmbeddedAPNsSimulator`); nil: such a configuration is refused at start.
    public var embeddedPush: EmbeddedPushFactory?

    /// Fails with an actionable error if the configuration, data directory or certificate is wrong.
    public init(configuration: ServerConfiguration, logger: Logger = Logger(label: "squelchd")) throws {
        try configuration.prepare()
        self.identity = try ServerIdentity.load(chainPath: configuration.certificateChainPath,
                                                keyPath: configuration.privateKeyPath)
        self.configuration = configuration
        self.logger = logger
    }

    /// With an identity already loaded (tests make theirs in memory).
    public init(configuration: ServerConfiguration, identity: ServerIdentity, logger: Logger = Logger(label: "squelchd")) throws {
        try configuration.prepare()
        self.identity = identity
        self.configuration = configuration
        self.logger = logger
    }

    /// Where a running server can be reached; ports are the bound ones (useful with port 0).
    public struct Listening: Sendable {
        public var voicePort: Int
        public var adminPort: Int
        /// Starts a graceful shutdown, as SIGTERM does.
        public var shutdown: @Sendable () async -> Void
        /// The embedded push service (the APNs simulator), when `apns` is `simulator`.
        public var embeddedPush: (any EmbeddedPushService)?
        public var embeddedPushEndpoints: EmbeddedPushEndpoints?
        /// The device push service's TCP port; nil when it is off.
        public var devicePushPort: Int? = nil
    }

    /// The admin application around `context`. `onListening` receives the bound port (useful with port 0).
    public func adminApplication(context: AdminContext,
                                 onListening: @escaping @Sendable (Int) async -> Void = { _ in }) -> some ApplicationProtocol {
        let logger = self.logger
        let host = configuration.adminHost
        return Application(
            router: AdminAPI.router(context: context),
            server: AdminAPI.httpServer(),
            configuration: .init(address: .hostname(host, port: configuration.adminPort), serverName: "squelchd"),
            onServerRunning: { channel in
                let port = channel.localAddress?.port ?? 0
                logger.notice("admin API listening on http://\(ServerConfiguration.urlHost(host)):\(port)")
                if !ServerConfiguration.isLoopback(host) {
                    // Plain HTTP with a bearer key: anyone on the path reads the key, and anyone who
                    // has it can remove members and issue tokens.
                    logger.warning("the admin API is reachable beyond this machine (\(host)) over plain HTTP: the admin key crosses the network in clear text. Keep --admin-host on 127.0.0.1 and reach it through an SSH tunnel or a TLS proxy that authenticates")
                }
                await onListening(port)
            },
            logger: logger)
    }

    /// What to do when the default token key is gone from a data directory whose database was served
    /// with one.
    public static func lostTokenKey(path: String, dataDirectory: String) -> String {
        "the token key \(path) is missing, but this data directory's database was served with one: every participant token issued so far is signed with it. " + lostTokenKeyAdvice(path: path, dataDirectory: dataDirectory)
    }

    public static func lostTokenKeyAdvice(path: String, dataDirectory: String) -> String {
        "Restore \(path) from a backup (or point --token-key at it, if it is kept elsewhere). If it is lost for good, 'squelchd token new-key --data-dir \(dataDirectory) --every-token-stops-working' makes a new one, and every member then needs a new token"
    }

    /// Runs until a shutdown signal arrives (or the task is cancelled), then stops gracefully: the
    /// admin API first, then the voice transport (members are told the server is going away), and
    /// the database last, once every pending write is in. `onReady` runs once both listeners are up.
    public func run(onReady: @escaping @Sendable (Listening) async -> Void = { _ in }) async throws {
        // Absolute, because a relative data directory counts from wherever the server was started.
        let dataDirectory = URL(fileURLWithPath: configuration.dataDirectory).standardizedFileURL.path
        logger.notice("squelchd starting", metadata: [
            "data": .string(dataDirectory), "certificate": .string(identity.summary),
        ])
        let names = identity.names
        if !ServerConfiguration.isLoopback(configuration.host), !names.isEmpty, names.allSatisfy(ServerConfiguration.isLoopback) {
            // The development certificate, served to the network: every client elsewhere fails the
            // handshake with a name mismatch, and the server's log would otherwise say nothing.
            logger.warning("the voice transport listens on \(configuration.host), beyond this machine, but its certificate is only for \(names.joined(separator: ", ")): clients on other machines will refuse it, since the name they connect to is not in it. Serve a certificate issued for the name or address clients use (--cert and --key; certs/README.md says how to make one with the dev CA)")
        }
        if !ServerConfiguration.isLoopback(configuration.host), configuration.pushTarget == .simulator {
            // The default suits a machine's own tests; served to real phones, it accepts every push
            // and wakes nobody, and /healthz reports pushes as fine.
            logger.warning("the voice transport listens on \(configuration.host), beyond this machine, but wake pushes go to the embedded APNs simulator, which wakes no real phone: members whose app sleeps will not hear a burst. For real devices set \(ServerConfiguration.setting("apns").howToSet) to apple (with the APNs key, key id, team id and topic), or to off")
        }
        let storeLocation = try configuration.storeLocation()
        if case .sqlite = storeLocation, !FileManager.default.fileExists(atPath: dataDirectory + "/" + SQLiteChannelStore.defaultFileName) {
            // A server started from another working directory, or by a unit without one, would otherwise
            // come up empty in silence: no channels, and a new token key that calls every token forged.
            logger.warning("no database in \(dataDirectory): starting a new one, with no channels. If this server had channels, it kept them in another directory: stop it and pass that one with --data-dir (a relative path counts from the working directory)")
        }
        // A configured key file is checked before anything is made in the data directory: a bad one
        // used to stop the start only after the database and token key were created.
        if configuration.adminKey == nil, configuration.adminKeyFile != nil { _ = try configuration.resolveAdminKey() }
        // Before the database: a second server must not even migrate or prune it.
        let lock = try DataDirectoryLock(directory: dataDirectory)
        defer { withExtendedLifetime(lock) {} }
        let store = try await configuration.openStore(logger: logger)
        logger.notice("database", metadata: ["store": "\(storeLocation)"])
        var tokens: TokenAuthority
        if let path = configuration.tokenKeyPath {
            do { tokens = try await TokenAuthority.load(from: path) } catch let error as TokenKeyError {
                throw TokenKeyError(message: "\(error.message); point \(ServerConfiguration.setting("tokenKeyPath").howToSet) at the key the channel's tokens were signed with, or unset it to use <data-dir>/\(ServerConfiguration.tokenKeyFileName)")
            }
        } else if configuration.sharesDatabase {
            tokens = try await SharedSecrets.tokenAuthority(store: store, seedFile: configuration.resolvedTokenKeyPath)
        } else {
            let path = configuration.resolvedTokenKeyPath
            // A database that was served before has its key's public half on record: the key file
            // gone (a backup restored without it, a file deleted) is a loss to report, not a first
            // start. A new key made in silence would call every token issued so far forged; a database
            // that can't say fails the start with its error, for the same reason.
            if !FileManager.default.fileExists(atPath: path),
               let recorded = try await store.serverKey(named: TokenAuthority.publicKeyRecordName), !recorded.isEmpty {
                throw TokenKeyError(message: Self.lostTokenKey(path: path, dataDirectory: configuration.dataDirectory))
            }
            tokens = try await TokenAuthority.loadOrCreate(in: configuration.dataDirectory)
        }
        if let path = configuration.previousTokenKeyPath {
            do { tokens = try await tokens.accepting(previousKeyAt: path) } catch let error as TokenKeyError {
                throw TokenKeyError(message: "\(error.message); fix \(ServerConfiguration.setting("previousTokenKeyPath").howToSet), or unset it once the rotation is over")
            }
            logger.notice("token key rotation: tokens signed with the previous key are accepted until they expire", metadata: ["previous": .string(path)])
        }
        // What `squelchd token issue` checks its key against: a token command not given the server's
        // tokenKeyPath would otherwise sign with a default key that every join refuses as forged.
        do {
            try await store.setServerKey(named: TokenAuthority.publicKeyRecordName, value: Array(tokens.publicKeyPEM.utf8))
        } catch {
            logger.warning("could not record the token key's public half; 'squelchd token issue' cannot check its key against it",
                           metadata: ["error": "\(error)"])
        }
        let adminKey = configuration.sharesDatabase && configuration.adminKey == nil && configuration.adminKeyFile == nil
            ? try await SharedSecrets.adminKey(store: store, file: configuration.generatedAdminKeyPath, logger: logger)
            : try configuration.resolveAdminKey()
        warnIfLoose(configuration.resolvedTokenKeyPath, "the participant-token signing key", "anyone who reads it can sign tokens for every channel")
        if let previous = configuration.previousTokenKeyPath {
            warnIfLoose(previous, "the previous token key", "anyone who reads it can sign tokens accepted during the rotation")
        }
        if configuration.adminKey == nil {
            warnIfLoose(configuration.adminKeyFile ?? configuration.generatedAdminKeyPath, "the admin key",
                        "anyone who reads it can use the admin API")
        }
        warnIfLoose(configuration.privateKeyPath, "the transport's private key", "anyone who reads it can pose as this server")
        if case .isCertificateAuthority? = try? identity.leaf.extensions.basicConstraints {
            // Clients accept it if it is the CA they pin, but a CA's key serving as a server is the
            // key that signs every other certificate, now on a network-facing machine.
            logger.warning("the transport's certificate \(identity.leaf.subject) is a CA certificate (\(configuration.certificateChainPath)): serve a leaf certificate issued by the CA (certs/README.md), and keep the CA's key off this server")
        }
        let metrics = ServerMetrics()
        let writer = StoreWriter(store: store, metrics: metrics, logger: logger)
        let push = try await PushSetup.make(configuration: configuration, embeddedPush: embeddedPush,
                                            tokenShare: (store as? PostgresChannelStore).map(SharedProviderTokens.init), logger: logger)
        let devicePushListen = configuration.devicePushListen ?? .off
        let latch = ReadyLatch(onReady: onReady, simulator: push.simulator, devicePush: devicePushListen != .off)
        // The voice port's number, for a device push service that takes it: known once it is bound.
        let (voicePorts, voicePortKnown) = AsyncStream.makeStream(of: Int.self, bufferingPolicy: .bufferingNewest(1))
        var devices: DevicePushService?
        if devicePushListen != .off {
            devices = try DevicePushService(
                host: configuration.host,
                port: {
                    if case .port(let port) = devicePushListen { return port }
                    for await port in voicePorts { return port }
                    return nil
                },
                identity: identity, tokens: tokens, store: store, maxStreams: configuration.maxConnections,
                registry: metrics.registry, logger: logger,
                onListening: { port in await latch.devicePush(port) })
        } else {
            logger.notice("the device push service is off: walkies that sleep are woken only through APNs (or its simulator)")
        }
        let voiceBox = NIOLockedValueBox<VoiceService?>(nil)
        let dispatcher = push.route != nil || devices != nil
            ? PushDispatcher(route: push.route, devices: devices, registry: metrics.registry, logger: logger) { channel, user, token in
                await voiceBox.withLockedValue { $0 }?.pushTokenRejected(channel: channel, user: user, token: token)
            }
            : nil
        var cluster: ClusterNode?
        if let shared = store as? PostgresChannelStore {
            cluster = ClusterNode(id: try configuration.resolveNodeID(), store: shared, lease: .milliseconds(Int64(configuration.leaseSeconds * 1000)),
                                  drainWait: .milliseconds(Int64(configuration.drainSeconds * 1000)),
                                  metrics: ClusterMetrics(registry: metrics.registry), logger: logger)
        }
        let voice = VoiceService(configuration: configuration, identity: identity, store: store, tokens: tokens,
                                 writer: writer, metrics: metrics, logger: logger, pushes: dispatcher, cluster: cluster,
                                 onListening: { address in
                                     voicePortKnown.yield(address.port ?? 0)
                                     await latch.voice(address.port ?? 0)
                                 })
        voiceBox.withLockedValue { $0 = voice }
        var pushStatus: (@Sendable () -> AdminAPI.PushStatus)?
        if let dispatcher, push.route != nil { pushStatus = { dispatcher.pushHealth.status } }
        let certificateExpiry = CertificateExpiry(subject: "\(identity.leaf.subject)", notValidAfter: identity.leaf.notValidAfter)
        var admin = AdminContext(
            store: store, tokens: tokens, adminKey: adminKey, hub: voice,
            registry: metrics.registry, identitySummary: identity.summary,
            readiness: {
                guard voice.isRunning else { return .unavailable(reason: "the voice transport is not running") }
                if case .expired(let why) = certificateExpiry.status() { return .unavailable(reason: why) }
                if let problem = await voice.transportProblem() { return .unavailable(reason: problem) }
                return writer.unhealthyReason().map { .unavailable(reason: $0) } ?? .ready
            },
            pushStatus: pushStatus,
            certificateExpiry: certificateExpiry,
            auditLog: logger)
        admin.adminKeySource = configuration.adminKeySource
        // Services stop in reverse order: the admin API, then the voice transport (no new bursts), then the
        // pushes already queued, then the simulator they may be going to, and the database last.
        var services: [ServiceGroupConfiguration.ServiceConfiguration] = [
            .init(service: StoreService(writer: writer, store: store, logger: logger)),
            .init(service: CertificateWatch(expiry: certificateExpiry, logger: logger)),
        ]
        if let (simulator, _) = push.simulator { services.append(.init(service: SimulatorService(simulator: simulator, logger: logger))) }
        // The device streams stay until the dispatcher has sent what was queued.
        if let devices { services.append(.init(service: devices)) }
        if let dispatcher { services.append(.init(service: dispatcher)) }
        services.append(.init(service: voice))
        let adminStarted = NIOLockedValueBox(false)
        let adminApp = adminApplication(context: admin, onListening: { port in
            adminStarted.withLockedValue { $0 = true }
            await latch.admin(port)
        })
        services.append(.init(service: ListenErrorNaming(base: adminApp, started: adminStarted) { [configuration] error in
            ListenError.admin(host: configuration.adminHost, port: configuration.adminPort, error)
        }))
        // The signals are ours, not the group's: the group takes only the first graceful signal, and an
        // operator whose stop hangs (a client holding a request open, a stuck disk) sends another.
        var groupConfiguration = ServiceGroupConfiguration(services: services, logger: logger)
        // A cluster node drains first: it may wait drainSeconds for bursts, then still stop cleanly.
        let limit = configuration.sharesDatabase ? max(shutdownLimit, .milliseconds(Int64(configuration.drainSeconds * 1000)) + .seconds(15)) : shutdownLimit
        groupConfiguration.maximumGracefulShutdownDuration = limit
        let group = ServiceGroup(configuration: groupConfiguration)
        await latch.setGroup(group)
        // SIGHUP (the terminal or ssh session that started it went away, a script's `kill -HUP`) stops
        // it gracefully too, rather than killing it with members left hanging and the WAL unmerged;
        // unless it started with SIGHUP ignored (`nohup`), which asks it to outlive the terminal.
        // Only read, never set: a server run inside another process (the tests) must not leave SIGHUP
        // ignored there, where every child process started afterwards would inherit it.
        var hangUp = sigaction()
        let hangUpIgnored = sigaction(SIGHUP, nil, &hangUp) == 0
            && unsafeBitCast(hangUp.__sigaction_handler.sa_handler, to: Int.self) == 1  // SIG_IGN is 1
        let signals = hangUpIgnored ? await UnixSignalsSequence(trapping: .sigterm, .sigint)
                                    : await UnixSignalsSequence(trapping: .sigterm, .sigint, .sighup)
        // Handles, not a task group: the second signal must cancel the group's task alone, and one
        // loop over the signals sees all of them (a signal sequence has a single consumer).
        let running = Task { try await group.run() }
        let escalated = NIOLockedValueBox(false)
        let watcher = Task { [logger, limit] in
            var caught = 0
            for await signal in signals {
                caught += 1
                switch caught {
                case 1:
                    logger.notice("\(signal) received: stopping gracefully, within \(limit); send it again to stop at once")
                    await group.triggerGracefulShutdown()
                case 2:
                    // The cancelled services still write what is pending and close the database.
                    logger.warning("\(signal) received again: stopping at once (committed database writes are safe; members see the connection drop and reconnect); a third time exits without waiting")
                    escalated.withLockedValue { $0 = true }
                    running.cancel()
                default:
                    logger.critical("\(signal) received a third time: exiting now")
                    // Not exit(): its handlers would run while every other thread still does.
                    _exit(1)
                }
            }
        }
        defer { watcher.cancel() }
        do {
            try await withTaskCancellationHandler {
                try await running.value
            } onCancel: {
                running.cancel()
            }
        } catch where escalated.withLockedValue({ $0 }) || Task.isCancelled {
            // What the cancelled services threw: the stop was asked for, so it is not a failure.
            logger.notice("services cancelled", metadata: ["error": "\(error)"])
        }
        logger.notice("squelchd stopped")
    }
}

extension SquelchServer {
    /// Warns (and goes on: a secret volume may be mounted 0644 on purpose) when a secret file is open to
    /// other users.
    func warnIfLoose(_ path: String, _ what: String, _ risk: String) {
        guard let mode = KeyFiles.looseMode(of: path) else { return }
        logger.warning("\(what) \(path) is open to other users (mode \(mode)): \(risk); run chmod 600 \(path)")
    }
}

/// Runs `base`, and turns a socket error it throws before it was listening (a port in use, an address
/// the machine lacks) into `toListenError`'s error, which says which setting to change.
struct ListenErrorNaming<Base: Service>: Service {
    let base: Base
    let started: NIOLockedValueBox<Bool>
    let toListenError: @Sendable (any Error) -> any Error

    func run() async throws {
        do {
            try await base.run()
        } catch where ListenError.isBindFailure(error) && !started.withLockedValue({ $0 }) {
            throw toListenError(error)
        }
    }
}

/// Calls `onReady` once both the voice and the admin port are known.
actor ReadyLatch {
    let onReady: @Sendable (SquelchServer.Listening) async -> Void
    let simulator: (any EmbeddedPushService, EmbeddedPushEndpoints)?
    /// Whether to wait for the device push service's port.
    let devicePush: Bool
    var voicePort: Int?
    var adminPort: Int?
    var devicePushPort: Int?
    var group: ServiceGroup?

    init(onReady: @escaping @Sendable (SquelchServer.Listening) async -> Void, simulator: (any EmbeddedPushService, EmbeddedPushEndpoints)?,
         devicePush: Bool) {
        self.onReady = onReady
        self.simulator = simulator
        self.devicePush = devicePush
    }

    func devicePush(_ port: Int) async {
        devicePushPort = port
        await fire()
    }

    func setGroup(_ group: ServiceGroup) async {
        self.group = group
        await fire()
    }

    func voice(_ port: Int) async {
        voicePort = port
        await fire()
    }

    func admin(_ port: Int) async {
        adminPort = port
        await fire()
    }

    private func fire() async {
        guard let voicePort, let adminPort, let group, !devicePush || devicePushPort != nil else { return }
        self.group = nil  // fire once
        await onReady(SquelchServer.Listening(voicePort: voicePort, adminPort: adminPort,
                                              shutdown: { await group.triggerGracefulShutdown() },
                                              embeddedPush: simulator?.0, embeddedPushEndpoints: simulator?.1,
                                              devicePushPort: devicePushPort))
    }
}
