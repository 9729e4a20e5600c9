import APNsSimulator
import PTTServer

/// The APNs simulator as squelchd's embedded push service: what `apns simulator` starts, on
/// 127.0.0.1, with the server's provider key and topic. Its own module, so that the server links
/// no simulator and the executables (and tests) that want one say so.
public struct EmbeddedAPNsSimulator: EmbeddedPushService {
    public let simulator: APNsSimulator

    /// For `SquelchServer.embeddedPush`.
    public static let factory: EmbeddedPushFactory = { configuration in try EmbeddedAPNsSimulator(configuration: configuration) }

    public init(configuration: ServerConfiguration) throws {
        let key = try APNsProviderKey.load(p8Path: configuration.apnsKeyPath, keyID: configuration.apnsKeyID,
                                           teamID: configuration.apnsTeamID)
        simulator = try APNsSimulator(configuration: APNsSimulatorConfiguration(
            certificateChainPath: configuration.apnsSimulatorCertPath, privateKeyPath: configuration.apnsSimulatorKeyPath,
            providerKeys: [key], host: "127.0.0.1", port: configuration.apnsSimulatorPort,
            controlPort: configuration.apnsSimulatorControlPort, allowedTopics: [configuration.apnsTopic]))
    }

    public func start() async throws -> EmbeddedPushEndpoints {
        let endpoints = try await simulator.start()
        return EmbeddedPushEndpoints(port: endpoints.port, controlPort: endpoints.controlPort)
    }

    public func stop() async throws { try await simulator.stop() }
}

extension SquelchServer.Listening {
    /// The embedded APNs simulator, when the server runs one.
    public var apnsSimulator: APNsSimulator? { (embeddedPush as? EmbeddedAPNsSimulator)?.simulator }
    public var apnsSimulatorEndpoints: APNsSimulatorEndpoints? {
        embeddedPushEndpoints.map { APNsSimulatorEndpoints(port: $0.port, controlPort: $0.controlPort) }
    }
}
