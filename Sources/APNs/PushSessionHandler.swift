import CNGHTTP2
import HTTP2Session
import NIOConcurrencyHelpers
import NIOCore
import NIOTLS

/// Pushes handed to a connection's event loop, and whether it still takes them: set and read under one
/// lock, so that a push never joins a queue nobody will take again (a closed connection's loop may be
/// gone, and a push queued there would wait forever).
struct PushQueue {
    var waiting: [PendingPush] = []
    var closed = false
}

/// The pushes of one hand-over, and the task waiting for all their results.
///
/// `@unchecked Sendable`: made inside the waiting task's continuation before any push is handed over;
/// results are then written only on the connection's event loop (or, when the connection had closed,
/// by the handing task itself, before any reached the loop), and the continuation is resumed once,
/// with the last, after which nothing touches it.
final class PushBatch: @unchecked Sendable {
    private var results: [APNsAttemptResult?]
    private var remaining: Int
    private let continuation: CheckedContinuation<[APNsAttemptResult], Never>

    init(count: Int, continuation: CheckedContinuation<[APNsAttemptResult], Never>) {
        results = Array(repeating: nil, count: count)
        remaining = count
        self.continuation = continuation
    }

    func complete(_ index: Int, _ result: APNsAttemptResult) {
        results[index] = result
        remaining -= 1
        if remaining == 0 { continuation.resume(returning: results.map { $0 ?? .transport(.connectionLost("no result")) }) }
    }
}

/// One push on its way: the request, its deadline, and where its result goes.
///
/// `@unchecked Sendable`: made by the sending task and handed to the event loop through
/// `HTTP2Connection`'s locked queue, once; from then on only that event loop reads or changes it.
final class PendingPush: @unchecked Sendable {
    let headers: HTTP2HeaderList
    let body: [UInt8]
    let deadline: NIODeadline
    private let batch: PushBatch
    private let index: Int
    private(set) var isFinished = false
    var streamID: Int32 = 0

    init(headers: HTTP2HeaderList, body: [UInt8], deadline: NIODeadline, batch: PushBatch, index: Int) {
        self.headers = headers
        self.body = body
        self.deadline = deadline
        self.batch = batch
        self.index = index
    }

    /// The first result wins; later ones (a stream's close after its timeout) are ignored.
    func finish(_ result: APNsAttemptResult) {
        guard !isFinished else { return }
        isFinished = true
        batch.complete(index, result)
    }
}

