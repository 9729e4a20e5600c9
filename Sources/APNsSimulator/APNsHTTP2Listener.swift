import CNGHTTP2
import Foundation
import HTTP2Session
import NIOCore
import NIOPosix
import NIOSSL
import NIOTLS
import RandomUUID

/// The APNs port: TLS, ALPN `h2`, HTTP/2 on libnghttp2's server session (`HTTP2ServerSession`, driven
/// by `APNsConnection` below TLS), one connection per TCP connection.
enum APNsHTTP2Listener {
    /// Apple's observed initial settings, with one stream until the first valid JWT (as seen from api.push.apple.com).
    static let initialSettings: [(id: Int32, value: UInt32)] = [
        (Int32(NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS.rawValue), 1),
        (Int32(NGHTTP2_SETTINGS_HEADER_TABLE_SIZE.rawValue), 4096),
        (Int32(NGHTTP2_SETTINGS_MAX_FRAME_SIZE.rawValue), 16384),
        (Int32(NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE.rawValue), 8000),
    ]

    static func bind(core: SimulatorCore, verifier: any ProviderTokenVerifying, tls: NIOSSLContext) async throws -> any Channel {
        let configuration = core.configuration
        let bootstrap = ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .serverChannelOption(.backlog, value: 256)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelOption(.socketOption(.tcp_nodelay), value: 1)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    let id = core.connectionOpened(channel)
                    channel.closeFuture.whenComplete { _ in core.connectionClosed(id) }
                    let sync = channel.pipeline.syncOperations
                    try sync.addHandler(NIOSSLServerHandler(context: tls))
                    try sync.addHandler(APNsConnection(
                        id: id, core: core,
                        validator: APNsRequestValidator(verifier: verifier, allowedTopics: configuration.allowedTopics)))
                }
            }
        do {
            return try await bootstrap.bind(host: configuration.host, port: configuration.port).get()
        } catch {
            throw APNsSimulatorError.bindFailed(what: "APNs simulator (HTTP/2)", host: configuration.host,
                                                port: configuration.port, underlying: APNsSimulatorError.bindReason(error))
        }
    }
}

