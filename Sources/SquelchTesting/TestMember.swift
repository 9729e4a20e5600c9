import ChannelProtocol
import Foundation
import MediaFrames
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
    /// Whether audio is kept (`audio`, `timedAudio`) or only counted.
    public let keepsAudio: Bool
    let state = NIOLockedValueBox(State())
    let codec = MessageCodec()
    /// The bursts' keys from the server: audio is kept opened (header and Opus payload), as sent.
    let keyring = MediaKeyring()

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
        /// The SFrame counter of this member's next sealed frame.
        var sealCounter: UInt64 = 0
    }

    /// `group`: where the member's event loop comes from. A benchmark gives the member it measures a
    /// loop of its own, as its own device would have, rather than one it shares with a hundred others.
    /// `keepsAudio`: false only counts audio (`audioCount`), for runs too long to keep every datagram.
    public init(port: Int, configuration: ClientConfiguration, host: String = "127.0.0.1",
                group: any EventLoopGroup = MultiThreadedEventLoopGroup.singleton, options: UDPOptions = UDPOptions(),
                keepsAudio: Bool = true) throws {
        self.keepsAudio = keepsAudio
        let state = self.state
        let codec = self.codec
        let keyring = self.keyring
        @Sendable func keep(_ bytes: UnsafeRawBufferPointer) {
            if let key = MediaKey(datagram: bytes) {
                for datagram in keyring.add(key) { datagram.withUnsafeBytes { keep($0) } }
                return
            }
            let now = WireNIO.now().nanoseconds
            keyring.open(bytes, now: now) { header, payload in
                guard keepsAudio else {
                    state.withLockedValue { $0.audioCount += 1 }
                    return
                }
                let datagram = header.datagram(payload: payload)
                state.withLockedValue {
                    $0.audio.append(datagram)
                    $0.audioArrivals.append(now)
                    $0.audioCount += 1
                }
            }
        }
        // Messages and audio are kept on the event loop as they are opened, so their arrival times
        // are the packets', not those of a task the cooperative pool got round to (the fan-out
        // benchmark's grant and delivery times are read from them).
        client = try WireClientChannel(
            configuration: configuration, server: try SocketAddress(ipAddress: host, port: port), options: options, group: group,
            onDatagram: { bytes in keep(bytes) },
            onEvent: { event in
                let now = WireNIO.now().nanoseconds
                guard case .connection(.control(let bytes)) = event else {
                    state.withLockedValue { $0.events.append(event) }
                    return
                }
                let decoded = try? codec.decodeServerMessage(bytes)
                if case .mediaKey(let key)? = decoded {
                    for datagram in keyring.add(key) { datagram.withUnsafeBytes { keep($0) } }
                }
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
        return await waitFor(after: before, seconds: seconds, Self.answersAJoin)
    }

    /// `joined`, `refused`, or a cluster's `redirect`.
    static func answersAJoin(_ message: ServerMessage) -> Bool {
        switch message {
        case .joined, .refused, .redirect: return true
        default: return false
        }
    }

    /// After `connect` with an entry pass in the configuration: the answer to the join the pass
    /// carried, sent by the server with its handshake flight. Nil when the server did not take the
    /// pass (join as usual then), or gave no answer in time.
    public func entered(seconds: Double = 10) async -> ServerMessage? {
        guard events.contains(.entered) else { return nil }
        return await waitFor(seconds: seconds, Self.answersAJoin)
    }

    /// Sends one audio datagram, sealed with the newest key the server gave for this member's
    /// `burst` (docs/protocol.md §16.4.5). Without one (no grant, or a test sending where it may not),
    /// with a key of its own under key ID 0, which the server never hands out.
    @discardableResult
    public func sendAudio(burst: UInt16, sequence: UInt16, payload: [UInt8], flags: AudioHeader.Flags = []) async -> Bool {
        await client.send(datagram: sealedAudio(burst: burst, sequence: sequence, payload: payload, flags: flags))
    }

    /// The datagram `sendAudio` sends.
    public func sealedAudio(burst: UInt16, sequence: UInt16, payload: [UInt8], flags: AudioHeader.Flags = []) -> [UInt8] {
        let key = mediaKey(burst: burst) ?? MediaKey(slot: 0, burst: burst, keyID: 0, key: [UInt8](repeating: 0x5A, count: MediaKey.keyLength))
        let counter = state.withLockedValue { state in
            defer { state.sealCounter += 1 }
            return state.sealCounter
        }
        var datagram = [UInt8](repeating: 0, count: AudioHeader.size + AudioHeader.maxPayload)
        let length = datagram.withUnsafeMutableBytes { buffer in
            payload.withUnsafeBytes {
                MediaSealer(counter: counter).seal(AudioHeader(flags: flags, burst: burst, sequence: sequence), payload: $0, key: key, into: buffer)
            }
        }
        return Array(datagram[..<(length ?? 0)])
    }

    /// The newest key the server gave this member for its own `burst`, in its current session.
    public func mediaKey(burst: UInt16) -> MediaKey? {
        let snapshot = messages
        let sessionStart = snapshot.lastIndex { if case .joined = $0 { true } else { false } } ?? 0
        guard case .joined(_, let you, _, _, _)? = snapshot.indices.contains(sessionStart) ? snapshot[sessionStart] : nil else { return nil }
        for message in snapshot[sessionStart...].reversed() {
            if case .mediaKey(let key) = message, key.slot == you, key.burst == burst { return key }
        }
        return nil
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
