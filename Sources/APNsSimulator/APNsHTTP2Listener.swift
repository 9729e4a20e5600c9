import Foundation
import NIOCore
import NIOHTTP2
import NIOPosix
import NIOSSL
import RandomUUID

/// The APNs port: TLS, ALPN `h2`, HTTP/2, one `APNsConnection` per TCP connection.
enum APNsHTTP2Listener {
    /// Apple's observed initial settings, with one stream until the first valid JWT (as seen from api.push.apple.com).
    static let initialSettings: HTTP2Settings = [
        HTTP2Setting(parameter: .maxConcurrentStreams, value: 1),
        HTTP2Setting(parameter: .headerTableSize, value: 4096),
        HTTP2Setting(parameter: .maxFrameSize, value: 16384),
        HTTP2Setting(parameter: .maxHeaderListSize, value: 8000),
    ]

    static func bind(core: SimulatorCore, verifier: any ProviderTokenVerifying, tls: NIOSSLContext) async throws -> any Channel {
        let configuration = core.configuration
        let bootstrap = ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .serverChannelOption(.backlog, value: 256)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelOption(.socketOption(.tcp_nodelay), value: 1)
            .childChannelInitializer { channel in
                let id = core.connectionOpened(channel)
                channel.closeFuture.whenComplete { _ in core.connectionClosed(id) }
                do {
                    try channel.pipeline.syncOperations.addHandler(NIOSSLServerHandler(context: tls))
                } catch {
                    return channel.eventLoop.makeFailedFuture(error)
                }
                // Apple speaks HTTP/2 only: a client that doesn't offer h2 in ALPN is hung up on.
                return channel.configureHTTP2SecureUpgrade(
                    h2ChannelConfigurator: { channel in
                        channel.eventLoop.makeCompletedFuture {
                            try configureHTTP2(channel, connectionID: id, core: core, verifier: verifier)
                        }
                    },
                    http1ChannelConfigurator: { channel in channel.close() })
            }
        do {
            return try await bootstrap.bind(host: configuration.host, port: configuration.port).get()
        } catch {
            throw APNsSimulatorError.bindFailed(what: "APNs simulator (HTTP/2)", host: configuration.host,
                                                port: configuration.port, underlying: APNsSimulatorError.bindReason(error))
        }
    }

    private static func configureHTTP2(_ channel: any Channel, connectionID: Int, core: SimulatorCore,
                                       verifier: any ProviderTokenVerifying) throws {
        let connection = NIOLoopBound(
            APNsConnection(id: connectionID, channel: channel, core: core,
                           validator: APNsRequestValidator(verifier: verifier, allowedTopics: core.configuration.allowedTopics)),
            eventLoop: channel.eventLoop)
        var connectionConfiguration = NIOHTTP2Handler.ConnectionConfiguration()
        connectionConfiguration.initialSettings = initialSettings
        _ = try channel.pipeline.syncOperations.configureHTTP2Pipeline(
            mode: .server, connectionConfiguration: connectionConfiguration, streamConfiguration: .init(),
            inboundStreamInitializer: { stream in
                stream.eventLoop.makeCompletedFuture {
                    let streamID = try stream.syncOptions?.getOption(HTTP2StreamChannelOptions.streamID)
                    let connection = connection.value
                    connection.streamOpened(stream, id: streamID.map { Int($0) } ?? 0)
                    try stream.pipeline.syncOperations.addHandler(APNsStreamHandler(connection: connection))
                }
            })
    }
}

/// One TCP connection's state. Lives on the connection's event loop, as do all its streams.
final class APNsConnection {
    let id: Int
    let channel: any Channel
    let core: SimulatorCore
    var validator: APNsRequestValidator
    private var requests = 0
    private var openStreams = 0
    private var highestStreamID = 0
    private var goingAway = false

    init(id: Int, channel: any Channel, core: SimulatorCore, validator: APNsRequestValidator) {
        self.id = id
        self.channel = channel
        self.core = core
        self.validator = validator
    }

    func streamOpened(_ stream: any Channel, id streamID: Int) {
        openStreams += 1
        highestStreamID = max(highestStreamID, streamID)
        core.noteStreamsInFlight(openStreams)
        stream.closeFuture.assumeIsolated().whenComplete { _ in
            self.openStreams -= 1
            if self.goingAway, self.openStreams == 0 { self.closeSoon() }
        }
    }

    /// Validates one complete request, and sends what the connection owes for it: new SETTINGS after
    /// the first valid JWT, GOAWAY when the fault plan says this was the last request.
    func validate(_ request: APNsRequest, receivedAt: Date) -> APNsVerdict {
        requests += 1
        let wasAuthenticated = validator.session.isAuthenticated
        let verdict = validator.validate(request, now: receivedAt)
        if !wasAuthenticated, validator.session.isAuthenticated {
            let settings = [HTTP2Setting(parameter: .maxConcurrentStreams, value: core.configuration.maxConcurrentStreams)]
            channel.writeAndFlush(HTTP2Frame(streamID: .rootStream, payload: .settings(.settings(settings))), promise: nil)
        }
        if !goingAway, let limit = core.connectionFaults().goAwayAfterRequests, requests >= limit {
            goAway()
        }
        return verdict
    }

    /// An injected 403 refused this request's JWT.
    func providerTokenRefused() {
        validator.retractLastTokenChange()
    }

