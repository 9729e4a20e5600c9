import APNsSimulator
import Foundation
import NIOConcurrencyHelpers
import NIOCore
import NIOEmbedded
import SquelchTesting
import Testing
@testable import APNs

/// The APNs client against the APNs simulator: real TLS with ALPN h2, real HTTP/2 on 127.0.0.1, JWTs
/// verified with the dev key. Faults are injected in the simulator, so every branch of the failure policy
/// runs over the wire.
final class SimulatorFixture: Sendable {
    let simulator: APNsSimulator
    let endpoints: APNsSimulatorEndpoints
    let identity: APNsProviderIdentity
    static let topic = "org.squelch.test.voip-ptt"

    init() async throws {
        let key = try APNsProviderKey.load(p8Path: DevCertificates.p8, keyID: "DEVKEY0001", teamID: "DEVTEAM001")
        simulator = try APNsSimulator(configuration: APNsSimulatorConfiguration(
            certificateChainPath: DevCertificates.simulatorCertificate, privateKeyPath: DevCertificates.simulatorKey,
            providerKeys: [key], allowedTopics: [Self.topic]))
        endpoints = try await simulator.start()
        identity = try APNsProviderIdentity.load(p8Path: DevCertificates.p8, keyID: "DEVKEY0001", teamID: "DEVTEAM001")
    }

    func client(topic: String = SimulatorFixture.topic, poolSize: Int = 1, requestTimeout: Duration = .seconds(2),
                pingInterval: Duration = .seconds(60), retry: APNsRetryPolicy = APNsRetryPolicy(),
                now: @escaping @Sendable () -> Date = { Date() },
                proof: APNsConfigurationProof = APNsConfigurationProof()) async throws -> APNsClient {
        try await APNsClient(configuration: APNsConfiguration(
            environment: .custom(host: "127.0.0.1", port: endpoints.port, caPath: DevCertificates.ca), identity: identity,
            topic: topic, poolSize: poolSize, requestTimeout: requestTimeout, pingInterval: pingInterval, retry: retry, now: now),
            proof: proof)
    }

    func stop() async { try? await simulator.stop() }
}

func notification(_ token: String = "0a1b2c3d4e5f", speaker: String? = "Alice", channel: UUID = UUID()) -> PushToTalkNotification {
    PushToTalkNotification(deviceToken: token, activeSpeaker: speaker, channel: channel)
}

/// A wall clock the test moves, shared by the client and the simulator.
final class ManualDate: Sendable {
    private let current = NIOLockedValueBox(Date(timeIntervalSince1970: 1_800_000_000))
    var now: Date { current.withLockedValue { $0 } }
    func advance(_ seconds: TimeInterval) { current.withLockedValue { $0 = $0.addingTimeInterval(seconds) } }
}

extension Result {
    var failure: Failure? { if case .failure(let error) = self { return error } else { return nil } }
    var success: Success? { if case .success(let value) = self { return value } else { return nil } }
}

