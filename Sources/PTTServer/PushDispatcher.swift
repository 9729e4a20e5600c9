import APNs
import ChannelProtocol
import ChannelStore
import Foundation
import Logging
import NIOConcurrencyHelpers
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

/// Sends the pushes the channel hub asks for, each by its token's kind: Apple's to APNs (`APNsRoute`),
/// `device` tokens to squelchd's own `DevicePushService`. What it sends: a wake to each sleeping member when a burst starts, and a
/// leave push when an administrator removes a member or deletes a channel.
///
/// The hub's event loop only hands jobs over (a short lock, no waiting), so the relay never waits for
/// APNs. `PushSchedule` decides what goes out and when: one job per member waiting, wakes to one member
/// at least a second apart, at most 1,000 pushes in flight. Each push follows the APNs client's failure
/// policy; a token APNs calls dead is reported through `tokenRejected`, which clears it in the hub and
/// the store.
public final class PushDispatcher: Service, Sendable {
    typealias Job = PushSchedule.Job

    private let route: APNsRoute?
    private let devices: DevicePushService?
    private let schedule: NIOLockedValueBox<PushSchedule>
    /// Jobs handed over by the hub's loop, in order, for the dispatcher's task to queue: queuing a
    /// burst's 10,000 sleepers in the schedule held the relay's loop for tens of milliseconds.
    private let arrivals = NIOLockedValueBox<[Arrival]>([])

    private enum Arrival {
        case wake(channel: UUID, speaker: String, members: [MemberRecord])
        case leave(channel: UUID, member: MemberRecord)
    }
    /// Rung whenever the schedule may have something new to hand out: a job queued, a push ended, a held
    /// wake's interval over, shutdown. One pending ring is enough, so it buffers one.
    private let doorbell: AsyncStream<Void>
    private let ring: AsyncStream<Void>.Continuation
    private let metrics: PushMetrics
    private let health = NIOLockedValueBox(PushHealth())
    private let logger: Logger
    private let tokenRejected: @Sendable (_ channel: UUID, _ user: String, _ token: String) async -> Void

    /// - Parameters:
    ///   - route: where Apple's tokens go; nil with pushes to Apple off.
    ///   - devices: where `device` tokens go; nil with the device push service off.
    public init(route: APNsRoute?, devices: DevicePushService? = nil, registry: PrometheusCollectorRegistry, logger: Logger,
                tokenRejected: @escaping @Sendable (UUID, String, String) async -> Void) {
        self.route = route
        self.devices = devices
        self.schedule = NIOLockedValueBox(PushSchedule())
        self.metrics = PushMetrics(registry: registry)
        self.logger = logger
        self.tokenRejected = tokenRejected
        (doorbell, ring) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
    }

    /// The kinds of push token delivered: Apple's with APNs on, `device` with the device push service on.
    public var kinds: Set<PushEnvironment> {
        var kinds: Set<PushEnvironment> = route != nil ? [.production, .sandbox] : []
        if devices != nil { kinds.insert(.device) }
        return kinds
    }

    /// Whether pushes are getting through, for `/healthz`.
    public var pushHealth: PushHealth { health.withLockedValue { $0 } }

    /// Hands over a wake for each member. Never waits, and costs the caller one append.
    public func wake(channel: UUID, speaker: String, members: [MemberRecord]) {
        arrivals.withLockedValue { $0.append(.wake(channel: channel, speaker: speaker, members: members)) }
        ring.yield()
    }

    /// Hands over a leave push. Never waits.
    public func leave(channel: UUID, member: MemberRecord) {
        arrivals.withLockedValue { $0.append(.leave(channel: channel, member: member)) }
        ring.yield()
    }

    /// Queues what was handed over, in the order it came.
    private func admitArrivals() {
        let waiting = arrivals.withLockedValue { arrivals in
            defer { arrivals.removeAll() }
            return arrivals
        }
        guard !waiting.isEmpty else { return }
        let now = ContinuousClock.now
        let results = schedule.withLockedValue { schedule in
            waiting.flatMap { arrival -> [PushSchedule.Enqueued] in
                switch arrival {
                case .wake(let channel, let speaker, let members):
                    return members.map { schedule.enqueue(.wake(channel: channel, speaker: speaker, member: $0), now: now) }
                case .leave(let channel, let member):
                    return [schedule.enqueue(.leave(channel: channel, member: member), now: now)]
                }
            }
        }
        for result in results { count(result) }
    }

    private func count(_ result: PushSchedule.Enqueued) {
        switch result {
        case .queued, .closed: break
        case .replaced: metrics.count(.coalesced, reason: "NewerPush")
        case .superfluous: metrics.count(.coalesced, reason: "LeaveWaiting")
        case .full: metrics.count(.failed, reason: "QueueFull")
        }
    }

