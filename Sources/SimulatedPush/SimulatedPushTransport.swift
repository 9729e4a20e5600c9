import APNsDevice
import ChannelProtocol
import Foundation
import PTTClient

/// Pushes from the APNs simulator (`squelchd serve` embeds it; `squelchd apns-sim` runs it alone): the
/// device makes up a 32-byte token, as iOS hands out opaque ones, and subscribes to it on the
/// simulator's control port.
public struct SimulatedPushTransport: PushTransport {
    public var host: String
    public var controlPort: Int
    public var environment: PushEnvironment

    public init(host: String = "127.0.0.1", controlPort: Int = 2198, environment: PushEnvironment = .sandbox) {
        self.host = host
        self.controlPort = controlPort
        self.environment = environment
    }

    public func register(token: Data?) async throws -> (token: Data, pushes: AsyncThrowingStream<IncomingPush, any Error>) {
        let token = token ?? Self.newToken()
        let hex = token.map { String(format: "%02x", $0) }.joined()
        let deliveries = try await APNsSimulatedDevice.subscribe(host: host, controlPort: controlPort, token: hex)
        let pushes = IncomingPush.relay(deliveries) { delivery in
            // A body that is not a JSON object is still a push the app must answer; it gets an empty payload.
            IncomingPush(payload: PushValue.payload(from: Data(delivery.body.utf8)) ?? [:],
                         isHighPriority: (delivery.priority ?? 10) >= 10, receivedAt: delivery.receivedAt)
        }
        return (token, pushes)
    }

    public func unregister(token: Data) async {}
}
