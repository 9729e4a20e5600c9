import Foundation
import Hummingbird
import Logging
import ServiceLifecycle
import Wire

/// The squelchd process: loads its identity, prepares the data directory and runs its services until
/// SIGTERM or SIGINT, then shuts them down gracefully.
public struct SquelchServer: Sendable {
    public let configuration: ServerConfiguration
    public let identity: ServerIdentity
    private let logger: Logger

    /// Fails with an actionable error if the configuration, data directory or certificate is wrong.
    public init(configuration: ServerConfiguration, logger: Logger = Logger(label: "squelchd")) throws {
        try configuration.prepare()
        self.identity = try ServerIdentity.load(chainPath: configuration.certificateChainPath,
                                                keyPath: configuration.privateKeyPath)
        self.configuration = configuration
        self.logger = logger
    }

    /// The admin application. `onListening` receives the bound port (useful with port 0).
    public func adminApplication(onListening: @escaping @Sendable (Int) async -> Void = { _ in }) -> some ApplicationProtocol {
        let logger = self.logger
        let host = configuration.adminHost
        return Application(
            router: AdminAPI.router(identitySummary: identity.summary),
            configuration: .init(address: .hostname(host, port: configuration.adminPort), serverName: "squelchd"),
            onServerRunning: { channel in
                let port = channel.localAddress?.port ?? 0
                logger.notice("admin API listening on http://\(host):\(port)")
                await onListening(port)
            },
            logger: logger)
    }

    /// Runs until a shutdown signal arrives.
    public func run() async throws {
        logger.notice("squelchd starting", metadata: [
            "data": .string(configuration.dataDirectory), "certificate": .string(identity.summary),
        ])
        let group = ServiceGroup(configuration: .init(
            services: [.init(service: adminApplication())],
            gracefulShutdownSignals: [.sigterm, .sigint],
            logger: logger))
        try await group.run()
        logger.notice("squelchd stopped")
    }
}
