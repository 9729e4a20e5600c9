import APNsDevice
import Foundation
import Hummingbird
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import NIOSSL

/// Where a started simulator listens (the bound ports, useful when the configuration asked for 0).
public struct APNsSimulatorEndpoints: Sendable, Equatable {
    /// APNs: HTTP/2 over TLS.
    public var port: Int
    /// Control API: plain HTTP/1.1.
    public var controlPort: Int

    public init(port: Int, controlPort: Int) {
        self.port = port
        self.controlPort = controlPort
    }
}

/// A local APNs that answers as Apple's does, for the wake path on Linux (issue 5).
///
/// The APNs port speaks HTTP/2 over TLS with ALPN `h2` only. Each connection starts with
/// MAX_CONCURRENT_STREAMS 1 and gets `maxConcurrentStreams` after its first valid JWT. Requests are
/// checked in Apple's order: method, path and token, repeated headers, provider token, push type,
/// topic, priority, expiration, `apns-id`, collapse id, body (`APNsRequestValidator`). A valid request
/// then meets the fault plan (`APNsFaultPlan`), and if none applies is answered 200, logged and
/// delivered to the simulated devices subscribed to its token (`APNsSimulatedDevice`).
///
/// The control port serves the log, the statistics and the fault plan over HTTP/1.1 JSON:
/// `GET /healthz`, `GET|DELETE /v1/pushes[?token=]`, `GET /v1/rejections`, `GET /v1/stats`,
/// `GET|PUT /v1/faults`, `GET /v1/devices/<token>/stream` (newline-delimited JSON). Dates are ISO 8601
/// with milliseconds (`APNsSimulatorJSON`).
public final class APNsSimulator: Sendable {
    public let configuration: APNsSimulatorConfiguration
    let core: SimulatorCore
    private let tls: NIOSSLContext
    private let lifecycle = NIOLockedValueBox(Lifecycle.idle)

    private enum Lifecycle {
        case idle
        case starting
        case running(apns: any Channel, control: Task<Void, Never>)
        case stopped
    }

    /// Reads the certificate chain and key and checks the configuration; throws `APNsSimulatorError`
    /// saying what is wrong and what to do.
    public init(configuration: APNsSimulatorConfiguration) throws {
        guard (1...1_000_000).contains(configuration.maxConcurrentStreams) else {
            throw APNsSimulatorError.invalidConfiguration("maxConcurrentStreams must be 1…1000000, not \(configuration.maxConcurrentStreams)")
        }
        guard configuration.logCapacity >= 0 else {
            throw APNsSimulatorError.invalidConfiguration("logCapacity must not be negative")
        }
        guard !configuration.providerKeys.isEmpty else {
            throw APNsSimulatorError.invalidConfiguration("no provider keys: every JWT would be refused; load one with APNsProviderKey.load(p8Path:keyID:teamID:)")
        }
        self.configuration = configuration
        tls = try Self.makeTLSContext(chainPath: configuration.certificateChainPath, keyPath: configuration.privateKeyPath)
        core = SimulatorCore(configuration: configuration)
    }

    private static func makeTLSContext(chainPath: String, keyPath: String) throws -> NIOSSLContext {
        for (what, path) in [("TLS certificate chain", chainPath), ("TLS private key", keyPath)]
        where !FileManager.default.isReadableFile(atPath: path) {
            throw APNsSimulatorError.unreadableFile(what: "APNs simulator's \(what)", path: path, underlying: "missing or not readable")
        }
        let chain: [NIOSSLCertificate]
        do { chain = try NIOSSLCertificate.fromPEMFile(chainPath) } catch {
            throw APNsSimulatorError.invalidFile(what: "APNs simulator's TLS certificate chain", path: chainPath, problem: "\(error)")
        }
        guard !chain.isEmpty else {
            throw APNsSimulatorError.invalidFile(what: "APNs simulator's TLS certificate chain", path: chainPath, problem: "no certificate in it")
        }
        let key: NIOSSLPrivateKey
        do { key = try NIOSSLPrivateKey(file: keyPath, format: .pem) } catch {
            throw APNsSimulatorError.invalidFile(what: "APNs simulator's TLS private key", path: keyPath, problem: "\(error)")
        }
        var tls = TLSConfiguration.makeServerConfiguration(certificateChain: chain.map { .certificate($0) }, privateKey: .privateKey(key))
        tls.minimumTLSVersion = .tlsv12
        tls.applicationProtocols = ["h2"]
        do { return try NIOSSLContext(configuration: tls) } catch {
            throw APNsSimulatorError.invalidFile(what: "APNs simulator's TLS certificate and key", path: "\(chainPath), \(keyPath)",
                                                 problem: "they don't make a TLS context (\(error)); do they belong together?")
        }
    }