    /// GOAWAY as Apple sends it when shutting a connection down; the streams already open are still
    /// answered, and the connection closes when the last of them is done.
    private func goAway() {
        goingAway = true
        core.noteGoAway()
        let reason = channel.allocator.buffer(string: #"{"reason":"Shutdown"}"#)
        let frame = HTTP2Frame(streamID: .rootStream, payload: .goAway(
            lastStreamID: HTTP2StreamID(highestStreamID), errorCode: .noError, opaqueData: reason))
        channel.writeAndFlush(frame, promise: nil)
    }

    /// Closes once the current call stack has flushed the last stream's response.
    private func closeSoon() {
        let channel = self.channel
        channel.eventLoop.assumeIsolated().execute {
            channel.flush()
            channel.close(promise: nil)
        }
    }
}

/// Collects one request (HEADERS, DATA until END_STREAM), has it judged, and answers it.
final class APNsStreamHandler: ChannelInboundHandler {
    typealias InboundIn = HTTP2Frame.FramePayload
    typealias OutboundOut = HTTP2Frame.FramePayload

    private let connection: APNsConnection
    private var method: String?
    private var path: String?
    private var headers: [(name: String, value: String)] = []
    private var sawHeaders = false
    private var body: [UInt8] = []
    private var bodyLength = 0
    private var complete = false

    init(connection: APNsConnection) { self.connection = connection }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard !complete else { return }
        switch unwrapInboundIn(data) {
        case .headers(let frame):
            // A second HEADERS block is trailers; APNs has no use for them.
            if !sawHeaders {
                sawHeaders = true
                for (name, value, _) in frame.headers {
                    switch name {
                    case ":method": method = method ?? value
                    case ":path": path = path ?? value
                    case _ where name.hasPrefix(":"): break
                    default: headers.append((name, value))
                    }
                }
            }
            if frame.endStream { finish(context: context) }
        case .data(let frame):
            if case .byteBuffer(let buffer) = frame.data {
                bodyLength += buffer.readableBytes
                let room = APNsLimits.storedBodyBytes - body.count
                if room > 0, let bytes = buffer.getBytes(at: buffer.readerIndex, length: min(room, buffer.readableBytes)) {
                    body.append(contentsOf: bytes)
                }
            }
            if frame.endStream { finish(context: context) }
        default:
            break
        }
    }

    private func finish(context: ChannelHandlerContext) {
        complete = true
        let core = connection.core
        let receivedAt = core.now()
        let request = APNsRequest(method: method, path: path, headers: headers, body: body, bodyLength: bodyLength)
        let streamID = (try? context.channel.syncOptions?.getOption(HTTP2StreamChannelOptions.streamID)).map { Int($0) } ?? 0
        let apnsID = APNsRequestValidator.echoableAPNsID(of: request) ?? UUID.randomVersion4().lowercaseString
        let channel = context.channel

        switch connection.validate(request, receivedAt: receivedAt) {
        case .invalid(let reason, let token):
            core.record(APNsRejection(status: reason.status, reason: reason.rawValue, token: token, apnsID: apnsID,
                                      injected: false, receivedAt: receivedAt))
            Self.respond(on: channel, status: reason.status, apnsID: apnsID, reason: reason.rawValue, timestamp: nil)

        case .valid(let push):
            let (fault, delay) = core.decideFault(token: push.token)
            if let fault, fault.status == 403 {
                connection.providerTokenRefused()
            }
            let body = String(decoding: self.body, as: UTF8.self)
            let connectionID = connection.id
            let answer = {
                if let fault {
                    core.record(APNsRejection(status: fault.status, reason: fault.reason, token: push.token, apnsID: apnsID,
                                              injected: true, receivedAt: receivedAt))
                    Self.respond(on: channel, status: fault.status, apnsID: apnsID, reason: fault.reason, timestamp: fault.timestamp)
                } else {
                    core.record(APNsAcceptedPush(
                        apnsID: apnsID, token: push.token, topic: push.topic, pushType: push.pushType, priority: push.priority,
                        expiration: push.expiration, collapseID: push.collapseID, body: body, keyID: push.keyID,
                        teamID: push.teamID, connection: connectionID, streamID: streamID, receivedAt: receivedAt),
                        bodyIsJSONObject: push.bodyIsJSONObject)
                    Self.respond(on: channel, status: 200, apnsID: apnsID, reason: nil, timestamp: nil)
                }
            }
            if delay > 0 {
                channel.eventLoop.assumeIsolated().scheduleTask(in: .milliseconds(Int64(delay))) { answer() }
            } else {
                answer()
            }
        }
    }

    private struct ErrorBody: Encodable {
        var reason: String
        var timestamp: Int64?
    }

    /// Apple's answer: `:status` and `apns-id` always; `apns-unique-id` and no body on success; a JSON
    /// `{"reason"}` body (with `timestamp` when given) on error.
    private static func respond(on channel: any Channel, status: Int, apnsID: String, reason: String?, timestamp: Int64?) {
        var head = HTTP2Frame.FramePayload.Headers(headers: [":status": String(status), "apns-id": apnsID])
        guard let reason else {
            head.headers.add(name: "apns-unique-id", value: UUID.randomVersion4().lowercaseString)
            head.endStream = true
            channel.writeAndFlush(HTTP2Frame.FramePayload.headers(head), promise: nil)
            return
        }
        let encoder = JSONEncoder()
        encoder.outputFormatting = .sortedKeys
        let json = (try? encoder.encode(ErrorBody(reason: reason, timestamp: timestamp))) ?? Data(#"{"reason":"InternalServerError"}"#.utf8)
        head.headers.add(name: "content-type", value: "application/json")
        head.headers.add(name: "content-length", value: String(json.count))
        channel.write(HTTP2Frame.FramePayload.headers(head), promise: nil)
        let data = HTTP2Frame.FramePayload.Data(data: .byteBuffer(channel.allocator.buffer(bytes: json)), endStream: true)
        channel.writeAndFlush(HTTP2Frame.FramePayload.data(data), promise: nil)
    }
}
