import Foundation
import NIOConcurrencyHelpers
import HTTP2Session
import NIOCore
import NIOPosix
import NIOSSL
import NIOTLS

/// One long-lived HTTP/2 connection to APNs.
///
/// The HTTP/2 work is libnghttp2's, in `PushSessionHandler` on the connection's event loop: pushes are
/// handed over in batches (one event-loop task for however many arrive together), each is one stream,
/// and what a batch writes goes out in one flush. libnghttp2 holds back streams beyond the server's
/// `MAX_CONCURRENT_STREAMS`; the pool reads the same number to send new pushes to the least loaded
/// connection.
final class HTTP2Connection: Sendable {
    struct State {
        var inFlight = 0
        /// Until the server's SETTINGS say otherwise, assume APNs' pre-authentication limit of one stream.
        var maxConcurrentStreams = 1
        var goingAway = false
        var closed = false
        /// Taken out of the pool (`retire`): closed once its last request ends.
        var retired = false
    }

    let id: Int
    let channel: any Channel
    private let handler: NIOLoopBound<PushSessionHandler>
    private let authority: String
    let state: NIOLockedValueBox<State>
    /// Pushes waiting for the event loop; the first one in schedules the task that takes them all.
    private let submissions: NIOLockedValueBox<PushQueue>

    private init(id: Int, channel: any Channel, handler: NIOLoopBound<PushSessionHandler>, authority: String,
                 state: NIOLockedValueBox<State>, submissions: NIOLockedValueBox<PushQueue>) {
        self.id = id
        self.channel = channel
        self.handler = handler
        self.authority = authority
        self.state = state
        self.submissions = submissions
    }

    /// True while new pushes may go on this connection.
    var isUsable: Bool { state.withLockedValue { !$0.goingAway && !$0.closed } }

    /// In-flight pushes as a share of what the server allows at once.
    var load: Double {
        state.withLockedValue { Double($0.inFlight) / Double(max($0.maxConcurrentStreams, 1)) }
    }

