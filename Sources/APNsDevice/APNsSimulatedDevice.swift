import Foundation
import PushStream

// The device side of the APNs simulator, in a module of its own so that a client (PTTClient, walkie)
// can receive simulated pushes without linking the simulator's HTTP/2 and admin servers.

/// A simulated device: subscribes to one token on the control port and receives each accepted push for it.
public enum APNsSimulatedDevice {
    /// Returns once the subscription is live (so a push sent after this returns is delivered).
    ///
    /// The stream ends when the simulator stops, and throws if the connection breaks. Ending the
    /// iteration (or dropping the stream) closes the connection.
    public static func subscribe(host: String, controlPort: Int, token: String) async throws -> AsyncThrowingStream<APNsDeliveredPush, any Error> {
        let token = token.lowercased()
        let (first, lines): ([UInt8], AsyncThrowingStream<[UInt8], any Error>)
        do {
            (first, lines) = try await LineStream.open(LineStream.Request(host: host, port: controlPort, path: "/v1/devices/\(token)/stream"))
        } catch LineStreamError.refused(let status, let body) {
            throw APNsSimulatedDeviceError.refused(status: status, message: body)
        } catch LineStreamError.endedBeforeFirstLine {
            throw APNsSimulatedDeviceError.unexpectedResponse("the stream ended before the subscription was confirmed")
        }
        let decoder = APNsSimulatorJSON.decoder()
        let subscribed = try decoder.decode(Subscribed.self, from: Data(first))
        guard subscribed.subscribed == token else {
            throw APNsSimulatedDeviceError.unexpectedResponse("subscribed to '\(subscribed.subscribed)' instead of '\(token)'")
        }
        let (pushes, continuation) = AsyncThrowingStream.makeStream(of: APNsDeliveredPush.self)
        let relay = Task {
            do {
                for try await line in lines { continuation.yield(try decoder.decode(APNsDeliveredPush.self, from: Data(line))) }
                continuation.finish()
            } catch {
                continuation.finish(throwing: error)
            }
        }
        continuation.onTermination = { _ in relay.cancel() }
        return pushes
    }

    private struct Subscribed: Decodable { var subscribed: String }
}

/// Why a device subscription failed.
public enum APNsSimulatedDeviceError: Error, CustomStringConvertible, Sendable, Equatable {
    /// The control API answered with an error status (its `{"error"}` body is the message).
    case refused(status: Int, message: String)
    case unexpectedResponse(String)

    public var description: String {
        switch self {
        case .refused(let status, let message): "the APNs simulator refused the device subscription (\(status)): \(message)"
        case .unexpectedResponse(let what): "unexpected answer to a device subscription: \(what)"
        }
    }
}

/// What a simulated device receives for each push accepted for its token.
public struct APNsDeliveredPush: Codable, Sendable, Equatable {
    public var apnsID: String
    public var topic: String
    /// The body as sent.
    public var body: String
    public var receivedAt: Date
    /// `apns-priority` as sent (APNs' default, 10, when the header was absent: nil).
    public var priority: Int?

    public init(apnsID: String, topic: String, body: String, receivedAt: Date, priority: Int? = nil) {
        self.apnsID = apnsID
        self.topic = topic
        self.body = body
        self.receivedAt = receivedAt
        self.priority = priority
    }
}

/// The JSON the control API speaks: ISO 8601 dates with milliseconds, sorted keys.
public enum APNsSimulatorJSON {
    /// Dates are kept to the millisecond everywhere, so that they survive a trip through JSON unchanged.
    public static func normalized(_ date: Date) -> Date {
        Date(timeIntervalSince1970: (date.timeIntervalSince1970 * 1000).rounded() / 1000)
    }

    public static func encoder() -> JSONEncoder {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        encoder.dateEncodingStrategy = .custom { date, encoder in
            var container = encoder.singleValueContainer()
            try container.encode(normalized(date).formatted(Date.ISO8601FormatStyle(includingFractionalSeconds: true)))
        }
        return encoder
    }

    public static func decoder() -> JSONDecoder {
        let decoder = JSONDecoder()
        decoder.dateDecodingStrategy = .custom { decoder in
            let container = try decoder.singleValueContainer()
            let text = try container.decode(String.self)
            let style = Date.ISO8601FormatStyle(includingFractionalSeconds: true)
            if let date = try? style.parse(text) { return normalized(date) }
            if let date = try? Date.ISO8601FormatStyle().parse(text) { return date }
            throw DecodingError.dataCorruptedError(in: container, debugDescription: "'\(text)' is not an ISO 8601 date")
        }
        return decoder
    }
}
