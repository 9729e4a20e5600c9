import Foundation
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import NIOSSL

/// A push that APNs accepted.
public struct APNsDelivery: Sendable, Equatable {
    /// The `apns-id` of the request, lowercase.
    public var apnsID: String
    public var attempts: Int
}

/// Sends `pushtotalk` notifications to APNs over a small pool of long-lived HTTP/2 connections.
///
/// Each push follows `APNsDeliveryAttempts`, the sans-I/O failure policy: dead tokens are reported for
/// removal, transient failures are retried with jittered backoff inside a two-second budget, and
/// configuration errors are never retried and are logged once per reason.
public actor APNsClient {
    private enum Slot {
        case empty
        case connecting(Task<HTTP2Connection, any Error>)
        case ready(HTTP2Connection)
        /// The last attempt failed: no new one before `until`. Without the pause, every push of a
        /// burst, and each of its retries, started a TLS handshake of its own while APNs (or the
        /// network, DNS, a proxy) was down: hundreds per burst, which Apple may take for abuse.
        case coolingDown(until: ContinuousClock.Instant, failure: String)
    }

    public let configuration: APNsConfiguration
    private let group: any EventLoopGroup
    private let tls: NIOSSLContext
    private let signer: ProviderTokenSigner
    private let logger: Logger
    private var slots: [Slot]
    /// Failed attempts in a row, per slot: the pause doubles from 0.5 s to 30 s.
    private var failuresInARow: [Int]
    private var nextConnectionID = 0
    private var tokenBackoff = APNsTokenBackoff()
    private var loggedConfigurationErrors: Set<String> = []
    /// Set by the first answer that shows the topic and host are right: from then on APNs's token
    /// verdicts are trusted (`APNsDeliveryAttempts.configurationProven`). Shared by the clients of
    /// one topic. Not persisted, so a restart after a settings change proves the new settings afresh.
    private let proof: APNsConfigurationProof
    private var isShutDown = false
    /// Connections opened over the client's life, for tests and metrics.
    public private(set) var connectionsOpened = 0
    /// Connection attempts over the client's life, failed ones included.
    public var connectionAttempts: Int { nextConnectionID }

    /// - Parameter proof: shared by clients of the same topic (Apple's production and sandbox hosts),
    ///   so that a push accepted by either proves the topic for both.
    public init(configuration: APNsConfiguration, eventLoopGroup: any EventLoopGroup = MultiThreadedEventLoopGroup.singleton,
                logger: Logger = Logger(label: "squelch.apns"),
                proof: APNsConfigurationProof = APNsConfigurationProof()) async throws(APNsConfigurationError) {
        try configuration.validate()
        self.configuration = configuration
        self.proof = proof
        self.group = eventLoopGroup
        self.logger = logger
        var tlsConfiguration = TLSConfiguration.makeClientConfiguration()
        tlsConfiguration.applicationProtocols = ["h2"]
        tlsConfiguration.minimumTLSVersion = .tlsv12
        if case .custom(_, _, let caPath?) = configuration.environment {
            guard let roots = try? NIOSSLCertificate.fromPEMFile(caPath), !roots.isEmpty else {
                throw .unreadableCA(path: caPath)
            }
            tlsConfiguration.trustRoots = .certificates(roots)
        }
        do {
            tls = try NIOSSLContext(configuration: tlsConfiguration)
        } catch {
            throw .invalidSetting("TLS setup failed: \(error)")
        }
        signer = try await ProviderTokenSigner(identity: configuration.identity,
                                               refreshAfter: configuration.providerTokenLifetime,
                                               share: configuration.providerTokenShare, logger: logger, now: configuration.now)
        slots = Array(repeating: .empty, count: configuration.poolSize)
        failuresInARow = Array(repeating: 0, count: configuration.poolSize)
    }

    /// Opens every connection in the pool now, so the first burst doesn't pay for TLS handshakes.
    /// Failures are logged and left for the next push to retry.
    public func preconnect() async {
        await withTaskGroup(of: Void.self) { group in
            for index in slots.indices {
                group.addTask { _ = try? await self.connection(slot: index) }
            }
        }
    }

    /// Sends one push and follows the failure policy to its end. It never throws: every ending is a result
    /// the caller acts on (count it, drop the token).
    /// - Parameter tokenRegisteredAt: when the device registered the token, to judge a 410 `Unregistered`.
    public func send(_ notification: PushToTalkNotification, tokenRegisteredAt: Date? = nil) async -> Result<APNsDelivery, APNsPushFailure> {
        switch prepare(notification, tokenRegisteredAt: tokenRegisteredAt) {
        case .failure(let failure): return .failure(failure)
        case .success(var delivery): return await follow(&delivery, after: nil)
        }
    }

    /// Sends pushes together (a burst's wakes) and follows the failure policy for each; results in order.
    ///
    /// The first attempt of all of them goes out in one hand-over per connection, with one wait for the
    /// lot, instead of a task and a wait per push; only those the policy sends again are then followed
    /// one by one. Each push's budget, retries and token verdicts are exactly as for `send(_:)`.
    /// - Parameter tokensRegisteredAt: per notification (or empty), as for `send(_:tokenRegisteredAt:)`.
    public func send(_ notifications: [PushToTalkNotification], tokensRegisteredAt: [Date?] = []) async -> [Result<APNsDelivery, APNsPushFailure>] {
        var results = [Result<APNsDelivery, APNsPushFailure>?](repeating: nil, count: notifications.count)
        var ready: [(index: Int, delivery: Delivery)] = []
        // The pushes of a burst's wakes share one body: encoded once, its array shared.
        var last: (notification: PushToTalkNotification, body: [UInt8])?
        for (index, notification) in notifications.enumerated() {
            let registered = index < tokensRegisteredAt.count ? tokensRegisteredAt[index] : nil
            let body = last.flatMap { notification.hasSameBody(as: $0.notification) ? $0.body : nil }
            switch prepare(notification, tokenRegisteredAt: registered, body: body) {
            case .failure(let failure): results[index] = .failure(failure)
            case .success(let delivery):
                ready.append((index, delivery))
                last = (notification, delivery.request.body)
            }
        }
        // First attempts, split over the pool's connections when every one is usable; otherwise (a slot
        // to mend, the pool cooling down) each push finds its own way, as `send(_:)` does.
        var followUps: [(index: Int, delivery: Delivery, first: APNsAttemptResult?)] = []
        if let connections = allReadyConnections(), !ready.isEmpty {
            let share = (ready.count + connections.count - 1) / connections.count
            var chunks: [(connection: HTTP2Connection, jwt: String, generation: Int, pushes: ArraySlice<(index: Int, delivery: Delivery)>)] = []
            for (number, connection) in connections.enumerated() {
                let pushes = ready.dropFirst(number * share).prefix(share)
                guard !pushes.isEmpty else { break }
                guard let jwt = try? await signer.token(for: connection.id) else {
                    // A JWT problem (or a connection too old to keep its JWT): the one-by-one path says which.
                    followUps += pushes.map { ($0.index, $0.delivery, nil) }
                    continue
                }
                chunks.append((connection, jwt.jwt, jwt.generation, pushes))
            }
            let timeout = min(configuration.requestTimeout, configuration.retry.budget)
            let answers = await withTaskGroup(of: (Int, [APNsAttemptResult]).self) { group in
                for (number, chunk) in chunks.enumerated() {
                    let requests = chunk.pushes.map(\.delivery.request)
                    group.addTask { (number, await chunk.connection.send(requests, jwt: chunk.jwt, timeout: timeout)) }
                }
                var answers = [[APNsAttemptResult]](repeating: [], count: chunks.count)
                for await (number, results) in group { answers[number] = results }
                return answers
            }
            for (chunk, answered) in zip(chunks, answers) {
                for (push, result) in zip(chunk.pushes, answered) {
                    var delivery = push.delivery
                    delivery.used = (chunk.connection.id, chunk.generation)
                    if result == .accepted, let done = conclude(&delivery, result) {
                        results[push.index] = done  // the usual case, settled without a task
                    } else {
                        followUps.append((push.index, delivery, result))
                    }
                }
            }
        } else {
            followUps = ready.map { ($0.index, $0.delivery, nil) }
        }
        await withTaskGroup(of: (Int, Result<APNsDelivery, APNsPushFailure>).self) { group in
            for (index, delivery, first) in followUps {
                group.addTask {
                    var delivery = delivery
                    return (index, await self.follow(&delivery, after: first))
                }
            }
            for await (index, result) in group { results[index] = result }
        }
        return results.map { $0 ?? .failure(APNsPushFailure(reason: .shutdown, attempts: 0)) }
    }

    /// One push through the failure policy: its request, its attempts so far, when it started, and the
    /// connection and JWT generation of its last attempt (to replace that JWT if APNs calls it expired).
    struct Delivery: Sendable {
        let request: APNsRequest
        let token: String
        var attempts: APNsDeliveryAttempts
        let start: ContinuousClock.Instant
        var used: (connection: Int, generation: Int)?
        var last: APNsAttemptResult?
    }

    /// A push ready for its first attempt, or why it will have none.
    private func prepare(_ notification: PushToTalkNotification, tokenRegisteredAt: Date?, body: [UInt8]? = nil) -> Result<Delivery, APNsPushFailure> {
        guard !isShutDown else { return .failure(APNsPushFailure(reason: .shutdown, attempts: 0)) }
        let start = ContinuousClock.now
        let token = notification.deviceToken.lowercased()
        if tokenBackoff.isBackedOff(token, now: start) {
            return .failure(APNsPushFailure(reason: .tokenBackedOff, attempts: 0))
        }
        let request: APNsRequest
        do {
            request = try APNsRequest.pushToTalk(notification, topic: configuration.topic, body: body)
        } catch {
            return .failure(APNsPushFailure(reason: .request(error), attempts: 0))
        }
        let attempts = APNsDeliveryAttempts(policy: configuration.retry, tokenRegisteredAt: tokenRegisteredAt,
                                            configurationProven: proof.isProven,
                                            environmentChosenPerToken: configuration.environment.isApple)
        return .success(Delivery(request: request, token: token, attempts: attempts, start: start))
    }

    /// Applies one attempt's result to the policy: the push's ending, or nil to go on (after the step's
    /// delay and JWT refresh, which `follow` takes).
    private func conclude(_ delivery: inout Delivery, _ result: APNsAttemptResult) -> Result<APNsDelivery, APNsPushFailure>? {
        switch step(&delivery, result) {
        case .delivered:
            return .success(APNsDelivery(apnsID: delivery.request.apnsID, attempts: delivery.attempts.attempts))
        case .failed(let failure):
            return .failure(settle(failure, token: delivery.token))
        case .retry:
            return nil
        }
    }

    private func step(_ delivery: inout Delivery, _ result: APNsAttemptResult) -> APNsNextStep {
        delivery.last = result
        if APNsDeliveryAttempts.provesConfiguration(result) { proof.prove() }
        delivery.attempts.configurationProven = proof.isProven
        // The jitter is for retries; drawing it (a getrandom(2)) for every accepted push cost more than
        // the rest of the policy.
        let random = result == .accepted ? 0 : Double.random(in: 0..<1)
        return delivery.attempts.next(after: result, elapsed: ContinuousClock.now - delivery.start, random: random)
    }

    /// Follows the policy to the push's end, from `first` (an attempt already made) or from a new attempt.
    private func follow(_ delivery: inout Delivery, after first: APNsAttemptResult?) async -> Result<APNsDelivery, APNsPushFailure> {
        var pending = first
        while true {
            let result: APNsAttemptResult
            if let made = pending {
                result = made
                pending = nil
            } else {
                do {
                    // Getting a connection counts against the budget too: a wake that waited a minute for
                    // a stalled handshake and then went out would say "Alice is talking" long after she stopped.
                    let connection = try await pickConnection(within: configuration.retry.budget - (ContinuousClock.now - delivery.start))
                    let left = configuration.retry.budget - (ContinuousClock.now - delivery.start)
                    if left < .milliseconds(50), let last = delivery.last {
                        // Spent after a backoff: no attempt is left to make, and none is counted.
                        return .failure(APNsPushFailure(reason: .budgetExhausted(last: last), attempts: delivery.attempts.attempts))
                    }
                    guard left >= .milliseconds(50) else { throw APNsBudgetSpent() }
                    // Each connection has its own JWT (`ProviderTokenSchedule`), or sends the cluster's
                    // (`SharedTokenUse`).
                    let jwt: (jwt: String, generation: Int)
                    do {
                        jwt = try await signer.token(for: connection.id)
                    } catch is ProviderTokenSigner.RetireConnection {
                        // Too young to change its JWT, too old to keep it: a new connection takes over.
                        connection.withdraw()
                        continue
                    } catch {
                        return .failure(configurationFailure(APNsPushFailure(
                            reason: .signing(String(describing: error)), isConfigurationError: true, attempts: delivery.attempts.attempts)))
                    }
                    delivery.used = (connection.id, jwt.generation)
                    result = await connection.send([delivery.request], jwt: jwt.jwt, timeout: min(configuration.requestTimeout, left))[0]
                } catch {
                    result = .transport(.connectFailed(String(describing: error)))
                }
            }
            switch step(&delivery, result) {
            case .delivered:
                return .success(APNsDelivery(apnsID: delivery.request.apnsID, attempts: delivery.attempts.attempts))
            case .retry(let delay, let refreshJWT):
                // The connection whose JWT APNs called expired gets a new one now, wherever the retry goes.
                if refreshJWT, let used = delivery.used {
                    do {
                        _ = try await signer.replace(generation: used.generation, for: used.connection)
                    } catch {
                        return .failure(configurationFailure(APNsPushFailure(
                            reason: .signing(String(describing: error)), isConfigurationError: true, attempts: delivery.attempts.attempts)))
                    }
                }
                if delay > .zero { try? await Task.sleep(for: delay) }
                if isShutDown { return .failure(APNsPushFailure(reason: .shutdown, attempts: delivery.attempts.attempts)) }
            case .failed(let failure):
                return .failure(settle(failure, token: delivery.token))
            }
        }
    }

    /// A push's final failure: backs its token off if the policy says so, and logs what only a person can fix.
    private func settle(_ failure: APNsPushFailure, token: String) -> APNsPushFailure {
        if let backoff = failure.backOffToken { tokenBackoff.backOff(token, for: backoff, now: ContinuousClock.now) }
        if failure.dropToken, case .rejected(let response) = failure.reason, response.reason == .badDeviceToken,
           loggedConfigurationErrors.insert("BadDeviceToken dropped").inserted {
            // Dropped at once on Apple's hosts; if every token of an app goes this way, the app
            // reports the wrong environment for its tokens, which only its developers can fix.
            logger.warning("APNs called a device token BadDeviceToken and it was dropped; if this happens to every device of an app, the app reports the wrong APNs environment (sandbox or production) for its tokens",
                           metadata: ["host": "\(configuration.environment.host)"])
        }
        return failure.isConfigurationError ? configurationFailure(failure) : failure
    }

    /// The retry budget ran out while a connection was being found.
    struct APNsBudgetSpent: Error, CustomStringConvertible {
        var description: String { "no APNs connection was ready within the push's time budget" }
    }

    /// Closes every connection. Pushes in flight end with `ClientShutdown` or a transport failure.
    public func shutdown() async {
        isShutDown = true
        let current = slots
        slots = Array(repeating: .empty, count: slots.count)
        for slot in current {
            switch slot {
            case .ready(let connection): await connection.close()
            case .connecting(let task): if let connection = try? await task.value { await connection.close() }
            case .empty, .coolingDown: break
            }
        }
    }

    /// How many connections are open and usable now.
    public var openConnections: Int {
        slots.reduce(0) { count, slot in
            if case .ready(let connection) = slot, connection.isUsable { return count + 1 }
            return count
        }
    }

    /// Whether APNs has shown this client's topic and host to be right (for tests and health checks).
    public var isConfigurationProven: Bool { proof.isProven }

    /// Configuration errors are loud but once per reason: the same misconfiguration would otherwise log
    /// once per push, burying everything else.
    private func configurationFailure(_ failure: APNsPushFailure) -> APNsPushFailure {
        let label = failure.reason.label
        guard loggedConfigurationErrors.insert(label).inserted else { return failure }
        if case .rejected(let response) = failure.reason,
           response.reason == .badDeviceToken || response.reason == .deviceTokenNotForTopic {
            logger.error("APNs refused a device token before accepting any push from this server; the token is kept, because a wrong topic (the app's bundle ID), or a host of the wrong environment, gets this answer for every token. If every push fails this way, fix the topic or the APNs host setting; once a push goes through, tokens refused after that are dropped",
                         metadata: ["reason": "\(label)", "topic": "\(configuration.topic)",
                                    "host": "\(configuration.environment.host)"])
        } else {
            logger.error("APNs configuration error; pushes cannot be delivered until it is fixed",
                         metadata: ["reason": "\(label)", "detail": "\(failure.reason)",
                                    "topic": "\(configuration.topic)", "keyID": "\(configuration.identity.keyID)",
                                    "teamID": "\(configuration.identity.teamID)", "host": "\(configuration.environment.host)"])
        }
        return failure
    }

    /// `pickConnection`, given up after `limit` (the connection attempt carries on for later pushes).
    private func pickConnection(within limit: Duration) async throws -> HTTP2Connection {
        guard limit > .zero else { throw APNsBudgetSpent() }
        // The usual case, with no task or timer: the pool is full and every connection usable.
        if let ready = leastLoadedIfAllReady() { return ready }
        // Not a task group: a group waits for every child, and awaiting a connecting task's value can't
        // be cancelled, so the push would still wait for the whole connection attempt.
        let settled = NIOLockedValueBox(false)
        return try await withCheckedThrowingContinuation { continuation in
            @Sendable func settle(_ result: Result<HTTP2Connection, any Error>) -> Bool {
                guard settled.withLockedValue({ done in defer { done = true }; return !done }) else { return false }
                continuation.resume(with: result)
                return true
            }
            let timer = Task {
                try await Task.sleep(for: limit)
                _ = settle(.failure(APNsBudgetSpent()))
            }
            Task {
                let result: Result<HTTP2Connection, any Error>
                do { result = .success(try await self.pickConnection()) } catch { result = .failure(error) }
                if settle(result) { timer.cancel() }
            }
        }
    }

    /// Every connection, if every slot holds a usable one (else `pickConnection` has slots to mend).
    private func allReadyConnections() -> [HTTP2Connection]? {
        var connections: [HTTP2Connection] = []
        connections.reserveCapacity(slots.count)
        for slot in slots {
            guard case .ready(let connection) = slot, connection.isUsable else { return nil }
            connections.append(connection)
        }
        return connections
    }

    /// The least loaded connection, if every slot holds a usable one.
    private func leastLoadedIfAllReady() -> HTTP2Connection? {
        allReadyConnections()?.min { $0.load < $1.load }
    }

    /// The least loaded usable connection; empty or dead slots are (re)connected on the way.
    private func pickConnection() async throws -> HTTP2Connection {
        guard !isShutDown else { throw APNsTransportError.closed }
        var best: HTTP2Connection?
        var pending: Int?
        var cooling: (until: ContinuousClock.Instant, failure: String)?
        for index in slots.indices {
            if case .coolingDown(let until, let failure) = slots[index] {
                guard ContinuousClock.now >= until else {
                    if cooling.map({ until < $0.until }) ?? true { cooling = (until, failure) }
                    continue
                }
                slots[index] = .empty
            }
            switch slots[index] {
            case .ready(let connection) where connection.isUsable:
                if best == nil || connection.load < best!.load { best = connection }
            case .ready(let connection):
                connection.retire()
                slots[index] = .empty
                startConnecting(slot: index)
                pending = pending ?? index
            case .empty:
                startConnecting(slot: index)
                pending = pending ?? index
            case .connecting:
                pending = pending ?? index
            case .coolingDown:
                break
            }
        }
        if let best { return best }
        guard let pending else {
            if let cooling { throw APNsConnectionError.coolingDown(lastFailure: cooling.failure, retryIn: cooling.until - ContinuousClock.now) }
            throw APNsTransportError.closed
        }
        return try await connection(slot: pending)
    }

    /// The pause after `failuresInARow` failed attempts: 0.5 s doubling to 30 s, the upper half of it
    /// at random (`random` in 0..<1), so that slots and servers don't retry in step.
    static func reconnectPause(failuresInARow: Int, random: Double) -> Duration {
        let full = min(30.0, 0.5 * Double(1 << min(max(failuresInARow, 1) - 1, 10)))
        return .milliseconds(Int(full * (0.5 + random / 2) * 1000))
    }

    private func startConnecting(slot index: Int) {
        nextConnectionID += 1
        let id = nextConnectionID
        let configuration = configuration
        let group = group
        let tls = tls
        let task = Task {
            try await HTTP2Connection.connect(
                id: id, group: group, host: configuration.environment.host, port: configuration.environment.port, tls: tls,
                connectTimeout: configuration.connectTimeout, pingInterval: configuration.pingInterval,
                pingTimeout: configuration.pingTimeout)
        }
        slots[index] = .connecting(task)
    }

    private func connection(slot index: Int) async throws -> HTTP2Connection {
        switch slots[index] {
        case .ready(let connection) where connection.isUsable:
            return connection
        case .connecting(let task):
            return try await settle(slot: index, task: task)
        case .coolingDown(let until, let failure) where ContinuousClock.now < until:
            throw APNsConnectionError.coolingDown(lastFailure: failure, retryIn: until - ContinuousClock.now)
        case .ready(let unusable):
            unusable.retire()
            fallthrough
        case .empty, .coolingDown:
            startConnecting(slot: index)
            guard case .connecting(let task) = slots[index] else { throw APNsTransportError.closed }
            return try await settle(slot: index, task: task)
        }
    }

    private func settle(slot index: Int, task: Task<HTTP2Connection, any Error>) async throws -> HTTP2Connection {
        do {
            let connection = try await task.value
            // Another caller may have settled the slot while this one waited; only the task's own waiters write.
            if case .connecting(let current) = slots[index], current == task {
                slots[index] = .ready(connection)
                failuresInARow[index] = 0
                connectionsOpened += 1
                logger.debug("APNs connection open", metadata: ["connection": "\(connection.id)"])
            }
            if isShutDown { await connection.close() }
            return connection
        } catch {
            // Said once per attempt, by the waiter that settles the slot, not by every push waiting on it.
            if case .connecting(let current) = slots[index], current == task {
                failuresInARow[index] += 1
                let pause = Self.reconnectPause(failuresInARow: failuresInARow[index], random: Double.random(in: 0..<1))
                slots[index] = .coolingDown(until: ContinuousClock.now + pause, failure: String(describing: error))
                logger.warning("APNs connection failed", metadata: [
                    "host": "\(configuration.environment.host)", "error": "\(error)",
                    "retryIn": "\(pause.formatted(.units(allowed: [.seconds, .milliseconds], width: .narrow)))"])
            }
            throw error
        }
    }
}

/// Whether APNs has shown a topic (and host) to be right, shared by the clients that push to it; see
/// `APNsDeliveryAttempts.configurationProven`. Once proven, it stays so for the process's life.
public final class APNsConfigurationProof: Sendable {
    private let proven = NIOLockedValueBox(false)

    public init() {}

    public var isProven: Bool { proven.withLockedValue { $0 } }

    func prove() { proven.withLockedValue { $0 = true } }
}