/// One TCP connection, below TLS: drives its `HTTP2ServerSession`, has each complete request judged, and
/// answers it (after the fault plan's delay); sends new SETTINGS after the first valid JWT and GOAWAY
/// when the plan says so. Lives on the connection's event loop.
final class APNsConnection: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    let id: Int
    let core: SimulatorCore
    var validator: APNsRequestValidator
    private let session: HTTP2ServerSession
    private var context: ChannelHandlerContext?
    private var requests = 0
    /// Set by the GOAWAY the fault plan asks for: the last stream it lets through.
    private var goAwayLastStreamID: Int32?
    /// The highest stream opened so far, in wire order (libnghttp2 has parsed further by the time its
    /// events are handled).
    private var highestOpened: Int32 = 0
    private var goingAway: Bool { goAwayLastStreamID != nil }

    init(id: Int, core: SimulatorCore, validator: APNsRequestValidator) throws {
        self.id = id
        self.core = core
        self.validator = validator
        session = try HTTP2ServerSession(settings: APNsHTTP2Listener.initialSettings, maximumBodyBytes: APNsLimits.storedBodyBytes)
    }

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        self.context = nil
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        // Apple speaks HTTP/2 only: a client that doesn't offer h2 in ALPN is hung up on.
        if let tls = event as? TLSUserEvent, case .handshakeCompleted(let negotiated) = tls {
            guard negotiated == "h2" else {
                context.close(promise: nil)
                return
            }
            flush()  // the server's SETTINGS
        }
        context.fireUserInboundEventTriggered(event)
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let buffer = unwrapInboundIn(data)
        do {
            try buffer.withUnsafeReadableBytes { bytes in try session.receive(bytes) }
        } catch {
            // Not HTTP/2 at all (no preface): nothing to say in HTTP/2 terms.
            context.close(promise: nil)
            return
        }
        handleEvents()
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        flush()
        context.fireChannelReadComplete()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        context.close(promise: nil)
    }

    /// Writes whatever the session has for the client in one buffer, and closes a connection that is over.
    private func flush() {
        guard let context else { return }
        var buffer: ByteBuffer?
        do {
            try session.send { chunk in
                if buffer == nil { buffer = context.channel.allocator.buffer(capacity: max(chunk.count, 4_096)) }
                buffer!.writeBytes(chunk)
            }
        } catch {
            context.close(promise: nil)
            return
        }
        handleEvents()
        if let buffer { context.writeAndFlush(wrapOutboundOut(buffer), promise: nil) }
        if !session.isAlive || (goingAway && session.openStreams == 0) {
            // On the next tick, once TLS has written what this flush handed it.
            let context = NIOLoopBound(context, eventLoop: context.eventLoop)
            context.value.eventLoop.assumeIsolated().execute { context.value.close(promise: nil) }
        }
    }

    private func handleEvents() {
        session.drainEvents { event in
            switch event {
            case .opened(let id, let open):
                highestOpened = max(highestOpened, id)
                core.noteStreamsInFlight(open)
            case .request(let request):
                // Above the GOAWAY's last stream ID a request is not processed (the client retries it).
                if let last = goAwayLastStreamID, request.streamID > last { return }
                answer(request)
            case .closed:
                break
            }
        }
    }

    /// Judges one complete request and answers it, now or after the plan's delay.
    private func answer(_ stream: HTTP2ServerSession.Request) {
        let receivedAt = core.now()
        var method: String?
        var path: String?
        var headers: [(name: String, value: String)] = []
        headers.reserveCapacity(stream.headers.count)
        for (name, value) in stream.headers {
            switch name {
            case ":method": method = method ?? value
            case ":path": path = path ?? value
            case _ where name.hasPrefix(":"): break
            default: headers.append((name, value))
            }
        }
        let request = APNsRequest(method: method, path: path, headers: headers, body: stream.body, bodyLength: stream.bodyLength)
        let streamID = stream.streamID
        let apnsID = APNsRequestValidator.echoableAPNsID(of: request) ?? UUID.randomVersion4().lowercaseString
        switch validate(request, receivedAt: receivedAt) {
        case .invalid(let reason, let token):
            core.record(APNsRejection(status: reason.status, reason: reason.rawValue, token: token, apnsID: apnsID,
                                      injected: false, receivedAt: receivedAt))
            respond(streamID, status: reason.status, apnsID: apnsID, reason: reason.rawValue, timestamp: nil)

        case .valid(let push):
            let (fault, delay) = core.decideFault(token: push.token)
            if let fault, fault.status == 403 {
                validator.retractLastTokenChange()
            }
            let body = String(decoding: stream.body, as: UTF8.self)
            let core = core, connectionID = id
            let answer = { (connection: APNsConnection) in
                if let fault {
                    core.record(APNsRejection(status: fault.status, reason: fault.reason, token: push.token, apnsID: apnsID,
                                              injected: true, receivedAt: receivedAt))
                    connection.respond(streamID, status: fault.status, apnsID: apnsID, reason: fault.reason, timestamp: fault.timestamp)
                } else {
                    core.record(APNsAcceptedPush(
                        apnsID: apnsID, token: push.token, topic: push.topic, pushType: push.pushType, priority: push.priority,
                        expiration: push.expiration, collapseID: push.collapseID, body: body, keyID: push.keyID,
                        teamID: push.teamID, connection: connectionID, streamID: Int(streamID), receivedAt: receivedAt),
                        bodyIsJSONObject: push.bodyIsJSONObject)
                    connection.respond(streamID, status: 200, apnsID: apnsID, reason: nil, timestamp: nil)
                }
            }
            if delay > 0, let context {
                let connection = NIOLoopBound(self, eventLoop: context.eventLoop)
                context.eventLoop.assumeIsolated().scheduleTask(in: .milliseconds(Int64(delay))) {
                    answer(connection.value)
                    connection.value.flush()
                }
            } else {
                answer(self)
            }
        }
    }

    /// Validates one complete request, and queues what the connection owes for it: new SETTINGS after
    /// the first valid JWT, GOAWAY when the fault plan says this was the last request.
    private func validate(_ request: APNsRequest, receivedAt: Date) -> APNsVerdict {
        requests += 1
        let wasAuthenticated = validator.session.isAuthenticated
        let verdict = validator.validate(request, now: receivedAt)
        if !wasAuthenticated, validator.session.isAuthenticated {
            try? session.submitSettings([(Int32(NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS.rawValue),
                                          UInt32(core.configuration.maxConcurrentStreams))])
        }
        if !goingAway, let limit = core.connectionFaults().goAwayAfterRequests, requests >= limit {
            // As Apple shuts a connection down: the streams already open are still answered, and the
            // connection closes when the last of them is done.
            goAwayLastStreamID = highestOpened
            core.noteGoAway()
            session.goAway(lastStreamID: highestOpened, errorCode: NGHTTP2_NO_ERROR.rawValue,
                           debugData: Array(#"{"reason":"Shutdown"}"#.utf8))
        }
        return verdict
    }

    /// Apple's answer: `:status` and `apns-id` always; `apns-unique-id` and no body on success; a JSON
    /// `{"reason"}` body (with `timestamp` when given) on error.
    private func respond(_ streamID: Int32, status: Int, apnsID: String, reason: String?, timestamp: Int64?) {
        var headers = HTTP2HeaderList(bytes: 160, fields: 5)
        headers.add(":status", String(status))
        headers.add("apns-id", apnsID)
        guard let reason else {
            headers.add("apns-unique-id", UUID.randomVersion4().lowercaseString)
            try? session.respond(streamID: streamID, headers: headers, body: nil)
            return
        }
        let json = Array(APNsErrorBody.json(reason: reason, timestamp: timestamp).utf8)
        headers.add("content-type", "application/json")
        headers.add("content-length", String(json.count))
        try? session.respond(streamID: streamID, headers: headers, body: json)
    }
}

/// The error body's JSON, keys sorted as Apple's are (`reason`, then `timestamp`).
enum APNsErrorBody {
    private struct Body: Encodable {
        var reason: String
        var timestamp: Int64?
    }

    static func json(reason: String, timestamp: Int64?) -> String {
        let encoder = JSONEncoder()
        encoder.outputFormatting = .sortedKeys
        let data = (try? encoder.encode(Body(reason: reason, timestamp: timestamp))) ?? Data(#"{"reason":"InternalServerError"}"#.utf8)
        return String(decoding: data, as: UTF8.self)
    }
}
