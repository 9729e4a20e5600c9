import ChannelProtocol
import Foundation
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import Wire
import WireNIO

/// A scripted channel member for tests and benchmarks: a real `WireClientChannel` on a real UDP
/// socket, speaking the control protocol with `MessageCodec`. Everything the server sends is kept,
/// so a test can wait for a message or for audio without racing the stream.
public final class TestMember: Sendable {
    public let client: WireClientChannel
    let state = NIOLockedValueBox(State())
    let codec = MessageCodec()

    struct State {
        var messages: [ServerMessage] = []
        /// When each message was taken off the stream (`WireNIO.now()` nanoseconds), same indices.
        var messageArrivals: [UInt64] = []
        var undecodable = 0
        var audio: [[UInt8]] = []
        var audioArrivals: [UInt64] = []
        /// Audio datagrams received, kept or not.
        var audioCount = 0
        var events: [ClientEvent] = []
    }

    /// `group`: where the member's event loop comes from. A benchmark gives the member it measures a
    /// loop of its own, as its own device would have, rather than one it shares with a hundred others.
    /// `keepsAudio`: false only counts audio (`audioCount`), for runs too long to keep every datagram.
    public init(port: Int, configuration: ClientConfiguration, host: String = "127.0.0.1",
                group: any EventLoopGroup = MultiThreadedEventLoopGroup.singleton, options: UDPOptions = UDPOptions(),
                keepsAudio: Bool = true) throws {
        let state = self.state
        let codec = self.codec
        // Messages and audio are kept on the event loop as they are opened, so their arrival times
        // are the packets', not those of a task the cooperative pool got round to (the fan-out
        // benchmark's grant and delivery times are read from them).
        client = try WireClientChannel(
            configuration: configuration, server: try SocketAddress(ipAddress: host, port: port), options: options, group: group,
            onDatagram: { bytes in
                guard keepsAudio else {
                    state.withLockedValue { $0.audioCount += 1 }
                    return
                }
                let now = WireNIO.now().nanoseconds
                let datagram = Array(bytes)
                state.withLockedValue {
                    $0.audio.append(datagram)
                    $0.audioArrivals.append(now)
                    $0.audioCount += 1
                }
            },
            onEvent: { event in
                let now = WireNIO.now().nanoseconds
                guard case .connection(.control(let bytes)) = event else {
                    state.withLockedValue { $0.events.append(event) }
                    return
                }
                let decoded = try? codec.decodeServerMessage(bytes)
                state.withLockedValue { state in
                    if let decoded {
                        state.messages.append(decoded)
                        state.messageArrivals.append(now)
                    } else {
                        state.undecodable += 1
                    }
                }
            })
    }

    public func connect() async throws { try await client.connect() }

    public func send(_ message: ClientMessage) async throws { try await client.send(control: codec.encode(message)) }

    /// Joins and waits for the answer: `joined`, `refused`, or a cluster's `redirect` (nil: none in time).
    @discardableResult
    public func join(token: String, channel: UUID, reason: JoinReason = .developerRequest, seconds: Double = 10) async throws -> ServerMessage? {
        let before = messages.count
        try await send(.join(token: token, channel: channel, reason: reason))
        return await waitFor(after: before, seconds: seconds) {
            switch $0 {
            case .joined, .refused, .redirect: return true
            default: return false
            }
        }
    }

    /// Sends one audio datagram.
    @discardableResult
    public func sendAudio(burst: UInt16, sequence: UInt16, payload: [UInt8], flags: AudioHeader.Flags = []) async -> Bool {
        await client.send(datagram: AudioHeader(flags: flags, burst: burst, sequence: sequence).datagram(payload: payload))
    }

    public var messages: [ServerMessage] { state.withLockedValue { $0.messages } }
    public var audio: [[UInt8]] { state.withLockedValue { $0.audio } }
    public var audioCount: Int { state.withLockedValue { $0.audioCount } }
    /// Messages with the time each arrived (`WireNIO.now()` nanoseconds), for latency measurements.
    public var timedMessages: [(message: ServerMessage, at: UInt64)] {
        state.withLockedValue { state in Array(zip(state.messages, state.messageArrivals)).map { ($0, $1) } }
    }
    /// Audio datagrams with the time each arrived.
    public var timedAudio: [(datagram: [UInt8], at: UInt64)] {
        state.withLockedValue { state in Array(zip(state.audio, state.audioArrivals)).map { ($0, $1) } }
    }
    public var events: [ClientEvent] { state.withLockedValue { $0.events } }

    /// The first message from index `after` on that matches, waiting up to `seconds`.
    public func waitFor(after: Int = 0, seconds: Double = 10, _ match: (ServerMessage) -> Bool) async -> ServerMessage? {
        let deadline = Date().addingTimeInterval(seconds)
        repeat {
            let snapshot = messages
            if after < snapshot.count, let found = snapshot[after...].first(where: match) { return found }
            try? await Task.sleep(for: .milliseconds(5))
        } while Date() < deadline
        return nil
    }

    /// A floor event of `kind` (from index `after` on).
    public func waitForFloor(_ kind: FloorEventKind, after: Int = 0, seconds: Double = 10) async -> FloorEvent? {
        let message = await waitFor(after: after, seconds: seconds) {
            if case .floor(let event) = $0, event.kind == kind { return true } else { return false }
        }
        if case .floor(let event)? = message { return event }
        return nil
    }

    /// Waits until at least `count` audio datagrams arrived; returns them all.
    public func waitForAudio(count: Int, seconds: Double = 10) async -> [[UInt8]] {
        let deadline = Date().addingTimeInterval(seconds)
        repeat {
            let snapshot = audio
            if snapshot.count >= count { return snapshot }
            try? await Task.sleep(for: .milliseconds(5))
        } while Date() < deadline
        return audio
    }

    /// Waits for a transport event matching `match`.
    public func waitForEvent(seconds: Double = 10, _ match: (ClientEvent) -> Bool) async -> ClientEvent? {
        let deadline = Date().addingTimeInterval(seconds)
        repeat {
            if let found = events.first(where: match) { return found }
            try? await Task.sleep(for: .milliseconds(5))
        } while Date() < deadline
        return nil
    }

    /// Closes the connection with an application close `code` (0, `normal`: on purpose).
    public func close(code: UInt64 = 0) async { await client.close(code: code) }
}
