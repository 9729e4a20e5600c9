import APNs
import ChannelProtocol
import ChannelStore
import ChannelStorePostgres
import Foundation
import Hummingbird
import HummingbirdTLS
import Logging
import NIOCore
import NIOSSL
import ParticipantClaims
import ParticipantTokens
import Prometheus
import ServiceLifecycle
import Wire

/// squelchd's own push service, for devices Apple doesn't serve (a Linux walkie, anywhere on the
/// network): each device holds an HTTPS stream open (`DevicePushProtocol`), opened with its
/// participant token, and `PushDispatcher` hands it the pushes for tokens of the `device` kind. It
/// listens on TCP at the voice host, with the transport's certificate, so a device needs nothing but
/// what it joins with.
public final class DevicePushService: Service, Sendable {
    /// The devices' streams, for the dispatcher's deliveries.
    let subscriptions: DevicePushSubscriptions
    /// Streams open at once beyond this are refused: each holds a TLS connection and its memory.
    private let maxStreams: Int
    private let host: String
    private let port: @Sendable () async -> Int?
    private let tls: TLSConfiguration
    private let tokens: TokenAuthority
    private let store: any ChannelStore
    private let logger: Logger
    private let onListening: @Sendable (Int) async -> Void
    /// In a cluster, how pushes reach streams on other nodes.
    private let forwarding: (any DevicePushForwarding)?

    /// - Parameters:
    ///   - port: where to listen, once known (the voice port's number is only known once it is bound);
    ///     nil when the voice transport did not start.
    ///   - maxStreams: streams open at once (squelchd's `maxConnections`, as for the voice transport).
    ///   - store: a cluster's shared database (`PostgresChannelStore`) also carries pushes between nodes.
    public init(host: String, port: @escaping @Sendable () async -> Int?, identity: ServerIdentity, tokens: TokenAuthority,
                store: any ChannelStore, maxStreams: Int, registry: PrometheusCollectorRegistry, logger: Logger,
                onListening: @escaping @Sendable (Int) async -> Void) throws {
        forwarding = (store as? PostgresChannelStore).map { ClusterDevicePushes(store: $0) }
        let gauge = registry.makeGauge(descriptor: MetricNameDescriptor(
            namespace: "squelch", metricName: "device_push_streams", unitName: "",
            helpText: "Device push streams open now: sleeping devices of the device kind that a burst can wake."))
        subscriptions = DevicePushSubscriptions { gauge.set(Int64($0)) }
        self.maxStreams = maxStreams
        self.host = host
        self.port = port
        self.tokens = tokens
        self.store = store
        self.logger = logger
        self.onListening = onListening
        // From the identity the voice transport serves, so both present one certificate.
        let chain = try identity.derChain.map { NIOSSLCertificateSource.certificate(try NIOSSLCertificate(bytes: $0, format: .der)) }
        let key = try NIOSSLPrivateKey(bytes: Array(identity.signingKey.derRepresentation), format: .der)
        tls = TLSConfiguration.makeServerConfiguration(certificateChain: chain, privateKey: .privateKey(key))
    }

    public func run() async throws {
        guard let port = await port() else { return }
        let host = self.host
        let logger = self.logger
        let onListening = self.onListening
        let app = Application(
            router: router(),
            // The idle limit closes connections that never send a request (a stream in progress is
            // not idle), as the admin API's does.
            server: try .tls(AdminAPI.httpServer(), tlsConfiguration: tls),
            configuration: .init(address: .hostname(host, port: port), serverName: "squelchd"),
            onServerRunning: { channel in
                let bound = channel.localAddress?.port ?? 0
                logger.notice("device push service listening on https://\(ServerConfiguration.urlHost(host)):\(bound)")
                await onListening(bound)
            },
            logger: logger)
        // Streams are answers that never end by themselves: a graceful stop ends them, or the
        // server would wait for every sleeping walkie.
        try await withThrowingDiscardingTaskGroup { group in
            group.addTask { await self.keepalives() }
            if let forwarding {
                group.addTask {
                    for await push in forwarding.forwarded() {
                        _ = self.subscriptions.deliver(push.delivery, token: push.token, to: .init(channel: push.channel, user: push.user))
                    }
                }
            }
            try await withGracefulShutdownHandler {
                do {
                    try await app.run()
                } catch where ListenError.isBindFailure(error) {
                    throw ListenError.devicePush(host: host, port: port, error)
                }
            } onGracefulShutdown: {
                self.subscriptions.closeAll()
            }
            group.cancelAll()
        }
    }

    /// A keepalive on every stream (a device takes a silent one for dead), and expired streams ended.
    private func keepalives() async {
        while (try? await Task.sleep(for: .seconds(DevicePushProtocol.keepaliveSeconds))) != nil {
            subscriptions.tick(now: Date())
        }
    }

