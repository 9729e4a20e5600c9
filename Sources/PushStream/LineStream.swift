import NIOCore
import NIOHTTP1
import NIOPosix
import NIOSSL

/// A device's end of a push stream: one HTTP/1.1 GET whose answer is NDJSON, one line per push, held
/// open for as long as the device wants pushes. The APNs simulator's control port serves its devices
/// this way in plain HTTP, and squelchd's device push service over TLS; both clients open it here.
public enum LineStream {
    /// The longest line taken: a push body is at most 4 KB, as APNs allows.
    public static let maxLineBytes = 64 * 1024

    /// Where to connect and what to ask for.
    public struct Request: Sendable {
        public var host: String
        public var port: Int
        public var path: String
        /// Extra request headers (`authorization`), besides `host` and `accept`.
        public var headers: [(String, String)]
        /// TLS, or nil for plain HTTP.
        public var tls: TLS?
        /// A stream that carries nothing (not even the server's keepalive, an empty line) for this long
        /// is taken for dead and fails: a connection cut without a FIN (a NAT that forgot it, a server
        /// powered off) would otherwise look alive forever. Nil: no limit.
        public var silenceLimit: TimeAmount?

        public init(host: String, port: Int, path: String, headers: [(String, String)] = [], tls: TLS? = nil,
                    silenceLimit: TimeAmount? = nil) {
            self.host = host
            self.port = port
            self.path = path
            self.headers = headers
            self.tls = tls
            self.silenceLimit = silenceLimit
        }
    }

    public struct TLS: Sendable {
        public var context: NIOSSLContext
        /// The name the server's certificate must carry, sent as SNI; nil for an IP address, which the
        /// certificate's IP entries are checked against instead.
        public var serverHostname: String?

        public init(context: NIOSSLContext, serverHostname: String?) {
            self.context = context
            self.serverHostname = serverHostname
        }
    }

    /// Opens the stream and returns once its first line (the server's confirmation that the
    /// subscription is live) has arrived, with that line and the lines after it. Empty lines are
    /// keepalives and are skipped. The rest ends when the server ends the answer and throws if the
    /// connection breaks or falls silent; ending its iteration closes the connection.
    public static func open(_ request: Request) async throws -> (first: [UInt8], rest: AsyncThrowingStream<[UInt8], any Error>) {
        let channel = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .connectTimeout(.seconds(5))
            .connect(host: request.host, port: request.port) { channel in
                channel.eventLoop.makeCompletedFuture {
                    let pipeline = channel.pipeline.syncOperations
                    if let tls = request.tls {
                        try pipeline.addHandler(NIOSSLClientHandler(context: tls.context, serverHostname: tls.serverHostname))
                    }
                    if let limit = request.silenceLimit {
                        try pipeline.addHandlers(IdleStateHandler(readTimeout: limit), SilenceLimit(limit: limit))
                    }
                    try pipeline.addHTTPClientHandlers()
                    return try NIOAsyncChannel<HTTPClientResponsePart, HTTPClientRequestPart>(wrappingChannelSynchronously: channel)
                }
            }
        let (lines, lineContinuation) = AsyncThrowingStream.makeStream(of: [UInt8].self)
        let (first, firstContinuation) = AsyncThrowingStream.makeStream(of: [UInt8].self)

        let reader = Task {
            do {
                try await channel.executeThenClose { inbound, outbound in
                    var head = HTTPRequestHead(version: .http1_1, method: .GET, uri: request.path)
                    head.headers.add(name: "host", value: request.host.contains(":") ? "[\(request.host)]:\(request.port)" : "\(request.host):\(request.port)")
                    head.headers.add(name: "accept", value: "application/x-ndjson")
                    for (name, value) in request.headers { head.headers.add(name: name, value: value) }
                    try await outbound.write(.head(head))
                    try await outbound.write(.end(nil))

                    var status: HTTPResponseStatus = .ok
                    var errorBody = ""
                    var splitter = NDJSONLineSplitter()
                    var confirmed = false
                    parts: for try await part in inbound {
                        switch part {
                        case .head(let response):
                            status = response.status
                        case .body(let buffer) where status != .ok:
                            // Enough of it to say why; an error body is a line of JSON.
                            if errorBody.utf8.count < 4096 { errorBody += String(buffer: buffer) }
                        case .body(let buffer):
                            let complete = splitter.append(buffer.readableBytesView)
                            // A server sending one endless line would otherwise fill the memory.
                            if splitter.pendingCount > LineStream.maxLineBytes { throw LineStreamError.lineTooLong(limit: LineStream.maxLineBytes) }
                            for line in complete where !line.isEmpty {
                                if confirmed {
                                    lineContinuation.yield(line)
                                } else {
                                    confirmed = true
                                    firstContinuation.yield(line)
                                    firstContinuation.finish()
                                }
                            }
                        case .end:
                            break parts
                        }
                    }
                    if status != .ok { throw LineStreamError.refused(status: Int(status.code), body: errorBody) }
                    if !confirmed { throw LineStreamError.endedBeforeFirstLine }
                }
                lineContinuation.finish()
                firstContinuation.finish(throwing: CancellationError())
            } catch {
                lineContinuation.finish(throwing: error)
                firstContinuation.finish(throwing: error)
            }
        }
        lineContinuation.onTermination = { _ in reader.cancel() }

        do {
            let line = try await withTaskCancellationHandler {
                for try await line in first { return line }
                throw CancellationError()
            } onCancel: {
                reader.cancel()
            }
            return (line, lines)
        } catch {
            reader.cancel()
            throw error
        }
    }
}

/// Why a line stream failed.
public enum LineStreamError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The server answered with an error status; `body` is what it said (a JSON `{"error"}` here).
    case refused(status: Int, body: String)
    case endedBeforeFirstLine
    /// A line went on past `limit` bytes.
    case lineTooLong(limit: Int)
    /// Nothing arrived for `seconds`, not even a keepalive.
    case silent(seconds: Int64)

    public var description: String {
        switch self {
        case .refused(let status, let body): "refused with HTTP \(status): \(body)"
        case .endedBeforeFirstLine: "the stream ended before the subscription was confirmed"
        case .lineTooLong(let limit): "the server sent a line longer than \(limit) bytes; that is no push stream"
        case .silent(let seconds): "the push stream was silent for \(seconds) s (no keepalive): the connection is taken for dead"
        }
    }
}

/// Turns `IdleStateHandler`'s read timeout into an error that ends the stream.
private final class SilenceLimit: ChannelInboundHandler, Sendable {
    typealias InboundIn = NIOAny
    let limit: TimeAmount

    init(limit: TimeAmount) { self.limit = limit }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if let idle = event as? IdleStateHandler.IdleStateEvent, idle == .read {
            context.fireErrorCaught(LineStreamError.silent(seconds: limit.nanoseconds / 1_000_000_000))
            context.close(promise: nil)
        } else {
            context.fireUserInboundEventTriggered(event)
        }
    }
}