    public func run() async throws {
        // Opening the connections before the first burst keeps TLS out of the first wake's time.
        for client in route?.clients ?? [] { Task { await client.preconnect() } }
        // On shutdown what is already waiting still goes out at once (held wakes included), each push
        // within its 2 s budget, and then the connections close.
        await withGracefulShutdownHandler {
            await self.dispatch()
        } onGracefulShutdown: {
            self.admitArrivals()
            self.schedule.withLockedValue { $0.finish(now: .now) }
            self.ring.yield()
        }
        for client in route?.clients ?? [] { await client.shutdown() }
    }

    private func dispatch() async {
        await withDiscardingTaskGroup { group in
            var bell = doorbell.makeAsyncIterator()
            var timerArmedFor: ContinuousClock.Instant?
            loop: while true {
                admitArrivals()
                let now = ContinuousClock.now
                let (next, stale) = schedule.withLockedValue { ($0.next(now: now), $0.takeStale()) }
                if stale > 0 { metrics.count(.failed, reason: "Stale", by: stale) }
                switch next {
                case .send(let job):
                    // Every job ready now goes in one batch (a burst's wakes): one call to APNs's client
                    // for the lot, not a task and a wait per push.
                    var batch = [job]
                    while batch.count < Self.batchLimit,
                          case .send(let more) = schedule.withLockedValue({ $0.next(now: .now) }) {
                        batch.append(more)
                    }
                    group.addTask {
                        await self.deliver(batch)
                        self.schedule.withLockedValue { schedule in
                            for job in batch { schedule.complete(job.key, now: .now) }
                        }
                        self.ring.yield()
                    }
                    continue loop
                case .finished:
                    break loop
                case .wait(let deadline):
                    // One timer per deadline: the schedule reports the earliest, so a later report only
                    // needs a timer if the armed one has fired.
                    if timerArmedFor.map({ $0 > deadline || $0 <= now }) ?? true {
                        timerArmedFor = deadline
                        group.addTask {
                            try? await Task.sleep(until: deadline, clock: .continuous)
                            self.ring.yield()
                        }
                    }
                case .busy, .idle:
                    break
                }
                // nil only when this task is cancelled (the service group tearing down after a
                // failure): nothing will ring again, and what waits can't be sent any more.
                guard await bell.next() != nil else { break loop }
            }
            // Timers still sleeping have nothing left to wake.
            group.cancelAll()
        }
    }

    /// Jobs handed to APNs's client in one call at most: a batch's slots in the schedule free together,
    /// so two batches at the schedule's limit of 1,000 keep one slow push from holding every slot.
    static let batchLimit = 500

    private func deliver(_ jobs: [Job]) async {
        struct Push {
            var channel: UUID
            var member: MemberRecord
            var speaker: String?
            var token: String
        }
        var byClient: [ObjectIdentifier: (client: APNsClient, pushes: [Push])] = [:]
        var toDevices: [Push] = []
        for job in jobs {
            let push: Push
            switch job {
            case .wake(let channel, let speaker, let member):
                guard let token = member.pushToken else { continue }
                push = Push(channel: channel, member: member, speaker: speaker, token: token)
            case .leave(let channel, let member):
                guard let token = member.pushToken else { continue }
                push = Push(channel: channel, member: member, speaker: nil, token: token)
            }
            if push.member.pushEnvironment == .device {
                toDevices.append(push)
            } else if let route {
                let client = route.client(for: push.member.pushEnvironment)
                byClient[ObjectIdentifier(client), default: (client, [])].pushes.append(push)
            } else {
                metrics.count(.failed, reason: "APNsOff")
            }
        }
        // Apple's two environments and the device streams side by side: a device push forwarded
        // in a cluster waits for the database, which Apple's must not wait behind.
        let devicePushes = toDevices
        await withDiscardingTaskGroup { group in
            if !devicePushes.isEmpty {
                group.addTask {
                    for push in devicePushes {
                        await self.deliverToDevice(push.channel, member: push.member, speaker: push.speaker, token: push.token)
                    }
                }
            }
            for (client, pushes) in byClient.values {
                group.addTask {
                    let results = await client.send(
                        PushToTalkNotification.batch(pushes.map { ($0.token, $0.speaker, $0.channel) }),
                        tokensRegisteredAt: pushes.map(\.member.pushRegisteredAt))
                    for (push, result) in zip(pushes, results) {
                        await self.report(result, channel: push.channel, member: push.member, speaker: push.speaker, token: push.token)
                    }
                }
            }
        }
    }

