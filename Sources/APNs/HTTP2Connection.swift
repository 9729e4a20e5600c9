import Foundation
import NIOConcurrencyHelpers
import NIOCore
import NIOHPACK
import NIOHTTP2
import NIOPosix
import NIOSSL
import NIOTLS

/// One long-lived HTTP/2 connection to APNs.
///
/// The connection's own frames (SETTINGS, GOAWAY, PING) are watched by `ConnectionWatcher`; each push is
/// one stream, run by `PushStreamHandler`. NIOHTTP2 itself holds back streams beyond the server's
/// `MAX_CONCURRENT_STREAMS`; the pool reads the same number to send new pushes to the least loaded connection.
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

    /// Reset streams NIOHTTP2 remembers: more than the pushes one server keeps in flight (1,000).
    static let recentlyResetStreams = 2048

    let id: Int
    let channel: any Channel
    private let multiplexer: NIOHTTP2Handler.StreamMultiplexer
    private let authority: String
    let state: NIOLockedValueBox<State>

    private init(id: Int, channel: any Channel, multiplexer: NIOHTTP2Handler.StreamMultiplexer, authority: String,
                 state: NIOLockedValueBox<State>) {
        self.id = id
        self.channel = channel
        self.multiplexer = multiplexer
        self.authority = authority
        self.state = state
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
        let muxBox = NIOLockedValueBox<NIOHTTP2Handler.StreamMultiplexer?>(nil)
        // SNI must not carry an IP literal; without a hostname NIOSSL checks the certificate against the address.
        let serverHostname: String? = isIPAddress(host) ? nil : host
        // Completed by the server's first SETTINGS, after TLS and ALPN `h2`.
        let handshake = group.any().makePromise(of: Void.self)
        let bootstrap = ClientBootstrap(group: group)
            .connectTimeout(.nanoseconds(Int64(connectTimeout.components.seconds) * 1_000_000_000
                                         + connectTimeout.components.attoseconds / 1_000_000_000))
            .channelOption(.socketOption(.so_keepalive), value: 1)
            .channelOption(.tcpOption(.tcp_nodelay), value: 1)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    let sync = channel.pipeline.syncOperations
                    try sync.addHandler(NIOSSLClientHandler(context: tls, serverHostname: serverHostname))
                    // A push that times out resets its stream; APNs's answer may already be on its way,
                    // and NIOHTTP2 takes a frame for a reset stream it no longer remembers (32 by
                    // default) as a connection error, closing every other push's stream with it.
                    // Remember as many as can be in flight.
                    var connectionConfiguration = NIOHTTP2Handler.ConnectionConfiguration()
                    connectionConfiguration.maximumRecentlyResetStreams = Self.recentlyResetStreams
                    let mux = try sync.configureHTTP2Pipeline(
                        mode: .client, connectionConfiguration: connectionConfiguration, streamConfiguration: .init(),
                        inboundStreamInitializer: { stream in stream.close() })
                    muxBox.withLockedValue { $0 = mux }
                    try sync.addHandler(ConnectionWatcher(state: state, handshake: handshake,
                                                          pingInterval: pingInterval, pingTimeout: pingTimeout))
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
        guard let mux = muxBox.withLockedValue({ $0 }) else {
            channel.close(promise: nil)
            throw APNsConnectionError.setupFailed
        }
        return HTTP2Connection(id: id, channel: channel, multiplexer: mux, authority: host, state: state)
    }

    /// Sends one request and waits for its answer; never throws, because every way it can end is an input to
    /// the delivery policy.
    func send(_ request: APNsRequest, authorization: String, timeout: Duration) async -> APNsAttemptResult {
        let admitted = state.withLockedValue { state -> Bool in
            guard !state.goingAway, !state.closed else { return false }
            state.inFlight += 1
            return true
        }
        guard admitted else { return .transport(.goAway) }
        defer {
            let drained = state.withLockedValue { state in
                state.inFlight -= 1
                return state.retired && state.inFlight == 0
            }
            if drained { channel.close(promise: nil) }
        }

        var headers = HPACKHeaders()
        headers.reserveCapacity(request.headers.count + 5)
        headers.add(name: ":method", value: "POST")
        headers.add(name: ":scheme", value: "https")
        headers.add(name: ":path", value: request.path)
        headers.add(name: ":authority", value: authority)
        // Indexed, so after the first push on a connection the JWT costs a byte or two in HPACK.
        headers.add(name: "authorization", value: authorization)
        for (name, value) in request.headers { headers.add(name: name, value: value) }
        headers.add(name: "content-length", value: String(request.body.count))

        let promise = channel.eventLoop.makePromise(of: APNsAttemptResult.self)
        let state = self.state
        let requestHeaders = headers
        let body = request.body
        // If the stream can't be made (the connection closed meanwhile) the handler may never run; the
        // stream promise settles the push then. A second completion of a NIO promise is ignored.
        let streamCreated = channel.eventLoop.makePromise(of: (any Channel).self)
        streamCreated.futureResult.whenFailure { error in
            promise.succeed(.transport(.connectionLost(String(describing: error))))
        }
        multiplexer.createStreamChannel(promise: streamCreated) { stream in
            stream.eventLoop.makeCompletedFuture {
                try stream.pipeline.syncOperations.addHandler(
                    PushStreamHandler(headers: requestHeaders, body: body, timeout: timeout, connectionState: state, promise: promise))
            }
        }
        let result = (try? await promise.futureResult.get()) ?? .transport(.connectionLost("no result"))
        // An unanswered request may mean a dead path (a NAT or load balancer that lost the flow): PING now
        // rather than after a minute without reads, so that a dead connection is closed and replaced
        // within the PING timeout.
        if case .transport(.timeout) = result { channel.pipeline.fireUserInboundEventTriggered(ConnectionWatcher.ProbeNow()) }
        return result
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

func isIPAddress(_ host: String) -> Bool {
    (try? SocketAddress(ipAddress: host, port: 0)) != nil
}

/// Watches a connection's own frames: the server's stream limit, GOAWAY, and PING keepalive.
final class ConnectionWatcher: ChannelInboundHandler {
    typealias InboundIn = HTTP2Frame
    typealias OutboundOut = HTTP2Frame

    private let state: NIOLockedValueBox<HTTP2Connection.State>
    private let handshake: EventLoopPromise<Void>
    private let pingInterval: TimeAmount
    private let pingTimeout: TimeAmount
    private var readSinceLastTick = false
    private var pingOutstanding = false
    private var pingCounter: UInt64 = 0
    private var ticker: RepeatedTask?
    private var pingDeadline: Scheduled<Void>?

    init(state: NIOLockedValueBox<HTTP2Connection.State>, handshake: EventLoopPromise<Void>,
         pingInterval: Duration, pingTimeout: Duration) {
        self.state = state
        self.handshake = handshake
        self.pingInterval = TimeAmount(pingInterval)
        self.pingTimeout = TimeAmount(pingTimeout)
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        readSinceLastTick = true
        let frame = unwrapInboundIn(data)
        switch frame.payload {
        case .settings(.settings(let settings)):
            for setting in settings where setting.parameter == .maxConcurrentStreams {
                state.withLockedValue { $0.maxConcurrentStreams = setting.value }
            }
            // The server's first SETTINGS carry its stream limit; until they arrive NIOHTTP2 assumes none,
            // and a burst of pushes would open more streams than APNs allows before authentication.
            handshake.succeed(())
        case .goAway:
            // Streams above the GOAWAY's last stream id are closed by NIOHTTP2 and report `.goAway`;
            // the ones below still complete. No new pushes go here.
            state.withLockedValue { $0.goingAway = true }
        case .ping(_, ack: true):
            pingOutstanding = false
            pingDeadline?.cancel()
            pingDeadline = nil
        default:
            break
        }
    }

    /// Asks for a PING at once (unless one is outstanding): a request on this connection timed out.
    struct ProbeNow {}

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if event is ProbeNow {
            ping(context: context)
            return
        }
        if let tls = event as? TLSUserEvent, case .handshakeCompleted(let negotiated) = tls {
            if negotiated == "h2" {
                startKeepalive(context: context)
            } else {
                handshake.fail(APNsConnectionError.noHTTP2(negotiated: negotiated))
                context.close(promise: nil)
            }
        }
        context.fireUserInboundEventTriggered(event)
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        handshake.fail(error)
        context.close(promise: nil)
    }

    func channelInactive(context: ChannelHandlerContext) {
        state.withLockedValue { $0.closed = true }
        handshake.fail(APNsTransportError.closed)
        ticker?.cancel()
        pingDeadline?.cancel()
        context.fireChannelInactive()
    }

    private func startKeepalive(context: ChannelHandlerContext) {
        let contextBox = NIOLoopBound(context, eventLoop: context.eventLoop)
        let selfBox = NIOLoopBound(self, eventLoop: context.eventLoop)
        ticker = context.eventLoop.scheduleRepeatedTask(initialDelay: pingInterval, delay: pingInterval) { _ in
            selfBox.value.tick(context: contextBox.value)
        }
    }

    private func tick(context: ChannelHandlerContext) {
        defer { readSinceLastTick = false }
        guard !readSinceLastTick else { return }
        ping(context: context)
    }

    private func ping(context: ChannelHandlerContext) {
        guard !pingOutstanding, context.channel.isActive else { return }
        pingOutstanding = true
        pingCounter += 1
        context.writeAndFlush(wrapOutboundOut(HTTP2Frame(streamID: .rootStream,
                                                          payload: .ping(HTTP2PingData(withInteger: pingCounter), ack: false))),
                              promise: nil)
        let contextBox = NIOLoopBound(context, eventLoop: context.eventLoop)
        pingDeadline = context.eventLoop.assumeIsolated().scheduleTask(in: pingTimeout) {
            contextBox.value.fireErrorCaught(APNsConnectionError.pingTimedOut)
            contextBox.value.close(promise: nil)
        }
    }
}

