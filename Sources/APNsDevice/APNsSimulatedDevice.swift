import Foundation
import NIOCore
import NIOHTTP1
import NIOPosix

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
        let channel = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .connectTimeout(.seconds(5))
            .connect(host: host, port: controlPort) { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHTTPClientHandlers()
                    return try NIOAsyncChannel<HTTPClientResponsePart, HTTPClientRequestPart>(wrappingChannelSynchronously: channel)
                }
            }
        let (pushes, pushContinuation) = AsyncThrowingStream.makeStream(of: APNsDeliveredPush.self)
        let (ready, readyContinuation) = AsyncThrowingStream.makeStream(of: Void.self)

        let reader = Task {
            do {
                try await channel.executeThenClose { inbound, outbound in
                    var head = HTTPRequestHead(version: .http1_1, method: .GET, uri: "/v1/devices/\(token)/stream")
                    head.headers.add(name: "host", value: "\(host):\(controlPort)")
                    head.headers.add(name: "accept", value: "application/x-ndjson")
                    try await outbound.write(.head(head))
                    try await outbound.write(.end(nil))

                    var status: HTTPResponseStatus = .ok
                    var errorBody = ""
                    var lines = NDJSONLineSplitter()
                    var subscribed = false
                    let decoder = APNsSimulatorJSON.decoder()
                    parts: for try await part in inbound {
                        switch part {
                        case .head(let response):
                            status = response.status
                        case .body(let buffer) where status != .ok:
                            errorBody += String(buffer: buffer)
                        case .body(let buffer):
                            for line in lines.append(buffer.readableBytesView) where !line.isEmpty {
                                if subscribed {
                                    pushContinuation.yield(try decoder.decode(APNsDeliveredPush.self, from: Data(line)))
                                } else {
                                    let first = try decoder.decode(Subscribed.self, from: Data(line))
                                    guard first.subscribed == token else {
                                        throw APNsSimulatedDeviceError.unexpectedResponse("subscribed to '\(first.subscribed)' instead of '\(token)'")
                                    }
                                    subscribed = true
                                    readyContinuation.yield()
                                    readyContinuation.finish()
                                }
                            }
                        case .end:
                            break parts
                        }
                    }
                    if status != .ok {
                        throw APNsSimulatedDeviceError.refused(status: Int(status.code), message: errorBody)
                    }
                    if !subscribed {
                        throw APNsSimulatedDeviceError.unexpectedResponse("the stream ended before the subscription was confirmed")
                    }
                }
                pushContinuation.finish()
                readyContinuation.finish(throwing: CancellationError())
            } catch {
                pushContinuation.finish(throwing: error)
                readyContinuation.finish(throwing: error)
            }
        }
        pushContinuation.onTermination = { _ in reader.cancel() }

        do {
            try await withTaskCancellationHandler {
                for try await _ in ready { return }
                throw CancellationError()
            } onCancel: {
                reader.cancel()
            }
        } catch {
            reader.cancel()
            throw error
        }
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

/// Cuts a byte stream into lines at `\n`, keeping a partial line until the rest of it arrives (HTTP
/// chunks and TCP reads don't respect line ends).
public struct NDJSONLineSplitter {
    public init() {}

    private var pending: [UInt8] = []

    /// The lines completed by `bytes`, without their `\n` (and without a `\r` before it).
    public mutating func append(_ bytes: some Collection<UInt8>) -> [[UInt8]] {
        var lines: [[UInt8]] = []
        for byte in bytes {
            if byte == UInt8(ascii: "\n") {
                if pending.last == UInt8(ascii: "\r") { pending.removeLast() }
                lines.append(pending)
                pending.removeAll(keepingCapacity: true)
            } else {
                pending.append(byte)
            }
        }
        return lines
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