    /// A push for squelchd's own device push service: handed to the device's stream, at once.
    private func deliverToDevice(_ channel: UUID, member: MemberRecord, speaker: String?, token: String) async {
        guard let devices else {
            metrics.count(.failed, reason: "DevicePushOff")
            return
        }
        let notification = PushToTalkNotification(deviceToken: token, activeSpeaker: speaker, channel: channel)
        switch await devices.deliver(notification, to: member) {
        case .forwarded:
            metrics.count(.forwarded, reason: "OtherNode")
            logger.debug("device push forwarded to the other nodes", metadata: ["channel": "\(channel)", "user": "\(member.userID)"])
        case .local(.delivered):
            metrics.count(speaker == nil ? .deliveredLeave : .delivered, reason: "Success")
            logger.debug("device push delivered", metadata: ["channel": "\(channel)", "user": "\(member.userID)", "id": "\(notification.id.lowercaseString)"])
        case .local(.notConnected):
            // As APNs does with apns-expiration 0: a device that is not there now misses the push,
            // and the token stays (it opens its stream again when it can).
            metrics.count(.undelivered, reason: "DeviceNotConnected")
            logger.info("device push not delivered: the device has no push stream open", metadata: ["channel": "\(channel)", "user": "\(member.userID)"])
        case .local(.heldByAnother):
            metrics.count(.undelivered, reason: "TokenOfAnotherMember")
            logger.warning("device push not delivered: the token's stream was opened by another member", metadata: ["channel": "\(channel)", "user": "\(member.userID)"])
        }
    }

    /// Counts, logs and acts on one push's ending.
    private func report(_ result: Result<APNsDelivery, APNsPushFailure>, channel: UUID, member: MemberRecord, speaker: String?,
                        token: String) async {
        switch result {
        case .success(let delivery):
            noteHealth { $0.delivered(at: Date()) }
            metrics.count(speaker == nil ? .deliveredLeave : .delivered, reason: "Success")
            logger.debug("push delivered", metadata: ["channel": "\(channel)", "user": "\(member.userID)",
                                                      "apns-id": "\(delivery.apnsID)", "attempts": "\(delivery.attempts)"])
        case .failure(let failure):
            noteHealth { $0.failed(failure, at: Date()) }
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

extension PushDispatcher {
    /// Applies a result to the health and logs the moments it turns: once when pushes start failing
    /// (so a broken key is an error in the log, not only a metric), once when they recover.
    private func noteHealth(_ change: (inout PushHealth) -> Void) {
        let (before, after) = health.withLockedValue { health -> (PushHealth, PushHealth) in
            let before = health
            change(&health)
            // Under the lock: pushes end side by side, and set out of order the gauge could stay 1
            // after the health said ok.
            metrics.failing.set(Int64(health.isFailing ? 1 : 0))
            return (before, health)
        }
        if !before.isFailing, after.isFailing {
            logger.error("wake pushes are failing; members who are not connected are not woken",
                         metadata: ["problem": "\(after.lastProblem ?? "")", "failures": "\(after.failuresSinceDelivery)"])
        } else if before.isFailing, !after.isFailing {
            logger.notice("wake pushes are getting through again",
                          metadata: ["failingSince": "\(before.failingSince.map { "\($0)" } ?? "")"])
        }
    }
}

/// `squelch_pushes_total{outcome, reason}`: every push's ending, by APNs reason.
final class PushMetrics: Sendable {
    enum Outcome: String {
        case delivered, deliveredLeave = "delivered_leave", failed, tokenDropped = "token_dropped"
        /// Replaced by a newer push to the same member before it went out.
        case coalesced
        /// A device push with no stream of its member's open for its token: the device is off, or
        /// between two connections.
        case undelivered
        /// A device push whose stream is not on this node, handed to a cluster's other nodes.
        case forwarded
    }

    private let registry: PrometheusCollectorRegistry
    /// `squelch_push_failing`: 1 while `PushHealth` says pushes are failing.
    let failing: Gauge

    init(registry: PrometheusCollectorRegistry) {
        self.registry = registry
        failing = registry.makeGauge(descriptor: MetricNameDescriptor(
            namespace: "squelch", metricName: "push_failing", unitName: "",
            helpText: "1 while wake pushes are failing on the server's side (APNs configuration, no connection to APNs, repeated timeouts or 5xx), else 0; /healthz says why (to the admin key)."))
        // The main series exist from the start, at 0: an alert on the rate of delivered or failed
        // pushes otherwise sees no data at all until the first push, which looks like a broken scrape.
        count(.delivered, reason: "Success", by: 0)
        count(.failed, reason: "QueueFull", by: 0)
    }

    func count(_ outcome: Outcome, reason: String, by amount: Int = 1) {
        // The registry hands back the same counter for the same labels, so this costs a lookup per push.
        registry.makeCounter(
            descriptor: MetricNameDescriptor(namespace: "squelch", metricName: "pushes", unitName: "total",
                                             helpText: "pushtotalk pushes (APNs and the device push service) by outcome and reason (Stale: a wake that waited past 90 s, dropped; DeviceNotConnected: no push stream open for a device token)."),
            labels: [("outcome", outcome.rawValue), ("reason", reason)]
        ).increment(by: Int64(amount))
    }
}