enum APNsTransportError: Error { case closed }

/// Runs one push on its own stream: HEADERS and DATA out, the status, `apns-id` and any error body in.
final class PushStreamHandler: ChannelInboundHandler {
    typealias InboundIn = HTTP2Frame.FramePayload
    typealias OutboundOut = HTTP2Frame.FramePayload

    private let headers: HPACKHeaders
    private let body: [UInt8]
    private let timeout: TimeAmount
    private let connectionState: NIOLockedValueBox<HTTP2Connection.State>
    private let promise: EventLoopPromise<APNsAttemptResult>
    private var status: Int?
    private var apnsIDEcho: String?
    private var responseBody: [UInt8] = []
    private var sent = false
    private var done = false
    private var timer: Scheduled<Void>?

    init(headers: HPACKHeaders, body: [UInt8], timeout: Duration, connectionState: NIOLockedValueBox<HTTP2Connection.State>,
         promise: EventLoopPromise<APNsAttemptResult>) {
        self.headers = headers
        self.body = body
        self.timeout = TimeAmount(timeout)
        self.connectionState = connectionState
        self.promise = promise
    }

    func handlerAdded(context: ChannelHandlerContext) {
        let contextBox = NIOLoopBound(context, eventLoop: context.eventLoop)
        let selfBox = NIOLoopBound(self, eventLoop: context.eventLoop)
        timer = context.eventLoop.assumeIsolated().scheduleTask(in: timeout) {
            selfBox.value.finish(.transport(.timeout))
            contextBox.value.close(promise: nil)
        }
        if context.channel.isActive { sendRequest(context: context) }
    }