    /// Binds both ports and starts serving. A simulator starts once.
    public func start() async throws -> APNsSimulatorEndpoints {
        try lifecycle.withLockedValue { state in
            guard case .idle = state else { throw APNsSimulatorError.alreadyStarted }
            state = .starting
        }
        do {
            let verifier = try await JWTKitProviderTokenVerifier.make(configuration.providerKeys)
            let apns = try await APNsHTTP2Listener.bind(core: core, verifier: verifier, tls: tls)
            let control: (task: Task<Void, Never>, port: Int)
            do { control = try await APNsControlAPI.start(core: core) } catch {
                try? await apns.close()
                throw error
            }
            lifecycle.withLockedValue { $0 = .running(apns: apns, control: control.task) }
            let endpoints = APNsSimulatorEndpoints(port: apns.localAddress?.port ?? 0, controlPort: control.port)
            configuration.logger.info("APNs simulator listening", metadata: [
                "apns": "https://\(configuration.host):\(endpoints.port)",
                "control": "http://\(configuration.host):\(endpoints.controlPort)",
            ])
            return endpoints
        } catch {
            lifecycle.withLockedValue { $0 = .stopped }
            throw error
        }
    }

    /// Closes both listeners and every connection; subscribed devices see their streams end. Safe to
    /// call more than once.
    public func stop() async throws {
        let running = lifecycle.withLockedValue { state -> (any Channel, Task<Void, Never>)? in
            defer { state = .stopped }
            if case .running(let apns, let control) = state { return (apns, control) }
            return nil
        }
        guard let (apns, control) = running else { return }
        core.finishSubscribers()
        try? await apns.close()
        for connection in core.openConnections() { try? await connection.close() }
        control.cancel()
        await control.value
    }

    /// Accepted pushes, oldest first (at most `logCapacity`).
    public func acceptedPushes() -> [APNsAcceptedPush] { core.acceptedPushes() }

    /// Rejected requests, oldest first (at most `logCapacity`).
    public func rejections() -> [APNsRejection] { core.rejections() }

    /// Replaces the fault plan; scripted counts and the 503 draw start afresh.
    public func setFaults(_ plan: APNsFaultPlan) { core.setFaults(plan) }

    /// The fault plan as it stands: scripted entries already used up are gone.
    public func faults() -> APNsFaultPlan { core.faults() }

    /// Empties the push and rejection logs and resets the counters (except `connectionsOpen`).
    public func clearLog() { core.clearLog() }

    public func stats() -> APNsSimulatorStats { core.stats() }
}

/// What every connection and the control API share: the logs, the counters, the fault plan and the
/// subscribed devices, behind one lock. Nothing in here does I/O.
final class SimulatorCore: Sendable {
    let configuration: APNsSimulatorConfiguration
    private let state: NIOLockedValueBox<State>

    private struct State: Sendable {
        var pushes: BoundedLog<APNsAcceptedPush>
        var rejections: BoundedLog<APNsRejection>
        var stats = APNsSimulatorStats()
        var faults = FaultInjector()
        var nextConnectionID = 1
        var connections: [Int: any Channel] = [:]
        var nextSubscriberID = 0
        var subscribers: [Int: Subscriber] = [:]
        var subscriptionsClosed = false
    }

    struct Subscriber: Sendable {
        var token: String
        var continuation: AsyncStream<APNsDeliveredPush>.Continuation
    }

    /// What the fault plan says about connection handling, read once per request.
    struct ConnectionFaults {
        var goAwayAfterRequests: Int?
    }

    init(configuration: APNsSimulatorConfiguration) {
        self.configuration = configuration
        state = NIOLockedValueBox(State(pushes: BoundedLog(capacity: configuration.logCapacity),
                                        rejections: BoundedLog(capacity: configuration.logCapacity)))
    }

    /// The configured clock, to the millisecond.
    func now() -> Date { APNsSimulatorJSON.normalized(configuration.now()) }

    // MARK: Connections

    func connectionOpened(_ channel: any Channel) -> Int {
        state.withLockedValue { state in
            let id = state.nextConnectionID
            state.nextConnectionID += 1
            state.connections[id] = channel
            state.stats.connectionsOpened += 1
            state.stats.connectionsOpen += 1
            return id
        }
    }

    func connectionClosed(_ id: Int) {
        state.withLockedValue { state in
            if state.connections.removeValue(forKey: id) != nil { state.stats.connectionsOpen -= 1 }
        }
    }

    func openConnections() -> [any Channel] { state.withLockedValue { Array($0.connections.values) } }

