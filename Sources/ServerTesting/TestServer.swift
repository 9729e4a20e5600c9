import APNsSimulatorEmbedding
import Foundation
import PTTServer
import Wire

/// squelchd in the test's own process, as the PTTClient and PTTServer tests run it: free ports, a
/// known admin key, pushes off or to the embedded APNs simulator. Test support: never linked into
/// squelchd or walkie.
public enum TestServer {
    /// The admin key every test server takes.
    public static let adminKey = "test-admin-key-0123456789"

    /// Settings for a server on free ports with its data in `dataDirectory`. With
    /// `pushCertificates` (a directory made by certs/make-dev-certs.sh), pushes go to the embedded
    /// APNs simulator, on free ports too; without, pushes are off.
    public static func configuration(dataDirectory: String, pushCertificates: String? = nil) -> ServerConfiguration {
        var configuration = ServerConfiguration()
        configuration.dataDirectory = dataDirectory
        configuration.port = 0
        configuration.adminPort = 0
        configuration.adminKey = adminKey
        // Any free port: the voice port's number, free for UDP, may be taken for TCP.
        configuration.devicePushPort = "0"
        configuration.apns = "off"
        if let certs = pushCertificates {
            configuration.apns = "simulator"
            configuration.apnsKeyPath = "\(certs)/AuthKey_DEVKEY0001.p8"
            configuration.apnsCAPath = "\(certs)/ca.pem"
            configuration.apnsSimulatorCertPath = "\(certs)/apns-sim.pem"
            configuration.apnsSimulatorKeyPath = "\(certs)/apns-sim.key"
            configuration.apnsSimulatorPort = 0
            configuration.apnsSimulatorControlPort = 0
        }
        return configuration
    }

    public struct DidNotStart: Error, CustomStringConvertible {
        public var description: String { "squelchd did not start" }
    }

    /// Starts `configuration` with `identity` (and the APNs simulator embedded); returns once both
    /// listeners are up. Cancel the task to stop it.
    public static func start(_ configuration: ServerConfiguration, identity: ServerIdentity,
                             shutdownLimit: Duration? = nil) async throws -> (task: Task<Void, any Error>, listening: SquelchServer.Listening) {
        var server = try SquelchServer(configuration: configuration, identity: identity)
        server.embeddedPush = EmbeddedAPNsSimulator.factory
        if let shutdownLimit { server.shutdownLimit = shutdownLimit }
        let (ready, continuation) = AsyncStream.makeStream(of: SquelchServer.Listening.self)
        let task = Task { [server] in
            defer { continuation.finish() }
            try await server.run(onReady: { continuation.yield($0) })
        }
        var iterator = ready.makeAsyncIterator()
        guard let listening = await iterator.next() else {
            _ = await task.result
            throw DidNotStart()
        }
        return (task, listening)
    }
}
