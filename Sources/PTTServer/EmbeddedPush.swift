/// A push service squelchd runs inside its own process when `apns` is `simulator`: in development,
/// the APNs simulator. The executable that embeds one hands it in (`SquelchServer`'s
/// `embeddedPush`), so this module links no simulator; a server given none refuses `apns simulator`
/// at start with what to do instead.
public protocol EmbeddedPushService: Sendable {
    /// Starts it on 127.0.0.1.
    func start() async throws -> EmbeddedPushEndpoints
    /// Stops it, once the pushes queued for it have gone.
    func stop() async throws
}

/// Where an embedded push service listens: its APNs port (HTTP/2 over TLS) and its control port
/// (the push log and the simulated devices).
public struct EmbeddedPushEndpoints: Sendable, Equatable {
    public var port: Int
    public var controlPort: Int

    public init(port: Int, controlPort: Int) {
        self.port = port
        self.controlPort = controlPort
    }
}

/// Makes the embedded push service from the server's settings (its certificate and key, its ports,
/// the provider key and topic it accepts); an error says which of them is wrong.
public typealias EmbeddedPushFactory = @Sendable (ServerConfiguration) throws -> any EmbeddedPushService