@Suite(.serialized, .timeLimit(.minutes(2))) struct APNsClientTests {
    @Test func aPushArrivesWithExactlyThePushToTalkHeadersAndAVerifiedJWT() async throws {
        let fixture = try await SimulatorFixture()
        let client = try await fixture.client()
        let channel = UUID()
        let push = notification("ABCDEF0123456789", speaker: "Alice", channel: channel)
        let delivery = try #require(await client.send(push).success)
        #expect(delivery.attempts == 1)
        #expect(delivery.apnsID == push.id.uuidString.lowercased())
        let accepted = try #require(fixture.simulator.acceptedPushes().first)
        #expect(accepted.token == "abcdef0123456789")
        #expect(accepted.pushType == "pushtotalk")
        #expect(accepted.topic == SimulatorFixture.topic)
        #expect(accepted.priority == 10)
        #expect(accepted.expiration == 0)
        #expect(accepted.collapseID == nil)
        #expect(accepted.apnsID == delivery.apnsID)
        #expect(accepted.keyID == "DEVKEY0001" && accepted.teamID == "DEVTEAM001")
        let body = try JSONSerialization.jsonObject(with: Data(accepted.body.utf8)) as? [String: Any]
        #expect(body?["activeSpeaker"] as? String == "Alice")
        #expect(body?["channel"] as? String == channel.uuidString.lowercased())
        #expect(fixture.simulator.rejections().isEmpty)
        #expect(fixture.simulator.stats().malformedBodies == 0)
        // The same JWT serves the next push on the same connection (a new one would be TooManyProviderTokenUpdates).
        #expect(await client.send(notification()).success != nil)
        #expect(await client.connectionsOpened == 1)
        await client.shutdown()
        await fixture.stop()
    }

    @Test func deadTokensAreReportedForRemoval() async throws {
        let fixture = try await SimulatorFixture()
        let registered = Date(timeIntervalSince1970: 1_700_000_000)
        let died = Int64(registered.timeIntervalSince1970 * 1000)
        fixture.simulator.setFaults(APNsFaultPlan(
            unregistered: ["aaaa": died + 60_000, "bbbb": died - 60_000],
            scripted: [APNsScriptedResponse(token: "cccc", status: 400, reason: "BadDeviceToken", count: 1),
                       APNsScriptedResponse(token: "dddd", status: 410, reason: "ExpiredToken", count: 1),
                       APNsScriptedResponse(token: "eeee", status: 400, reason: "DeviceTokenNotForTopic", count: 1)]))
        let client = try await fixture.client()
        // One accepted push first: until then a token refused as BadDeviceToken or
        // DeviceTokenNotForTopic may be the settings' fault and is kept (the next test).
        #expect(await client.send(notification("ffff")).success != nil)
        let diedLater = try #require(await client.send(notification("aaaa"), tokenRegisteredAt: registered).failure)
        #expect(diedLater.dropToken && diedLater.reason.label == "Unregistered" && diedLater.attempts == 1)
        let reRegistered = try #require(await client.send(notification("bbbb"), tokenRegisteredAt: registered).failure)
        #expect(!reRegistered.dropToken, "the token was registered again after APNs saw it die")
        for token in ["cccc", "dddd", "eeee"] {
            let failure = try #require(await client.send(notification(token)).failure)
            #expect(failure.dropToken, "\(token)")
            #expect(failure.attempts == 1, "no retry for a dead token")
        }
        await client.shutdown()
        await fixture.stop()
    }

    /// A mistyped bundle ID gets DeviceTokenNotForTopic for every token (the simulator is scripted to
    /// answer so, as Apple does for a topic of the same team that the tokens weren't issued for).
    @Test func aWrongTopicDoesNotCondemnEveryToken() async throws {
        let fixture = try await SimulatorFixture()
        fixture.simulator.setFaults(APNsFaultPlan(scripted: [
            APNsScriptedResponse(status: 400, reason: "DeviceTokenNotForTopic", count: 3),
            APNsScriptedResponse(status: 400, reason: "BadDeviceToken", count: 1),
        ]))
        let client = try await fixture.client()
        for token in ["aaaa", "bbbb", "cccc", "dddd"] {
            let failure = try #require(await client.send(notification(token)).failure)
            #expect(!failure.dropToken, "\(token): no push has been accepted yet, so the setting may be at fault")
            #expect(failure.isConfigurationError)
            #expect(failure.attempts == 1)
        }
        // The setting is fixed (here: the script has run out); the first accepted push proves it, and a
        // token refused after that is the token's fault.
        #expect(await client.send(notification("aaaa")).success != nil)
        fixture.simulator.setFaults(APNsFaultPlan(scripted: [
            APNsScriptedResponse(token: "bbbb", status: 400, reason: "DeviceTokenNotForTopic", count: 1)]))
        let failure = try #require(await client.send(notification("bbbb")).failure)
        #expect(failure.dropToken)
        #expect(!failure.isConfigurationError)
        await client.shutdown()
        await fixture.stop()
    }

    /// Apple's production and sandbox hosts share the topic: a push the one accepts proves it for
    /// the other. An Unregistered answer proves it as well (APNs knows the token for this topic).
    @Test func clientsOfOneTopicShareTheProof() async throws {
        let fixture = try await SimulatorFixture()
        let proof = APNsConfigurationProof()
        let first = try await fixture.client(proof: proof)
        let second = try await fixture.client(proof: proof)
        fixture.simulator.setFaults(APNsFaultPlan(unregistered: ["aaaa": 1_700_000_000_000]))
        _ = await first.send(notification("aaaa"), tokenRegisteredAt: Date(timeIntervalSince1970: 1_600_000_000))
        #expect(await second.isConfigurationProven, "the Unregistered answer the first client got")
        fixture.simulator.setFaults(APNsFaultPlan(scripted: [
            APNsScriptedResponse(token: "bbbb", status: 400, reason: "DeviceTokenNotForTopic", count: 1)]))
        let failure = try #require(await second.send(notification("bbbb")).failure)
        #expect(failure.dropToken)
        // A client with a proof of its own has shown nothing yet.
        let third = try await fixture.client()
        #expect(!(await third.isConfigurationProven))
        for client in [first, second, third] { await client.shutdown() }
        await fixture.stop()
    }

    @Test func transientFailuresAreRetriedUntilDelivered() async throws {
        let fixture = try await SimulatorFixture()
        fixture.simulator.setFaults(APNsFaultPlan(scripted: [
            APNsScriptedResponse(status: 503, reason: "ServiceUnavailable", count: 1),
            APNsScriptedResponse(status: 500, reason: "InternalServerError", count: 1),
            APNsScriptedResponse(status: 503, reason: "Shutdown", count: 1),
        ]))
        let client = try await fixture.client()
        let delivery = try #require(await client.send(notification()).success)
        #expect(delivery.attempts == 4)
        #expect(fixture.simulator.acceptedPushes().count == 1)
        #expect(fixture.simulator.rejections().map(\.reason) == ["ServiceUnavailable", "InternalServerError", "Shutdown"])
        await client.shutdown()
        await fixture.stop()
    }

    /// A burst's wakes go as one batch: results come back in order, each push keeps its own verdict,
    /// and those the policy sends again (transient failures) are retried alone until delivered.
    @Test func aBatchKeepsEachPushsOwnVerdictAndRetries() async throws {
        let fixture = try await SimulatorFixture()
        let registered = Date(timeIntervalSince1970: 1_700_000_000)
        fixture.simulator.setFaults(APNsFaultPlan(
            unregistered: ["dead01": Int64(registered.timeIntervalSince1970 * 1000) + 60_000],
            scripted: [APNsScriptedResponse(token: "beef01", status: 503, reason: "ServiceUnavailable", count: 2),
                       APNsScriptedResponse(token: "face01", status: 400, reason: "BadDeviceToken", count: 1)]))
        let client = try await fixture.client(poolSize: 2)
        #expect(await client.send(notification("0000")).success != nil, "proves the settings; opens the pool")
        await client.preconnect()
        let tokens = (0..<300).map { String(format: "%04x", $0 + 1) } + ["dead01", "beef01", "face01", "not-hex"]
        let results = await client.send(tokens.map { notification($0) },
                                        tokensRegisteredAt: tokens.map { $0 == "dead01" ? registered : nil })
        #expect(results.count == tokens.count)
        #expect(results.prefix(300).allSatisfy { $0.success?.attempts == 1 })
        #expect(results[300].failure.map { $0.dropToken && $0.reason.label == "Unregistered" } == true)
        #expect(results[301].success?.attempts == 3, "retried alone past two 503s")
        #expect(results[302].failure?.dropToken == true)
        #expect(results[303].failure?.reason.label == "InvalidRequest", "refused before anything was sent")
        let accepted = fixture.simulator.acceptedPushes()
        #expect(accepted.count == 302)
        #expect(Set(accepted.map(\.connection)).count == 2, "spread over both connections")
        #expect(await client.connectionsOpened == 2)
        await client.shutdown()
        await fixture.stop()
    }

    /// A batch shares one encoded body between consecutive pushes about the same speaker and channel:
    /// each push must still carry its own notification's body and apns-id, whatever its neighbours are.
    @Test func aMixedBatchSendsEachPushItsOwnBody() async throws {
        let fixture = try await SimulatorFixture()
        let client = try await fixture.client(poolSize: 2)
        let (first, second) = (UUID(), UUID())
        let about: [(speaker: String?, channel: UUID)] = [("Alice", first), ("Alice", first), ("Bob", first), ("Bob", second),
                                                          (nil, second), (nil, second), ("Alice", first), ("Alice", second)]
        let notifications = PushToTalkNotification.batch(about.enumerated().map { (String(format: "%04x", $0.offset + 1), $0.element.speaker, $0.element.channel) })
        let results = await client.send(notifications)
        #expect(results.allSatisfy { $0.success != nil })
        let accepted = Dictionary(uniqueKeysWithValues: fixture.simulator.acceptedPushes().map { ($0.token, $0) })
        #expect(accepted.count == notifications.count)
        for notification in notifications {
            let push = try #require(accepted[notification.deviceToken])
            #expect(push.body == String(decoding: try notification.jsonBody(), as: UTF8.self))
            #expect(push.apnsID == notification.id.lowercaseString)
        }
        await client.shutdown()
        await fixture.stop()
    }

    @Test func retriesGiveUpWithinTheBudget() async throws {
        let fixture = try await SimulatorFixture()
        fixture.simulator.setFaults(APNsFaultPlan(serviceUnavailableShare: 1))
        let client = try await fixture.client(retry: APNsRetryPolicy(budget: .milliseconds(600)))
        let started = ContinuousClock.now
        let failure = try #require(await client.send(notification()).failure)
        let took = ContinuousClock.now - started
        #expect(failure.reason.label == "BudgetExhausted")
        #expect(failure.attempts > 1)
        #expect(took < .seconds(2), "the budget bounds the whole push, backoff included")
        #expect(fixture.simulator.rejections().count == failure.attempts)
        await client.shutdown()
        await fixture.stop()
    }

    @Test func configurationErrorsAreNeverRetried() async throws {
        let fixture = try await SimulatorFixture()
        let client = try await fixture.client(topic: "org.squelch.other.voip-ptt")
        let failure = try #require(await client.send(notification()).failure)
        #expect(failure.isConfigurationError)
        #expect(failure.reason.label == "TopicDisallowed")
        #expect(failure.attempts == 1)
        #expect(fixture.simulator.rejections().count == 1)
        await client.shutdown()
        await fixture.stop()
    }

    @Test func tooManyRequestsBacksOffThatTokenOnly() async throws {
        let fixture = try await SimulatorFixture()
        fixture.simulator.setFaults(APNsFaultPlan(scripted: [APNsScriptedResponse(token: "abab", status: 429, reason: "TooManyRequests", count: 1)]))
        let client = try await fixture.client()
        let first = try #require(await client.send(notification("abab")).failure)
        #expect(first.backOffToken != nil && !first.dropToken)
        let second = try #require(await client.send(notification("abab")).failure)
        #expect(second.reason == .tokenBackedOff && second.attempts == 0)
        #expect(await client.send(notification("cdcd")).success != nil, "other tokens are unaffected")
        #expect(fixture.simulator.rejections().count == 1, "the backed-off push never reached APNs")
        await client.shutdown()
        await fixture.stop()
    }

    @Test func anExpiredProviderTokenIsReplacedOnceThenReported() async throws {
        let fixture = try await SimulatorFixture()
        // A clock two hours slow mints JWTs APNs finds an hour too old, however fresh: one new JWT is tried,
        // then the push ends as a configuration error (the clock needs fixing).
        let client = try await fixture.client(now: { Date().addingTimeInterval(-7200) })
        let failure = try #require(await client.send(notification()).failure)
        #expect(failure.reason.label == "ExpiredProviderToken")
        #expect(failure.attempts == 2)
        #expect(failure.isConfigurationError)
        #expect(fixture.simulator.rejections().map(\.reason) == ["ExpiredProviderToken", "ExpiredProviderToken"])
        await client.shutdown()

        // With a good clock, a one-off ExpiredProviderToken costs one retry with a new JWT.
        fixture.simulator.setFaults(APNsFaultPlan(scripted: [APNsScriptedResponse(status: 403, reason: "ExpiredProviderToken", count: 1)]))
        let healthy = try await fixture.client()
        let delivery = try #require(await healthy.send(notification()).success)
        #expect(delivery.attempts == 2)
        await healthy.shutdown()
        await fixture.stop()
    }

    @Test func bodiesOver4KBAreRefusedBeforeAnythingIsSent() async throws {
        let fixture = try await SimulatorFixture()
        let client = try await fixture.client()
        let failure = try #require(await client.send(notification(speaker: String(repeating: "é", count: 2100))).failure)
        guard case .request(.payloadTooLarge(let bytes)) = failure.reason else { Issue.record("got \(failure)"); return }
        #expect(bytes > 4096)
        #expect(fixture.simulator.rejections().isEmpty && fixture.simulator.acceptedPushes().isEmpty)
        await client.shutdown()
        await fixture.stop()
    }

    @Test func goAwayMovesPushesToAFreshConnection() async throws {
        let fixture = try await SimulatorFixture()
        fixture.simulator.setFaults(APNsFaultPlan(goAwayAfterRequests: 3))
        let client = try await fixture.client()
        for index in 0..<10 {
            let result = await client.send(notification(String(format: "%04x", index)))
            #expect(result.success != nil, "push \(index): \(String(describing: result.failure))")
        }
        #expect(fixture.simulator.acceptedPushes().count == 10)
        #expect(await client.connectionsOpened >= 4)
        #expect(fixture.simulator.stats().goAwaysSent >= 3)
        await client.shutdown()
        await fixture.stop()
    }

    /// APNs (or DNS, a firewall, a proxy) refusing connections: each slot tries again after a pause
    /// that doubles, instead of every push and each of its retries starting a TLS handshake.
    @Test func refusedConnectionsAreRetriedAfterAPauseNotByEveryPush() async throws {
        let refusing = try #require(HeldPort(tcpListening: false))  // a UDP port: TCP connects are refused
        let identity = try APNsProviderIdentity.load(p8Path: DevCertificates.p8, keyID: "DEVKEY0001", teamID: "DEVTEAM001")
        let client = try await APNsClient(configuration: APNsConfiguration(
            environment: .custom(host: "127.0.0.1", port: refusing.port, caPath: DevCertificates.ca),
            identity: identity, topic: SimulatorFixture.topic, poolSize: 2, retry: APNsRetryPolicy(budget: .seconds(1))))
        // A burst wakes 40 sleeping members at once.
        let results = await withTaskGroup(of: Result<APNsDelivery, APNsPushFailure>.self) { group in
            for index in 0..<40 { group.addTask { await client.send(notification(String(format: "%04x", index))) } }
            return await group.reduce(into: []) { $0.append($1) }
        }
        #expect(results.allSatisfy { $0.failure != nil })
        // 1 s of budget: a slot's attempts come at 0, after 0.25–0.5 s and after another 0.5–1 s.
        let attempts = await client.connectionAttempts
        #expect(attempts >= 2 && attempts <= 6, "\(attempts) connection attempts for 40 pushes")
        let reasons = results.compactMap { $0.failure.map { "\($0.reason)" } }
        #expect(reasons.contains { $0.contains("next attempt in") }, "\(Set(reasons))")
        await client.shutdown()
        withExtendedLifetime(refusing) {}
    }

    @Test func theReconnectPauseDoublesToThirtySecondsWithJitter() {
        #expect(APNsClient.reconnectPause(failuresInARow: 1, random: 0) == .milliseconds(250))
        #expect(APNsClient.reconnectPause(failuresInARow: 1, random: 0.999) <= .milliseconds(500))
        #expect(APNsClient.reconnectPause(failuresInARow: 2, random: 0) == .milliseconds(500))
        #expect(APNsClient.reconnectPause(failuresInARow: 7, random: 0) == .seconds(15))
        #expect(APNsClient.reconnectPause(failuresInARow: 50, random: 0.999) <= .seconds(30))
        #expect(APNsClient.reconnectPause(failuresInARow: 50, random: 0) == .seconds(15))
    }

    /// A peer that completes TCP and then says nothing (a stalled proxy or firewall): NIOSSL has no
    /// handshake timeout, so the push used to wait for the connection without end.
    @Test func aStalledHandshakeDoesNotHoldAPushForTheConnectTimeout() async throws {
        let silent = try #require(HeldPort(tcpListening: true))
        let identity = try APNsProviderIdentity.load(p8Path: DevCertificates.p8, keyID: "DEVKEY0001", teamID: "DEVTEAM001")
        let client = try await APNsClient(configuration: APNsConfiguration(
            environment: .custom(host: "127.0.0.1", port: silent.port, caPath: DevCertificates.ca),
            identity: identity, topic: SimulatorFixture.topic, poolSize: 1, retry: APNsRetryPolicy(budget: .milliseconds(700))))
        let clock = ContinuousClock()
        let start = clock.now
        let result = await client.send(notification())
        let took = clock.now - start
        #expect(result.failure != nil)
        // Budget 700 ms; the connection attempt alone would take the 3 s connect timeout.
        #expect(took < .milliseconds(2_500), "the push waited \(took) for a connection that never came")
        // The connection attempt itself gives up after the connect timeout (3 s), TLS included, so the
        // client can shut down; before, it waited on the silent peer for good.
        await client.shutdown()
        #expect(clock.now - start < .seconds(6), "shutdown waited on the handshake: \(clock.now - start)")
        withExtendedLifetime(silent) {}
    }

    /// A timed-out request PINGs the connection at once (not after a minute without reads), and a PING
    /// left unanswered closes it, so the pool replaces a dead connection within the PING timeout.
    /// EmbeddedChannel: the session handler alone, below where TLS would be, with time moved by hand.
    @Test func aTimedOutRequestProbesTheConnectionAndSilenceClosesIt() throws {
        let loop = EmbeddedEventLoop()
        let channel = EmbeddedChannel(loop: loop)
        let state = NIOLockedValueBox(HTTP2Connection.State())
        let queue = NIOLockedValueBox(PushQueue())
        let handler = try PushSessionHandler(state: state, submissions: queue,
                                             handshake: loop.makePromise(), pingInterval: .seconds(60), pingTimeout: .seconds(5))
        try channel.pipeline.syncOperations.addHandler(handler)
        try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()
        // The preface and the client's SETTINGS, then nothing until asked.
        #expect(try outboundFrameTypes(channel, preface: true) == [0x4])
        channel.pipeline.fireUserInboundEventTriggered(PushSessionHandler.ProbeNow())
        #expect(try outboundFrameTypes(channel) == [0x6], "a PING")
        channel.pipeline.fireUserInboundEventTriggered(PushSessionHandler.ProbeNow())
        #expect(try outboundFrameTypes(channel).isEmpty, "one PING outstanding at a time")
        loop.advanceTime(by: .seconds(4))
        #expect(channel.isActive)
        loop.advanceTime(by: .seconds(2))
        #expect(!channel.isActive, "an unanswered PING closes the connection")
        #expect(state.withLockedValue { $0.closed }, "out of the pool")
        #expect(queue.withLockedValue { $0.closed }, "a push handed over later is refused at once, not queued")
        _ = try? channel.finish()
    }

    /// The types of the HTTP/2 frames written since the last call, after the client preface if `preface`.
    private func outboundFrameTypes(_ channel: EmbeddedChannel, preface: Bool = false) throws -> [UInt8] {
        var bytes: [UInt8] = []
        while let buffer = try channel.readOutbound(as: ByteBuffer.self) { bytes += buffer.readableBytesView }
        if preface {
            let magic = Array("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".utf8)
            #expect(Array(bytes.prefix(magic.count)) == magic)
            bytes.removeFirst(min(magic.count, bytes.count))
        }
        var types: [UInt8] = []
        var offset = 0
        while offset + 9 <= bytes.count {
            let length = Int(bytes[offset]) << 16 | Int(bytes[offset + 1]) << 8 | Int(bytes[offset + 2])
            types.append(bytes[offset + 3])
            offset += 9 + length
        }
        #expect(offset == bytes.count, "whole frames")
        return types
    }

    @Test func aSlowAnswerTimesOutAndIsRetried() async throws {
        let fixture = try await SimulatorFixture()
        fixture.simulator.setFaults(APNsFaultPlan(delayMilliseconds: 400))
        let client = try await fixture.client(requestTimeout: .milliseconds(150), retry: APNsRetryPolicy(budget: .milliseconds(700)))
        let failure = try #require(await client.send(notification()).failure)
        #expect(failure.reason == .budgetExhausted(last: .transport(.timeout)))
        #expect(failure.attempts >= 2)
        await client.shutdown()
        await fixture.stop()
    }

    @Test func aThousandPushesInFlightOverOneConnection() async throws {
        let fixture = try await SimulatorFixture()
        // The delay holds streams open, so many are in flight together. How many depends on how fast this
        // machine issues them; one at a time would be 1, so "over 100" proves multiplexing on a busy CI.
        fixture.simulator.setFaults(APNsFaultPlan(delayMilliseconds: 1000))
        // Timeouts long enough that a loaded machine never retries (a retried push would be accepted twice).
        let client = try await fixture.client(poolSize: 1, requestTimeout: .seconds(60), retry: APNsRetryPolicy(budget: .seconds(90)))
        let results = await withTaskGroup(of: String.self) { group in
            for index in 0..<1000 {
                group.addTask {
                    switch await client.send(notification(String(format: "%08x", index))) {
                    case .success: return "ok"
                    case .failure(let failure): return "\(failure.reason)"
                    }
                }
            }
            return await group.reduce(into: [String]()) { $0.append($1) }
        }
        let failures = Dictionary(grouping: results.filter { $0 != "ok" }, by: { $0 }).mapValues(\.count)
        #expect(failures.isEmpty, "\(failures)")
        #expect(await client.connectionsOpened == 1)
        let stats = fixture.simulator.stats()
        #expect(stats.accepted == 1000)
        #expect(stats.maxStreamsInFlight > 100, "streams were multiplexed, not sent one after another")
        #expect(stats.maxStreamsInFlight <= 1000, "the server's MAX_CONCURRENT_STREAMS was honoured")
        await client.shutdown()
        await fixture.stop()
    }

    @Test func keepalivePingsKeepAnIdleConnection() async throws {
        let fixture = try await SimulatorFixture()
        let client = try await fixture.client(pingInterval: .milliseconds(100))
        #expect(await client.send(notification()).success != nil)
        try await Task.sleep(for: .milliseconds(700))
        #expect(await client.openConnections == 1, "answered PINGs keep the connection")
        #expect(await client.send(notification()).success != nil)
        #expect(await client.connectionsOpened == 1)
        await client.shutdown()
        await fixture.stop()
    }

    /// Signing suspends the signer actor; pushes on one connection arriving meanwhile share the JWT being
    /// minted, and another connection gets its own.
    /// Before this was so, a burst of first pushes carried several JWTs and APNs answered the later ones with
    /// TooManyProviderTokenUpdates.
    @Test func concurrentFirstPushesOnAConnectionShareOneJWT() async throws {
        let identity = try APNsProviderIdentity.load(p8Path: DevCertificates.p8, keyID: "DEVKEY0001", teamID: "DEVTEAM001")
        let signer = try await ProviderTokenSigner(identity: identity, refreshAfter: .seconds(3000), now: { Date() })
        let tokens = try await withThrowingTaskGroup(of: String.self) { group in
            for _ in 0..<200 { group.addTask { try await signer.token(for: 1).jwt } }
            return try await group.reduce(into: Set<String>()) { $0.insert($1) }
        }
        #expect(tokens.count == 1)
        let (jwt, generation) = try await signer.token(for: 1)
        #expect(tokens == [jwt] && generation == 1)
        let replaced = try await withThrowingTaskGroup(of: String.self) { group in
            for _ in 0..<50 { group.addTask { try await signer.replace(generation: 1, for: 1).jwt } }
            return try await group.reduce(into: Set<String>()) { $0.insert($1) }
        }
        #expect(replaced.count == 1 && !replaced.contains(jwt))
        // Another connection has a JWT of its own.
        #expect(try await signer.token(for: 2).jwt != replaced.first)
        #expect(await signer.cachedConnections == 2)
    }

    /// APNs lets a connection change its JWT only 20 minutes after it first used the previous one. With
    /// one JWT for the whole pool, a connection opened 45 minutes into that JWT's life had to change it at
    /// 50, and every push on it failed with TooManyProviderTokenUpdates for a quarter of an hour.
    @Test func aConnectionOpenedLateInAJWTsLifeKeepsWorkingPastTheRefresh() async throws {
        let clock = ManualDate()
        let key = try APNsProviderKey.load(p8Path: DevCertificates.p8, keyID: "DEVKEY0001", teamID: "DEVTEAM001")
        var configuration = APNsSimulatorConfiguration(
            certificateChainPath: DevCertificates.simulatorCertificate, privateKeyPath: DevCertificates.simulatorKey,
            providerKeys: [key], allowedTopics: [SimulatorFixture.topic])
        configuration.now = { clock.now }
        let simulator = try APNsSimulator(configuration: configuration)
        let endpoints = try await simulator.start()
        let identity = try APNsProviderIdentity.load(p8Path: DevCertificates.p8, keyID: "DEVKEY0001", teamID: "DEVTEAM001")
        let client = try await APNsClient(configuration: APNsConfiguration(
            environment: .custom(host: "127.0.0.1", port: endpoints.port, caPath: DevCertificates.ca), identity: identity,
            topic: SimulatorFixture.topic, poolSize: 1, now: { clock.now }))
        #expect(await client.send(notification("0a01")).success != nil)
        // 45 minutes on, APNs closes the connection (GOAWAY after the next request); the push after it
        // opens a new one.
        clock.advance(45 * 60)
        simulator.setFaults(APNsFaultPlan(goAwayAfterRequests: 1))
        #expect(await client.send(notification("0a02")).success != nil)
        simulator.setFaults(APNsFaultPlan())
        #expect(await client.send(notification("0a03")).success != nil)
        #expect(await client.connectionsOpened == 2)
        // Past the first JWT's 50 minutes: the new connection's own JWT is 6 minutes old and stays.
        clock.advance(6 * 60)
        let late = await client.send(notification("0a04"))
        #expect(late.success != nil, "\(String(describing: late.failure))")
        #expect(simulator.stats().rejectedByReason["TooManyProviderTokenUpdates"] == nil)
        await client.shutdown()
        try? await simulator.stop()
    }

    @Test func badConfigurationIsRefusedUpFront() async throws {
        let identity = try APNsProviderIdentity.load(p8Path: DevCertificates.p8, keyID: "DEVKEY0001", teamID: "DEVTEAM001")
        await #expect(throws: APNsConfigurationError.invalidTopic("org.example.app")) {
            _ = try await APNsClient(configuration: APNsConfiguration(environment: .sandbox, identity: identity, topic: "org.example.app"))
        }
        await #expect(throws: APNsConfigurationError.self) {
            _ = try await APNsClient(configuration: APNsConfiguration(
                environment: .sandbox, identity: APNsProviderIdentity(keyID: "DEVKEY0001", teamID: "DEVTEAM001", privateKeyPEM: "junk"),
                topic: "a.voip-ptt"))
        }
        #expect(throws: APNsConfigurationError.unreadableKey(path: "/nonexistent.p8")) {
            _ = try APNsProviderIdentity.load(p8Path: "/nonexistent.p8", keyID: "DEVKEY0001", teamID: "DEVTEAM001")
        }
    }
}
