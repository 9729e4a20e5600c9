import ChannelProtocol
import Foundation

/// One push as it reached the device.
public struct IncomingPush: Sendable, Equatable {
    /// The JSON body.
    public var payload: [String: PushValue]
    /// `apns-priority` 10 (true) or lower.
    public var isHighPriority: Bool
    public var receivedAt: Date

    public init(payload: [String: PushValue], isHighPriority: Bool = true, receivedAt: Date = Date()) {
        self.payload = payload
        self.isHighPriority = isHighPriority
        self.receivedAt = receivedAt
    }

    /// A service update (`{"aps":{"ptt-push-type":"service-update"}}`) goes to
    /// `incomingServiceUpdatePush`, not `incomingPushResult`.
    public var isServiceUpdate: Bool { payload.isServiceUpdatePayload }
}

extension IncomingPush {
    /// A transport's pushes from what its connection carries: each element made a push by `push`
    /// (nil skips it), ending as `elements` ends and throwing what it throws. Dropping the stream
    /// stops the reading.
    public static func relay<Elements: AsyncSequence & Sendable>(
        _ elements: Elements, _ push: @escaping @Sendable (Elements.Element) throws -> IncomingPush?
    ) -> AsyncThrowingStream<IncomingPush, any Error> where Elements.Element: Sendable {
        let (pushes, continuation) = AsyncThrowingStream.makeStream(of: IncomingPush.self)
        let relay = Task {
            do {
                for try await element in elements {
                    if let push = try push(element) { continuation.yield(push) }
                }
                continuation.finish()
            } catch {
                continuation.finish(throwing: error)
            }
        }
        continuation.onTermination = { _ in relay.cancel() }
        return pushes
    }
}

/// Where the device's ephemeral push tokens and its pushes come from. On iOS this is the system; on
/// Linux, `DevicePushTransport` (the DevicePush module: squelchd's own device push service), or
/// `SimulatedPushTransport` (the SimulatedPush module: the APNs simulator's device stream). Apps can
/// plug in their own.
public protocol PushTransport: Sendable {
    /// Who delivers the tokens' pushes; the server routes each push by it (an APNs host, or its own
    /// device push service).
    var environment: PushEnvironment { get }
    /// Starts receiving pushes for `token` (a fresh one when nil) and returns the token. Pushes arrive
    /// on `pushes` until `unregister` or the transport fails (the stream then throws).
    func register(token: Data?) async throws -> (token: Data, pushes: AsyncThrowingStream<IncomingPush, any Error>)
    /// The same, for the channel the token is for. The channel manager calls this one; a transport
    /// that takes its pushes from the channel's own server (`DevicePushTransport`) needs its address
    /// and participant token. By default it is `register(token:)`.
    func register(token: Data?, for channel: PushChannel?) async throws -> (token: Data, pushes: AsyncThrowingStream<IncomingPush, any Error>)
    /// Stops delivery for a token that died with its channel.
    func unregister(token: Data) async
    /// Whether pushes come from the channel's own server, so that the stream must move when the
    /// voice connection does (a cluster's home node). False by default.
    var followsChannelServer: Bool { get }
}

extension PushTransport {
    public var followsChannelServer: Bool { false }

    /// A fresh ephemeral token: 32 random bytes, as opaque as the ones iOS hands out.
    public static func newToken() -> Data { Data((0..<32).map { _ in UInt8.random(in: 0...255) }) }

    public func register(token: Data?, for channel: PushChannel?) async throws -> (token: Data, pushes: AsyncThrowingStream<IncomingPush, any Error>) {
        try await register(token: token)
    }
}

/// The channel a push token is registered for, as its session knows it now: the server's address,
/// the CA that signs its certificate, and the participant token (renewed ones included).
public struct PushChannel: Sendable, Equatable {
    public var id: UUID
    public var credentials: ChannelCredentials

    public init(id: UUID, credentials: ChannelCredentials) {
        self.id = id
        self.credentials = credentials
    }
}

/// Apple's budget for high-priority service-update pushes: six in a fixed hour that starts with the
/// first counted push, as Apple documents it. Sans-I/O: the caller passes the time.
public struct ServiceUpdateBudget: Sendable, Equatable {
    public static let perHour = 6
    private(set) var windowStart: Date?
    private(set) var used = 0

    public init() {}

    /// Counts one push and returns the budget left after it (never below zero). Low-priority pushes are
    /// not budgeted.
    public mutating func spend(highPriority: Bool, at now: Date) -> Int {
        if let start = windowStart, now.timeIntervalSince(start) >= 3600 || now < start {
            windowStart = nil
            used = 0
        }
        guard highPriority else { return remaining }
        if windowStart == nil { windowStart = now }
        used += 1
        return remaining
    }

    public var remaining: Int { max(0, Self.perHour - used) }
}