    func noteStreamsInFlight(_ count: Int) {
        state.withLockedValue { $0.stats.maxStreamsInFlight = max($0.stats.maxStreamsInFlight, count) }
    }

    func noteGoAway() { state.withLockedValue { $0.stats.goAwaysSent += 1 } }

    // MARK: Faults

    func setFaults(_ plan: APNsFaultPlan) { state.withLockedValue { $0.faults = FaultInjector(plan: plan) } }

    func faults() -> APNsFaultPlan { state.withLockedValue { $0.faults.plan } }

    func connectionFaults() -> ConnectionFaults {
        state.withLockedValue { ConnectionFaults(goAwayAfterRequests: $0.faults.plan.goAwayAfterRequests) }
    }

    /// The injected answer for a valid request (or nil), and how long to wait before answering.
    func decideFault(token: String) -> (fault: InjectedFault?, delayMilliseconds: Int) {
        state.withLockedValue { state in (state.faults.decide(token: token), state.faults.plan.delayMilliseconds) }
    }

    // MARK: Log

    func record(_ push: APNsAcceptedPush, bodyIsJSONObject: Bool) {
        let delivery = APNsDeliveredPush(apnsID: push.apnsID, topic: push.topic, body: push.body, receivedAt: push.receivedAt,
                                         priority: push.priority)
        let recipients = state.withLockedValue { state -> [AsyncStream<APNsDeliveredPush>.Continuation] in
            state.pushes.append(push)
            state.stats.accepted += 1
            if !bodyIsJSONObject { state.stats.malformedBodies += 1 }
            return state.subscribers.values.filter { $0.token == push.token }.map(\.continuation)
        }
        // Outside the lock: a continuation may run its termination handler, which takes the lock.
        for continuation in recipients { continuation.yield(delivery) }
    }

    func record(_ rejection: APNsRejection) {
        state.withLockedValue { state in
            state.rejections.append(rejection)
            state.stats.rejected += 1
            state.stats.rejectedByReason[rejection.reason, default: 0] += 1
            if rejection.injected { state.stats.injected += 1 }
        }
    }

    func acceptedPushes(token: String? = nil) -> [APNsAcceptedPush] {
        let all = state.withLockedValue { $0.pushes.elements }
        guard let token else { return all }
        return all.filter { $0.token == token }
    }

    func rejections() -> [APNsRejection] { state.withLockedValue { $0.rejections.elements } }

    func clearLog() {
        state.withLockedValue { state in
            state.pushes.removeAll()
            state.rejections.removeAll()
            let open = state.stats.connectionsOpen
            state.stats = APNsSimulatorStats()
            state.stats.connectionsOpen = open
        }
    }

    func stats() -> APNsSimulatorStats { state.withLockedValue { $0.stats } }

    // MARK: Devices

    /// A stream of the pushes accepted for `token` from now on; it ends when the simulator stops.
    func subscribe(token: String) -> AsyncStream<APNsDeliveredPush> {
        let (stream, continuation) = AsyncStream.makeStream(of: APNsDeliveredPush.self, bufferingPolicy: .bufferingNewest(10_000))
        let id = state.withLockedValue { state -> Int? in
            guard !state.subscriptionsClosed else { return nil }
            let id = state.nextSubscriberID
            state.nextSubscriberID += 1
            state.subscribers[id] = Subscriber(token: token, continuation: continuation)
            return id
        }
        guard let id else {
            continuation.finish()
            return stream
        }
        continuation.onTermination = { [weak self] _ in
            self?.state.withLockedValue { _ = $0.subscribers.removeValue(forKey: id) }
        }
        return stream
    }

    func subscriberCount() -> Int { state.withLockedValue { $0.subscribers.count } }

    func finishSubscribers() {
        let all = state.withLockedValue { state in
            state.subscriptionsClosed = true
            return state.subscribers.values.map(\.continuation)
        }
        for continuation in all { continuation.finish() }
    }
}

/// The newest `capacity` elements, in order, without shifting on every append.
struct BoundedLog<Element> {
    let capacity: Int
    private var storage: [Element] = []
    private var start = 0

    init(capacity: Int) { self.capacity = capacity }

    mutating func append(_ element: Element) {
        guard capacity > 0 else { return }
        if storage.count < capacity {
            storage.append(element)
        } else {
            storage[start] = element
            start = (start + 1) % capacity
        }
    }

    var elements: [Element] { Array(storage[start...] + storage[..<start]) }

    mutating func removeAll() {
        storage.removeAll()
        start = 0
    }
}

extension BoundedLog: Sendable where Element: Sendable {}
