import ChannelProtocol
import ChannelStorePostgres
import Foundation

/// How a device push reaches the node holding the device's stream, in a cluster: the channel's home
/// sends its pushes, but a device's stream may be on another node (where it joined before a
/// failover moved the channel, or the entry point it fell back to while the home was gone).
protocol DevicePushForwarding: Sendable {
    /// Hands a push whose stream is not on this node to every other node.
    func forward(_ delivery: DevicePushDelivery, token: String, channel: UUID, user: String) async throws
    /// The pushes other nodes hand over, for this node's streams.
    func forwarded() -> AsyncStream<ForwardedDevicePush>
}

/// A push on its way between nodes.
struct ForwardedDevicePush: Codable, Sendable, Equatable {
    /// The process that sent it, which ignores its own.
    var sender: UUID
    var token: String
    var channel: UUID
    var user: String
    var delivery: DevicePushDelivery
}

/// Forwarding over the cluster's PostgreSQL (NOTIFY to every node's LISTEN): the database the nodes
/// share already, so no node needs to know another's address, and a node that is down misses what
/// it could not deliver anyway.
struct ClusterDevicePushes: DevicePushForwarding {
    let store: PostgresChannelStore
    let sender = UUID()

    func forward(_ delivery: DevicePushDelivery, token: String, channel: UUID, user: String) async throws {
        let push = ForwardedDevicePush(sender: sender, token: token, channel: channel, user: user, delivery: delivery)
        let payload = String(decoding: try DevicePushProtocol.encoder().encode(push), as: UTF8.self)
        try await store.notifyDevicePush(payload)
    }

    func forwarded() -> AsyncStream<ForwardedDevicePush> {
        let payloads = store.devicePushes()
        let sender = sender
        return AsyncStream { continuation in
            let task = Task {
                let decoder = DevicePushProtocol.decoder()
                for await payload in payloads {
                    // Another version's payload, or not one at all: nothing this node can deliver.
                    guard let push = try? decoder.decode(ForwardedDevicePush.self, from: Data(payload.utf8)), push.sender != sender else { continue }
                    continuation.yield(push)
                }
                continuation.finish()
            }
            continuation.onTermination = { _ in task.cancel() }
        }
    }
}