    /// What became of a push.
    enum Delivery: Equatable {
        case local(DevicePushSubscriptions.Outcome)
        /// Handed to the cluster's other nodes: the stream is on one of them, or nowhere.
        case forwarded
    }

    /// Hands a push to its device's stream here, or to the other nodes when it has none here.
    func deliver(_ notification: PushToTalkNotification, to member: MemberRecord) async -> Delivery {
        let body: [UInt8]
        do { body = try notification.jsonBody() } catch {
            // A speaker's name is at most a few hundred bytes: the body can't outgrow 4 KB.
            return .local(.notConnected)
        }
        let delivery = DevicePushDelivery(id: notification.id.lowercaseString, body: String(decoding: body, as: UTF8.self))
        let token = notification.deviceToken.lowercased()
        let outcome = subscriptions.deliver(delivery, token: token, to: .init(channel: notification.channel, user: member.userID))
        guard outcome == .notConnected, let forwarding else { return .local(outcome) }
        do {
            try await forwarding.forward(delivery, token: token, channel: notification.channel, user: member.userID)
            return .forwarded
        } catch {
            logger.warning("device push not forwarded to the other nodes: the database did not take it",
                           metadata: ["channel": "\(notification.channel)", "error": "\(error)"])
            return .local(.notConnected)
        }
    }

    // MARK: The stream

    private struct Failure: Encodable { var error: String }

    private func router() -> Router<BasicRequestContext> {
        let router = Router()
        router.get(RouterPath(DevicePushProtocol.streamPath)) { request, _ in
            await self.stream(request)
        }
        return router
    }

    private func stream(_ request: Request) async -> Response {
        guard let authorization = request.headers[.authorization], authorization.hasPrefix("Bearer ") else {
            return Self.failure(.unauthorized, "no participant token: send it as Authorization: Bearer <token>, the token the device joins the channel with")
        }
        let participantToken = String(authorization.dropFirst("Bearer ".count)).trimmingCharacters(in: .whitespaces)
        let pushToken = (request.uri.queryParameters.get("token") ?? "").lowercased()
        guard APNsRequest.isValidDeviceToken(pushToken) else {
            return Self.failure(.badRequest, "'\(pushToken.prefix(80))' is not a push token: give ?token= as hex, 2-200 digits")
        }
        let channel: UUID
        do throws(TokenError) { channel = try await tokens.inspect(participantToken).channel } catch {
            return Self.failure(.unauthorized, error.description)
        }
        let claims: ParticipantClaims
        switch await HubDriver.check(participantToken, channel: channel, with: tokens, store: store, logger: logger) {
        case .success(let checked):
            claims = checked.claims
        case .failure(let refusal):
            let status: HTTPResponse.Status = switch refusal.code {
            case .internalError: .serviceUnavailable
            case .tokenRevoked, .channelNotFound: .forbidden
            default: .unauthorized
            }
            return Self.failure(status, refusal.reason)
        }
        let owner = DevicePushSubscriptions.Owner(channel: channel, user: claims.userID)
        guard subscriptions.count < maxStreams else {
            logger.warning("device push stream refused: the most streams this server takes are open",
                           metadata: ["maxStreams": "\(maxStreams)"])
            return Self.failure(.serviceUnavailable, "the server holds the most push streams it takes (\(maxStreams)); try again later")
        }
        switch subscriptions.subscribe(token: pushToken, owner: owner, expiresAt: claims.expiresAt) {
        case .closed:
            return Self.failure(.serviceUnavailable, "the server is stopping; open the stream again in a moment")
        case .heldByAnother:
            logger.warning("device push stream refused: its push token is another member's", metadata: [
                "channel": "\(channel)", "user": "\(claims.userID)",
            ])
            return Self.failure(.conflict, "this push token is another member's stream; make a new random one")
        case .opened(_, let lines):
            logger.debug("device push stream opened", metadata: ["channel": "\(channel)", "user": "\(claims.userID)"])
            let first = DevicePushSubscribed(subscribed: pushToken, channel: channel, user: claims.userID, expiresAt: claims.expiresAt)
            return Response(status: .ok, headers: [.contentType: "application/x-ndjson"], body: ResponseBody { writer in
                try await writer.write(Self.line(first))
                for await line in lines {
                    switch line {
                    case .push(let delivery): try await writer.write(Self.line(delivery))
                    case .keepalive: try await writer.write(ByteBuffer(string: "\n"))
                    }
                }
                try await writer.finish(nil)
            })
        }
    }

    private static func line(_ value: some Encodable) -> ByteBuffer {
        // Our own types always encode.
        var buffer = ByteBuffer(data: (try? DevicePushProtocol.encoder().encode(value)) ?? Data("{}".utf8))
        buffer.writeString("\n")
        return buffer
    }

    private static func failure(_ status: HTTPResponse.Status, _ message: String) -> Response {
        Response(status: status, headers: [.contentType: "application/json"], body: ResponseBody(byteBuffer: line(Failure(error: message))))
    }
}