    static func connect(id: Int, group: any EventLoopGroup, host: String, port: Int, tls: NIOSSLContext,
                        connectTimeout: Duration, pingInterval: Duration, pingTimeout: Duration) async throws -> HTTP2Connection {
        let state = NIOLockedValueBox(State())
        let submissions = NIOLockedValueBox(PushQueue())
        let handlerBox = NIOLockedValueBox<NIOLoopBound<PushSessionHandler>?>(nil)
        // SNI must not carry an IP literal; without a hostname NIOSSL checks the certificate against the address.
        let serverHostname: String? = isIPAddress(host) ? nil : host
        // Completed by the server's first SETTINGS, after TLS and ALPN `h2`.
        let handshake = group.any().makePromise(of: Void.self)
        let bootstrap = ClientBootstrap(group: group)
            .connectTimeout(TimeAmount(connectTimeout))
            .channelOption(.socketOption(.so_keepalive), value: 1)
            .channelOption(.tcpOption(.tcp_nodelay), value: 1)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    let sync = channel.pipeline.syncOperations
                    try sync.addHandler(NIOSSLClientHandler(context: tls, serverHostname: serverHostname))
                    let handler = try PushSessionHandler(state: state, submissions: submissions, handshake: handshake,
                                                         pingInterval: pingInterval, pingTimeout: pingTimeout)
                    try sync.addHandler(handler)
                    handlerBox.withLockedValue { $0 = NIOLoopBound(handler, eventLoop: channel.eventLoop) }
                }
            }
        let channel: any Channel
        do {
            channel = try await bootstrap.connect(host: host, port: port).get()
        } catch {
            handshake.fail(error)
            throw error
        }
        // TCP is up; TLS and the server's SETTINGS get as long again. NIOSSL has no handshake timeout of
        // its own, so a peer (a firewall, a stalled proxy) that accepts TCP and then says nothing would
        // hold every push waiting for this connection until TCP keepalive gave up, many minutes later.
        let stalled = channel.eventLoop.scheduleTask(in: TimeAmount(connectTimeout)) {
            handshake.fail(APNsConnectionError.handshakeTimedOut)
        }
        defer { stalled.cancel() }
        do {
            try await handshake.futureResult.get()
        } catch {
            channel.close(promise: nil)
            throw error
        }
        guard let handler = handlerBox.withLockedValue({ $0 }) else {
            channel.close(promise: nil)
            throw APNsConnectionError.setupFailed
        }
        return HTTP2Connection(id: id, channel: channel, handler: handler, authority: host, state: state, submissions: submissions)
    }

    /// Sends requests together and waits for all their answers, in order; never throws, because every
    /// way a request can end is an input to the delivery policy. One hand-over to the event loop for
    /// the lot (a burst's wakes), and for requests that other callers hand over meanwhile.
    func send(_ requests: [APNsRequest], jwt: String, timeout: Duration) async -> [APNsAttemptResult] {
        guard !requests.isEmpty else { return [] }
        let admitted = state.withLockedValue { state -> Bool in
            guard !state.goingAway, !state.closed else { return false }
            state.inFlight += requests.count
            return true
        }
        guard admitted else { return Array(repeating: .transport(.goAway), count: requests.count) }
        defer {
            let drained = state.withLockedValue { state in
                state.inFlight -= requests.count
                return state.retired && state.inFlight == 0
            }
            if drained { channel.close(promise: nil) }
        }

        let deadline = NIODeadline.now() + TimeAmount(timeout)
        let results = await withCheckedContinuation { continuation in
            let batch = PushBatch(count: requests.count, continuation: continuation)
            let pushes = requests.enumerated().map { index, request in
                PendingPush(headers: headers(of: request, jwt: jwt), body: request.body, deadline: deadline, batch: batch, index: index)
            }
            let first = submissions.withLockedValue { queue -> Bool? in
                guard !queue.closed else { return nil }
                queue.waiting.append(contentsOf: pushes)
                return queue.waiting.count == pushes.count
            }
            guard let first else {
                for push in pushes { push.finish(.transport(.goAway)) }  // closed meanwhile, before anything was sent
                return
            }
            // One event-loop task per hand-over: pushes arriving while it waits join it.
            if first {
                let handler = self.handler
                channel.eventLoop.execute { handler.value.submitWaiting() }
            }
        }
        // An unanswered request may mean a dead path (a NAT or load balancer that lost the flow): PING now
        // rather than after a minute without reads, so that a dead connection is closed and replaced
        // within the PING timeout.
        if results.contains(.transport(.timeout)) { channel.pipeline.fireUserInboundEventTriggered(PushSessionHandler.ProbeNow()) }
        return results
    }

    /// A request's header fields as they go on the wire.
    private func headers(of request: APNsRequest, jwt: String) -> HTTP2HeaderList {
        var headers = HTTP2HeaderList()
        headers.add(":method", "POST")
        headers.add(":scheme", "https")
        headers.add(":path", request.path)
        headers.add(":authority", authority)
        // Indexed, so after the first push on a connection the JWT costs a byte or two in HPACK.
        headers.add("authorization", "bearer ", jwt)
        request.forEachHeader { headers.add($0, $1) }
        headers.add("content-length", String(request.body.count))
        return headers
    }

    func close() async {
        try? await channel.close()
    }

    /// Out of the pool of this side's own accord: no new request, the ones it carries finish.
    func withdraw() {
        state.withLockedValue { $0.goingAway = true }
        retire()
    }

    /// Out of the pool (after a GOAWAY): the requests it still carries finish, then it closes. APNs
    /// closes such a connection itself, but a proxy between may keep it open, and nothing else would.
    func retire() {
        let idle = state.withLockedValue { state in
            state.retired = true
            return state.inFlight == 0
        }
        if idle { channel.close(promise: nil) }
    }
}

enum APNsConnectionError: Error, CustomStringConvertible {
    case setupFailed
    case noHTTP2(negotiated: String?)
    case pingTimedOut
    case handshakeTimedOut
    /// Every slot's last attempt failed, and none may try again yet.
    case coolingDown(lastFailure: String, retryIn: Duration)

    var description: String {
        switch self {
        case .setupFailed: return "HTTP/2 pipeline setup failed"
        case .noHTTP2(let negotiated): return "the server did not negotiate HTTP/2 (ALPN: \(negotiated ?? "none"))"
        case .handshakeTimedOut: return "TLS or HTTP/2 setup got no answer in time after TCP connected"
        case .pingTimedOut: return "PING unanswered; connection presumed dead"
        case .coolingDown(let failure, let wait):
            return "no APNs connection (the last attempt failed: \(failure)); the next attempt in \(wait.formatted(.units(allowed: [.seconds, .milliseconds], width: .narrow)))"
        }
    }
}

enum APNsTransportError: Error { case closed }

func isIPAddress(_ host: String) -> Bool {
    (try? SocketAddress(ipAddress: host, port: 0)) != nil
}

extension TimeAmount {
    init(_ duration: Duration) {
        let (seconds, attoseconds) = duration.components
        self = .nanoseconds(seconds * 1_000_000_000 + attoseconds / 1_000_000_000)
    }
}