    func channelActive(context: ChannelHandlerContext) {
        sendRequest(context: context)
        context.fireChannelActive()
    }

    private func sendRequest(context: ChannelHandlerContext) {
        guard !sent else { return }
        sent = true
        context.write(wrapOutboundOut(.headers(.init(headers: headers, endStream: false))), promise: nil)
        var buffer = context.channel.allocator.buffer(capacity: body.count)
        buffer.writeBytes(body)
        context.writeAndFlush(wrapOutboundOut(.data(.init(data: .byteBuffer(buffer), endStream: true))), promise: nil)
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .headers(let frame):
            if status == nil, let value = frame.headers.first(name: ":status") {
                status = Int(value)
                apnsIDEcho = frame.headers.first(name: "apns-id")
            }
            if frame.endStream { complete() }
        case .data(let frame):
            if case .byteBuffer(let buffer) = frame.data, responseBody.count < 4096 {
                responseBody.append(contentsOf: buffer.readableBytesView.prefix(4096 - responseBody.count))
            }
            if frame.endStream { complete() }
        case .rstStream(let code):
            finish(.transport(.connectionLost("stream reset: \(code)")))
        default:
            break
        }
    }

    private func complete() {
        guard let status else {
            finish(.transport(.connectionLost("response without :status")))
            return
        }
        if status == 200 {
            finish(.accepted)
        } else {
            finish(.rejected(APNsErrorResponse.parse(status: status, body: responseBody)))
        }
    }

    func channelInactive(context: ChannelHandlerContext) {
        // A stream closed with no response: if the server sent GOAWAY it did not process this stream, which
        // makes a retry safe; otherwise the connection or stream died under it.
        let goingAway = connectionState.withLockedValue { $0.goingAway }
        finish(.transport(goingAway ? .goAway : .connectionLost("stream closed before the response")))
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        finish(.transport(.connectionLost(String(describing: error))))
        context.close(promise: nil)
    }

    private func finish(_ result: APNsAttemptResult) {
        guard !done else { return }
        done = true
        timer?.cancel()
        promise.succeed(result)
    }
}

extension TimeAmount {
    init(_ duration: Duration) {
        let (seconds, attoseconds) = duration.components
        self = .nanoseconds(seconds * 1_000_000_000 + attoseconds / 1_000_000_000)
    }
}