/// Drives one connection's `HTTP2ClientSession` (libnghttp2) on its event loop, below TLS: takes the
/// waiting pushes in batches, feeds it what the server sends, writes what it has to send once per
/// batch or read, times requests out, and keeps the connection alive with PINGs (a minute without
/// reads, or at once when a request timed out), closing it when a PING goes unanswered.
final class PushSessionHandler: ChannelDuplexHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    /// Asks for a PING at once (unless one is outstanding): a request on this connection timed out.
    struct ProbeNow {}

    private let session: HTTP2ClientSession
    private let state: NIOLockedValueBox<HTTP2Connection.State>
    private let submissions: NIOLockedValueBox<PushQueue>
    private let handshake: EventLoopPromise<Void>
    private let pingInterval: TimeAmount
    private let pingTimeout: TimeAmount
    private var context: ChannelHandlerContext?
    private var isClosed = false
    /// The last stream ID of the server's GOAWAY: streams above it were not processed.
    private var goAwayLastStreamID: Int32?
    /// Pushes with a stream, by stream ID.
    private var inFlight: [Int32: PendingPush] = [:]
    /// One timer, for the earliest deadline it knew of when set; it sweeps every push due and sets itself again.
    private var sweep: (at: NIODeadline, task: Scheduled<Void>)?
    private var readSinceLastTick = false
    private var pingOutstanding = false
    private var pingCounter: UInt64 = 0
    private var ticker: RepeatedTask?
    private var pingDeadline: Scheduled<Void>?

    init(state: NIOLockedValueBox<HTTP2Connection.State>, submissions: NIOLockedValueBox<PushQueue>,
         handshake: EventLoopPromise<Void>, pingInterval: Duration, pingTimeout: Duration) throws {
        session = try HTTP2ClientSession(maximumBodyBytes: 4_096)
        self.state = state
        self.submissions = submissions
        self.handshake = handshake
        self.pingInterval = TimeAmount(pingInterval)
        self.pingTimeout = TimeAmount(pingTimeout)
    }

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
        // The preface and SETTINGS; NIOSSL holds them until its handshake is done.
        if context.channel.isActive { flush() }
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        self.context = nil
    }

    func channelActive(context: ChannelHandlerContext) {
        flush()
        context.fireChannelActive()
    }

    // MARK: pushes out

    /// Takes every push waiting in the queue, as streams, and writes them in one flush.
    func submitWaiting() {
        let batch = submissions.withLockedValue { queue in
            defer { queue.waiting.removeAll(keepingCapacity: true) }
            return queue.waiting
        }
        guard !isClosed else {
            // Never sent: safe to send elsewhere.
            for push in batch { push.finish(.transport(.goAway)) }
            return
        }
        for push in batch {
            do {
                let id = try session.submitRequest(headers: push.headers, body: push.body, context: push)
                push.streamID = id
                inFlight[id] = push
                armSweep(for: push.deadline)
            } catch {
                // Stream IDs spent (after 2^30 pushes) or the session dead: a new connection takes over,
                // and this push, never sent, may go there.
                state.withLockedValue { $0.goingAway = true }
                push.finish(.transport(.goAway))
            }
        }
        // A push is a HEADERS frame (its JWT indexed after the first) and a DATA frame: about 100 bytes
        // and its body.
        flush(expected: batch.reduce(0) { $0 + 128 + $1.body.count })
    }

    /// Writes whatever the session has for the server, in one buffer and one flush.
    /// - Parameter expected: bytes likely to come, so a large batch's buffer is not grown (and copied)
    ///   frame by frame.
    private func flush(expected: Int = 4_096) {
        guard let context, !isClosed else { return }
        var buffer: ByteBuffer?
        do {
            try session.send { chunk in
                if buffer == nil { buffer = context.channel.allocator.buffer(capacity: max(chunk.count, expected)) }
                buffer!.writeBytes(chunk)
            }
        } catch {
            fail(context: context, error: error)
            return
        }
        handleEvents()
        if let buffer { context.writeAndFlush(wrapOutboundOut(buffer), promise: nil) }
        // After a connection error (said in the GOAWAY just written), or a GOAWAY with nothing left to
        // finish, the session wants neither to read nor to write: the connection is over.
        if !session.isAlive { shutDown(context: context) }
    }

    // MARK: the server's bytes in

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        readSinceLastTick = true
        let buffer = unwrapInboundIn(data)
        do {
            try buffer.withUnsafeReadableBytes { bytes in try session.receive(bytes) }
        } catch {
            handleEvents()  // answers that came in the same read still count
            fail(context: context, error: error)
            return
        }
        handleEvents()
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        // SETTINGS and PING acknowledgements, WINDOW_UPDATEs: what the reads called for, at once.
        flush()
        context.fireChannelReadComplete()
    }

    private func handleEvents() {
        session.drainEvents { event in
            switch event {
            case .settings(let limit):
                state.withLockedValue { $0.maxConcurrentStreams = limit }
                // The server's first SETTINGS carry its stream limit; until they arrive the pool assumes
                // one, and a burst of pushes would open more streams than APNs allows before authentication.
                handshake.succeed(())
            case .goAway(let lastStreamID, _):
                // libnghttp2 closes the streams above the GOAWAY's last stream ID (REFUSED_STREAM): they
                // report `.goAway`. The ones below still complete. No new pushes go here.
                goAwayLastStreamID = min(goAwayLastStreamID ?? .max, lastStreamID)
                state.withLockedValue { $0.goingAway = true }
            case .pingAcknowledged:
                pingOutstanding = false
                pingDeadline?.cancel()
                pingDeadline = nil
            case .closed(let closed):
                guard let push = inFlight.removeValue(forKey: closed.streamID) else { return }
                push.finish(result(of: closed))
            }
        }
    }

    private func result(of closed: HTTP2ClientSession.Closed) -> APNsAttemptResult {
        if closed.complete {
            guard let status = closed.status else { return .transport(.connectionLost("response without :status")) }
            return status == 200 ? .accepted : .rejected(APNsErrorResponse.parse(status: status, body: closed.body))
        }
        // A stream the server did not process (above a GOAWAY's last stream ID, or refused on its own:
        // RFC 9113 §8.7) is safe to retry.
        if closed.errorCode == NGHTTP2_REFUSED_STREAM.rawValue { return .transport(.goAway) }
        if closed.errorCode != 0 { return .transport(.connectionLost("stream reset: \(http2ErrorName(closed.errorCode))")) }
        return .transport(.connectionLost("stream closed before the response"))
    }

    /// A stream that closes with the connection: above the server's GOAWAY it was not processed, which
    /// makes a retry safe; otherwise the connection died under it, and APNs may have it.
    private func closedResult(streamID: Int32) -> APNsAttemptResult {
        if let last = goAwayLastStreamID, streamID > last { return .transport(.goAway) }
        return .transport(.connectionLost("stream closed before the response"))
    }

    // MARK: deadlines

    private func armSweep(for deadline: NIODeadline) {
        guard let context, sweep.map({ deadline < $0.at }) ?? true else { return }
        sweep?.task.cancel()
        let loopBound = NIOLoopBound(self, eventLoop: context.eventLoop)
        sweep = (deadline, context.eventLoop.scheduleTask(deadline: deadline) { loopBound.value.sweepDue() })
    }

    /// Times out every push past its deadline (resetting its stream), and sets the timer for the next.
    private func sweepDue() {
        sweep = nil
        let now = NIODeadline.now()
        var next: NIODeadline?
        for (id, push) in inFlight {
            if push.deadline <= now {
                inFlight[id] = nil
                push.finish(.transport(.timeout))
                session.reset(streamID: id)
            } else if next.map({ push.deadline < $0 }) ?? true {
                next = push.deadline
            }
        }
        if let next { armSweep(for: next) }
        flush()
    }

    // MARK: the connection

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
                shutDown(context: context)
            }
        }
        context.fireUserInboundEventTriggered(event)
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        handshake.fail(error)
        shutDown(context: context)
    }

    private func fail(context: ChannelHandlerContext, error: any Error) {
        // libnghttp2 may have queued a GOAWAY saying why; send it before closing.
        var goAway: ByteBuffer?
        try? session.send { chunk in
            if goAway == nil { goAway = context.channel.allocator.buffer(capacity: chunk.count) }
            goAway!.writeBytes(chunk)
        }
        if let goAway { context.writeAndFlush(wrapOutboundOut(goAway), promise: nil) }
        context.fireErrorCaught(error)
        shutDown(context: context)
    }

    /// Ends the connection from this side: out of the pool and every push settled now, not when TLS
    /// has finished closing (NIOSSL waits up to 5 s for the peer's close_notify, which a dead peer
    /// never sends).
    private func shutDown(context: ChannelHandlerContext) {
        settleEverything()
        context.close(promise: nil)
    }

    /// The connection is over: no push goes on it, and each one on it ends with what is known of it.
    private func settleEverything() {
        guard !isClosed else { return }
        handleEvents()  // results already in
        isClosed = true
        state.withLockedValue { $0.closed = true }
        handshake.fail(APNsTransportError.closed)
        ticker?.cancel()
        pingDeadline?.cancel()
        sweep?.task.cancel()
        sweep = nil
        session.abandonStreams()
        session.drainEvents { _ in }
        for push in inFlight.values { push.finish(closedResult(streamID: push.streamID)) }
        inFlight.removeAll()
        // Pushes handed over and not yet taken, and any later: never sent.
        let waiting = submissions.withLockedValue { queue in
            queue.closed = true
            defer { queue.waiting.removeAll() }
            return queue.waiting
        }
        for push in waiting { push.finish(.transport(.goAway)) }
    }

    func channelInactive(context: ChannelHandlerContext) {
        settleEverything()
        context.fireChannelInactive()
    }

    private func startKeepalive(context: ChannelHandlerContext) {
        let loopBound = NIOLoopBound(self, eventLoop: context.eventLoop)
        ticker = context.eventLoop.scheduleRepeatedTask(initialDelay: pingInterval, delay: pingInterval) { _ in
            loopBound.value.tick()
        }
    }

    private func tick() {
        defer { readSinceLastTick = false }
        guard !readSinceLastTick, let context else { return }
        ping(context: context)
    }

    private func ping(context: ChannelHandlerContext) {
        guard !pingOutstanding, context.channel.isActive else { return }
        pingOutstanding = true
        pingCounter += 1
        session.ping(pingCounter)
        flush()
        let contextBox = NIOLoopBound(context, eventLoop: context.eventLoop)
        let selfBox = NIOLoopBound(self, eventLoop: context.eventLoop)
        pingDeadline = context.eventLoop.assumeIsolated().scheduleTask(in: pingTimeout) {
            contextBox.value.fireErrorCaught(APNsConnectionError.pingTimedOut)
            selfBox.value.shutDown(context: contextBox.value)
        }
    }
}

/// RFC 9113's name for an HTTP/2 error code, for messages.
func http2ErrorName(_ code: UInt32) -> String {
    String(cString: nghttp2_http2_strerror(code))
}
