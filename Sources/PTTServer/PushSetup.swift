import APNs
import Foundation
import Logging
import ServiceLifecycle

/// Builds the push side from the configuration: the APNs clients, and the embedded push service (the
/// simulator) when pushes go to it.
enum PushSetup {
    struct Made: Sendable {
        var route: APNsRoute?
        var simulator: (any EmbeddedPushService, EmbeddedPushEndpoints)?
    }

    /// - Parameter tokenShare: in a cluster, where the nodes share one provider JWT.
    static func make(configuration: ServerConfiguration, embeddedPush: EmbeddedPushFactory?,
                     tokenShare: (any ProviderTokenShare)? = nil, logger: Logger) async throws -> Made {
        let target = configuration.pushTarget
        guard target != .off else {
            logger.notice("pushes are off: members who are not connected will not be woken")
            return Made()
        }
        let identity: APNsProviderIdentity
        do {
            identity = try APNsProviderIdentity.load(p8Path: configuration.apnsKeyPath, keyID: configuration.apnsKeyID,
                                                     teamID: configuration.apnsTeamID)
        } catch {
            throw ServerConfiguration.ConfigurationError.invalidValue(
                "\(error); set the key with \(ServerConfiguration.setting("apnsKeyPath").howToSet), or turn pushes off with --apns off")
        }
        // One topic for every client: a push either host accepts proves it for both.
        let proof = APNsConfigurationProof()
        func client(_ environment: APNsEnvironment) async throws -> APNsClient {
            do {
                return try await APNsClient(
                    configuration: APNsConfiguration(environment: environment, identity: identity, topic: configuration.apnsTopic,
                                                     poolSize: configuration.apnsPoolSize, providerTokenShare: tokenShare),
                    logger: logger, proof: proof)
            } catch {
                throw ServerConfiguration.ConfigurationError.invalidValue("\(error)")
            }
        }
        switch target {
        case .off:
            return Made()
        case .apple:
            return Made(route: APNsRoute(production: try await client(.production), sandbox: try await client(.sandbox)))
        case .custom(let host, let port):
            return Made(route: APNsRoute(all: try await client(.custom(host: host, port: port, caPath: configuration.apnsCAPath))))
        case .simulator:
            guard let embeddedPush else {
                throw ServerConfiguration.ConfigurationError.invalidValue(
                    "apns is simulator, but this program embeds no APNs simulator; run the simulator on its own (squelchd apns-sim) and point \(ServerConfiguration.setting("apns").howToSet) at it as https://127.0.0.1:<port>, or use apple or off")
            }
            let simulator: any EmbeddedPushService
            let endpoints: EmbeddedPushEndpoints
            do {
                simulator = try embeddedPush(configuration)
            } catch {
                throw ServerConfiguration.ConfigurationError.invalidValue(
                    "the embedded APNs simulator could not start: \(error). Run `make certs` for its certificate and key, or use --apns off")
            }
            do { endpoints = try await simulator.start() } catch {
                // Its certificate loaded: what fails now is a socket (a port in use, most likely).
                throw ServerConfiguration.ConfigurationError.invalidValue(
                    "the embedded APNs simulator could not start: \(error); set its ports with --apns-simulator-port and --apns-simulator-control-port (0: any free one), or use --apns off")
            }
            logger.notice("APNs simulator listening", metadata: [
                "apns": "https://127.0.0.1:\(endpoints.port)", "control": "http://127.0.0.1:\(endpoints.controlPort)",
            ])
            do {
                let route = APNsRoute(all: try await client(.custom(host: "127.0.0.1", port: endpoints.port,
                                                                    caPath: configuration.apnsCAPath)))
                return Made(route: route, simulator: (simulator, endpoints))
            } catch {
                try? await simulator.stop()
                throw error
            }
        }
    }
}

/// Keeps the embedded simulator up until shutdown; it stops after the pushes queued for it.
struct SimulatorService: Service {
    let simulator: any EmbeddedPushService
    let logger: Logger

    func run() async throws {
        try? await gracefulShutdown()
        do { try await simulator.stop() } catch {
            logger.warning("APNs simulator did not stop cleanly", metadata: ["error": "\(error)"])
        }
    }
}
