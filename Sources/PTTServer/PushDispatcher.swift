import APNs
import ChannelProtocol
import ChannelStore
import Foundation
import Logging
import Prometheus
import ServiceLifecycle

/// Where pushes go: one client for every token (the simulator, a custom server), or Apple's two
/// environments, each token to the one it was issued by (a sandbox token is `BadDeviceToken` in production).
public struct APNsRoute: Sendable {
    let production: APNsClient
    let sandbox: APNsClient

    /// Every token to `client`.
    public init(all client: APNsClient) {
        production = client
        sandbox = client
    }

    public init(production: APNsClient, sandbox: APNsClient) {
        self.production = production
        self.sandbox = sandbox
    }

    func client(for environment: PushEnvironment?) -> APNsClient {
        environment == .sandbox ? sandbox : production
    }

    var clients: [APNsClient] { production === sandbox ? [production] : [production, sandbox] }
}

/// Sends the pushes the channel hub asks for: a wake to each sleeping member when a burst starts, and a
/// leave push when an administrator removes a member or deletes a channel.
///
/// The hub's event loop only hands jobs over (a non-blocking `yield`), so the relay never waits for APNs;
/// each push then runs as its own task and follows the APNs client's failure policy. A token APNs calls
/// dead is reported through `tokenRejected`, which clears it in the hub and the store.
public final class PushDispatcher: Service, Sendable {
    enum Job: Sendable {
        case wake(channel: UUID, speaker: String, member: MemberRecord)
        case leave(channel: UUID, member: MemberRecord)
    }

    /// Jobs waiting beyond this are dropped (and counted): a wake that waits behind 50,000 others is stale.
    static let queueLimit = 50_000

    private let route: APNsRoute
    private let jobs: AsyncStream<Job>
    private let continuation: AsyncStream<Job>.Continuation
    private let metrics: PushMetrics
    private let logger: Logger
    private let tokenRejected: @Sendable (_ channel: UUID, _ user: String, _ token: String) async -> Void

    public init(route: APNsRoute, registry: PrometheusCollectorRegistry, logger: Logger,
                tokenRejected: @escaping @Sendable (UUID, String, String) async -> Void) {
        self.route = route
        self.metrics = PushMetrics(registry: registry)
        self.logger = logger
        self.tokenRejected = tokenRejected
        (jobs, continuation) = AsyncStream.makeStream(of: Job.self, bufferingPolicy: .bufferingOldest(Self.queueLimit))
    }

    /// Queues a wake for each member. Never blocks.
    public func wake(channel: UUID, speaker: String, members: [MemberRecord]) {
        for member in members { enqueue(.wake(channel: channel, speaker: speaker, member: member)) }
    }

    /// Queues a leave push. Never blocks.
    public func leave(channel: UUID, member: MemberRecord) {
        enqueue(.leave(channel: channel, member: member))
    }

    private func enqueue(_ job: Job) {
        if case .dropped = continuation.yield(job) { metrics.count(.failed, reason: "QueueFull") }
    }

    public func run() async throws {
        // Opening the connections before the first burst keeps TLS out of the first wake's time.
        for client in route.clients { Task { await client.preconnect() } }
        // On shutdown the queue is closed: what is already in it still goes out, each push within its
        // 2 s budget, and then the connections close.
        await withGracefulShutdownHandler {
            await withDiscardingTaskGroup { group in
                for await job in self.jobs {
                    group.addTask { await self.deliver(job) }
                }
            }
        } onGracefulShutdown: {
            self.continuation.finish()
        }
        for client in route.clients { await client.shutdown() }
    }

    private func deliver(_ job: Job) async {
        let channel: UUID
        let member: MemberRecord
        let speaker: String?
        switch job {
        case .wake(let c, let s, let m): (channel, member, speaker) = (c, m, s)
        case .leave(let c, let m): (channel, member, speaker) = (c, m, nil)
        }
        guard let token = member.pushToken else { return }
        let notification = PushToTalkNotification(deviceToken: token, activeSpeaker: speaker, channel: channel)
        let client = route.client(for: member.pushEnvironment)
        switch await client.send(notification, tokenRegisteredAt: member.pushRegisteredAt) {
        case .success(let delivery):
            metrics.count(speaker == nil ? .deliveredLeave : .delivered, reason: "Success")
            logger.debug("push delivered", metadata: ["channel": "\(channel)", "user": "\(member.userID)",
                                                      "apns-id": "\(delivery.apnsID)", "attempts": "\(delivery.attempts)"])
        case .failure(let failure):
            metrics.count(failure.dropToken ? .tokenDropped : .failed, reason: failure.reason.label)
            if failure.dropToken {
                logger.info("push token dropped: APNs says it is no longer valid",
                            metadata: ["channel": "\(channel)", "user": "\(member.userID)", "reason": "\(failure.reason.label)"])
                await tokenRejected(channel, member.userID, token)
            } else if !failure.isConfigurationError {
                logger.warning("push not delivered", metadata: ["channel": "\(channel)", "user": "\(member.userID)",
                                                                "reason": "\(failure.reason.label)", "attempts": "\(failure.attempts)"])
            }
        }
    }
}

/// `squelch_pushes_total{outcome, reason}`: every push's ending, by APNs reason.
final class PushMetrics: Sendable {
    enum Outcome: String {
        case delivered, deliveredLeave = "delivered_leave", failed, tokenDropped = "token_dropped"
    }

    private let registry: PrometheusCollectorRegistry

    init(registry: PrometheusCollectorRegistry) {
        self.registry = registry
    }

    func count(_ outcome: Outcome, reason: String) {
        // The registry hands back the same counter for the same labels, so this costs a lookup per push.
        registry.makeCounter(
            descriptor: MetricNameDescriptor(namespace: "squelch", metricName: "pushes", unitName: "total",
                                             helpText: "APNs pushtotalk pushes by outcome and APNs reason."),
            labels: [("outcome", outcome.rawValue), ("reason", reason)]
        ).increment()
    }
}
