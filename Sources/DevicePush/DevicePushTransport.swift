import ChannelProtocol
import Foundation
import NIOCore
import NIOSSL
import PTTClient
import PushStream

/// Pushes from squelchd's own device push service, for a device Apple doesn't serve (a Linux
/// walkie), wherever it is: the device makes up a 32-byte token, as iOS hands out opaque ones, and
/// holds an HTTPS stream open to the channel's server for it (`DevicePushProtocol`), opened with its
/// participant token and checked against the CA it joins with. The token is of the `device` kind, so
/// the server hands its pushes to that stream instead of APNs.
public struct DevicePushTransport: PushTransport {
    /// The service's TCP port; nil: the voice port's number, squelchd's default.
    public var port: Int?

    public init(port: Int? = nil) {
        self.port = port
    }

    public var environment: PushEnvironment { .device }
    public var followsChannelServer: Bool { true }

    /// Without a channel there is no server to ask, nor a participant token to ask with.
    public func register(token: Data?) async throws -> (token: Data, pushes: AsyncThrowingStream<IncomingPush, any Error>) {
        throw DevicePushError.noChannel
    }

    public func register(token: Data?, for channel: PushChannel?) async throws -> (token: Data, pushes: AsyncThrowingStream<IncomingPush, any Error>) {
        do {
            return try await open(token: token ?? Self.newToken(), for: channel)
        } catch DevicePushError.refused(409, _) where token != nil {
            // Another member's stream holds the token (it could only have learnt it from this
            // device): a new one, which the channel manager announces, ends the contest.
            return try await open(token: Self.newToken(), for: channel)
        }
    }

    private func open(token: Data, for channel: PushChannel?) async throws -> (token: Data, pushes: AsyncThrowingStream<IncomingPush, any Error>) {
        guard let credentials = channel?.credentials else { throw DevicePushError.noChannel }
        let hex = token.map { String(format: "%02x", $0) }.joined()
        let port = self.port ?? credentials.port
        let request = LineStream.Request(
            host: credentials.host, port: port, path: DevicePushProtocol.path(token: hex),
            headers: [("authorization", "Bearer \(credentials.token)")],
            tls: try Self.tls(credentials),
            silenceLimit: .seconds(DevicePushProtocol.silenceLimitSeconds))
        let first: [UInt8]
        let lines: AsyncThrowingStream<[UInt8], any Error>
        do {
            (first, lines) = try await LineStream.open(request)
        } catch {
            throw DevicePushError.describe(error, address: credentials.host.contains(":") ? "[\(credentials.host)]:\(port)" : "\(credentials.host):\(port)")
        }
        let decoder = DevicePushProtocol.decoder()
        guard let subscribed = try? decoder.decode(DevicePushSubscribed.self, from: Data(first)), subscribed.subscribed == hex else {
            throw DevicePushError.unexpected("the server did not confirm the push token's stream: \(String(decoding: first.prefix(200), as: UTF8.self))")
        }
        // The server ends a stream at the participant token's expiry, or when it stops: the channel
        // manager opens another, with the token it has then.
        let pushes = IncomingPush.relay(lines) { line -> IncomingPush? in
            guard let delivery = try? decoder.decode(DevicePushDelivery.self, from: Data(line)) else { return nil }
            // A body that is not a JSON object is still a push the app must answer; it gets an empty payload.
            return IncomingPush(payload: PushValue.payload(from: Data(delivery.body.utf8)) ?? [:], isHighPriority: delivery.priority >= 10)
        }
        return (token, pushes)
    }

    public func unregister(token: Data) async {}

    /// The CA the channel's voice transport is checked against, and its name (an IP address is
    /// checked against the certificate's IP entries instead, and sent as no name).
    public static func tls(_ credentials: ChannelCredentials) throws -> LineStream.TLS {
        var configuration = TLSConfiguration.makeClientConfiguration()
        do {
            configuration.trustRoots = .certificates(try NIOSSLCertificate.fromPEMFile(credentials.caPath))
        } catch {
            throw DevicePushError.unexpected("can't read the CA file \(credentials.caPath) for the device push service: \(error)")
        }
        let name = credentials.serverName ?? credentials.host
        let isAddress = (try? SocketAddress(ipAddress: name, port: 0)) != nil
        return LineStream.TLS(context: try NIOSSLContext(configuration: configuration), serverHostname: isAddress ? nil : name)
    }
}

/// Why the device push stream could not be opened, or ended, in words for the user.
public enum DevicePushError: Error, Sendable, Equatable, CustomStringConvertible {
    case noChannel
    /// The service refused the stream: HTTP status and its message.
    case refused(status: Int, message: String)
    case unreachable(String)
    case unexpected(String)

    public var description: String {
        switch self {
        case .noChannel: "device pushes need the channel's server and participant token; register through the channel manager"
        case .refused(let status, let message): "the device push service refused the stream (HTTP \(status)): \(message)"
        case .unreachable(let why): why
        case .unexpected(let why): why
        }
    }

    static func describe(_ error: any Error, address: String) -> DevicePushError {
        switch error {
        case LineStreamError.refused(let status, let body):
            struct Failure: Decodable { var error: String }
            let message = (try? JSONDecoder().decode(Failure.self, from: Data(body.utf8)).error) ?? body
            return .refused(status: status, message: message)
        case let error as NIOSSLError:
            return .unreachable("the device push service at \(address) failed the TLS handshake (\(error)); is its certificate signed by --ca and issued for this address?")
        case let error as BoringSSLError:
            return .unreachable("the device push service at \(address) has a certificate this device does not trust (\(error)); pass the CA that signed squelchd's certificate with --ca, and use an address the certificate names")
        default:
            let text = "\(error)"
            if text.contains("connectionRefused") || text.contains("Connection refused") || text.contains("SingleConnectionFailure") || text.contains("connectTimeout") {
                return .unreachable("nothing answers at \(address) for device pushes; is squelchd's device push service on there (--device-push-port)?")
            }
            return .unexpected("the device push stream to \(address) failed: \(text.prefix(160))")
        }
    }
}
