import NIOCore
import NIOPosix
import Wire

#if canImport(Glibc)
import Glibc
#endif

/// What the application (the relay) hears from a `WireServer`. Every method runs on the server's
/// event loop, synchronously, so it may call the server's event-loop methods (`sendDatagram`,
/// `sendControl`, `close`) directly: that is the fan-out hot path, and what it writes goes out in
/// the same `sendmmsg` as the rest of the read cycle.
public protocol WireServerDelegate: AnyObject {
    /// A connection event: `.connected`, `.control`, `.peerMigrated`, `.closed`, …
    func wireServer(_ server: WireServer, handle: Endpoint.Handle, event: ConnectionEvent)
    /// One audio datagram. `payload` is valid only during the call; copy what you keep.
    func wireServer(_ server: WireServer, handle: Endpoint.Handle, datagram payload: UnsafeRawBufferPointer)
    /// The socket closed under the server (NIO closes a UDP channel on most send errors) and was
    /// bound again on the same address; sessions carry on. `error` is the last error NIO reported.
    func wireServer(_ server: WireServer, didRebindAfter error: (any Error)?)
}

extension WireServerDelegate {
    public func wireServer(_ server: WireServer, didRebindAfter error: (any Error)?) {}
}

/// Counters for what the adapter itself handled (the endpoint keeps its own in `Endpoint.stats`).
public struct WireServerStats: Sendable, Equatable {
    public var datagramsReceived = 0
    public var datagramsSent = 0
    /// Received from an address the server must never answer (port 0, broadcast, multicast, another family).
    public var droppedSources = 0
    /// Larger than the receive buffer: not a datagram of this protocol.
    public var droppedOversize = 0
    /// Outgoing datagrams not written because writing them could close the socket.
    public var refusedDestinations = 0
    /// Errors NIO reported without closing the socket, the one that closed it, and datagrams the
    /// kernel refused in a batched send (each one lost; the socket stays open).
    public var socketErrors = 0
    /// Times the socket was bound again after closing unexpectedly.
    public var rebinds = 0
    public init() {}
}

/// Drives a sans-I/O `Endpoint` over one UDP socket on one event loop: the server side of Squelch.
///
/// Reads are vectored (`recvmmsg`), and everything a read cycle produces is written and then flushed
/// once (`sendmmsg`). Connection timers run on the event loop's scheduler. If NIO closes the socket
/// (it does so on any send errno but EMSGSIZE and EHOSTUNREACH) the server binds the same address
/// again and keeps the same `Endpoint`, so sessions survive.
///
/// Methods marked "event loop only" must be called on `eventLoop` (from the delegate, or inside
/// `submit`); the `async` methods may be called from anywhere and hop onto the loop.
///
/// The server keeps itself and its delegate alive until `stop()`.
public final class WireServer: Sendable {
    public let eventLoop: any EventLoop
    /// Where the socket is bound (with the actual port when port 0 was asked for).
    public let localAddress: SocketAddress
    let core: NIOLoopBoundBox<ServerCore>

    init(eventLoop: any EventLoop, localAddress: SocketAddress, core: NIOLoopBoundBox<ServerCore>) {
        self.eventLoop = eventLoop
        self.localAddress = localAddress
        self.core = core
    }

    /// Binds `host:port` and starts serving a new `Endpoint` made from `secrets` and `configuration`.
    /// Use the same `secrets.resetKey` across restarts, so that a restarted server resets the
    /// sessions it forgot and their clients reconnect at once.
    public static func start(host: String, port: Int, secrets: ServerSecrets,
                             configuration: EndpointConfiguration = EndpointConfiguration(),
                             delegate: sending (any WireServerDelegate)?, options: UDPOptions = UDPOptions(),
                             group: any EventLoopGroup = MultiThreadedEventLoopGroup.singleton) async throws -> WireServer {
        try await start(host: host, port: port, endpoint: Endpoint(secrets: secrets, configuration: configuration),
                        delegate: delegate, options: options, on: group.next())
    }

    /// Binds `host:port` and starts serving `endpoint`, which from now on belongs to `eventLoop`.
    /// `fanout`: loops of their own that send the relay's copies (`withRelaySender`); none sends them
    /// all from `eventLoop`.
    public static func start(host: String, port: Int, endpoint: sending Endpoint, delegate: sending (any WireServerDelegate)?,
                             options: UDPOptions = UDPOptions(), on eventLoop: any EventLoop,
                             fanout: FanoutWorkers? = nil) async throws -> WireServer {
        let core = ServerCore(endpoint: endpoint, delegate: delegate, host: host, options: options, eventLoop: eventLoop)
        core.fanout = fanout
        let box = NIOLoopBoundBox.makeBoxSendingValue(core, as: ServerCore.self, eventLoop: eventLoop)
        let address = try await eventLoop.flatSubmit { box.value.start(port: port) }.get()
        let server = WireServer(eventLoop: eventLoop, localAddress: address, core: box)
        // Events that arrived before the delegate had a server to pass are still queued in the
        // endpoint; this delivers them.
        try await eventLoop.submit { box.value.adopt(server) }.get()
        return server
    }

    // MARK: Event loop only

    /// The endpoint this server drives. Event loop only.
    public var endpoint: Endpoint { core.value.endpoint }

    /// The adapter's counters. Event loop only.
    public var stats: WireServerStats { core.value.stats }

    /// Why nothing can be sent or received right now: the UDP socket closed under the server (NIO
    /// closes it after a fatal socket error) and binding the port again has not worked yet (it backs
    /// off up to every 2 s). Nil while the socket is there. Event loop only.
    public var socketProblem: String? {
        let core = core.value
        guard core.state == .starting || core.state == .running, let since = core.socketLostAt, core.channel == nil else { return nil }
        let seconds = Double((NIODeadline.now() - since).nanoseconds) / 1e9
        let port = core.port
        let last = core.rebindError.map { "; binding it again fails with: \($0)" } ?? ""
        return "the UDP socket on \(core.host) port \(port) closed \(String(format: "%.1f", seconds)) s ago and is not bound again yet\(last); check that no other process took the port and that the address is still on this host"
    }

    /// Queues a control message for `handle`; it goes out with the current read cycle, or at the end
    /// of this event-loop tick. Event loop only.
    public func sendControl(_ message: [UInt8], to handle: Endpoint.Handle) throws(ConnectionError) {
        try core.value.sendControl(message, to: handle)
    }

    /// Seals one audio datagram for `handle` and writes it to the socket (flushed with the read
    /// cycle). False when the connection can't send now (see `Connection.sendDatagram`) or there is
    /// no socket; audio is never queued. Event loop only.
    @discardableResult
    public func sendDatagram(_ payload: UnsafeRawBufferPointer, to handle: Endpoint.Handle) -> Bool {
        core.value.sendDatagram(payload, to: handle)
    }

    /// Calls `body` with a function that does what `sendDatagram` does, for sending many datagrams
    /// at once: the relay's fan-out. The clock is read and the server's state checked once for all
    /// of them. The function is valid only during the call. Event loop only.
    ///
    /// With `sendingAtOnce`, what `body` sent goes to the kernel when it returns rather than with the
    /// read cycle's flush: a talker packet's copies then don't wait behind the rest of the cycle
    /// (listeners' ACKs, other connections' packets).
    ///
    /// With `enveloped`, each datagram is a media frame the talker sealed for every member, and goes
    /// in an envelope (`Endpoint.sendEnvelope`) rather than sealed once more per listener.
    public func withDatagramSender<Result>(sendingAtOnce: Bool = false, enveloped: Bool = false,
                                           _ body: ((UnsafeRawBufferPointer, Endpoint.Handle) -> Bool) -> Result) -> Result {
        let result = core.value.withDatagramSender(enveloped: enveloped, body)
        if sendingAtOnce { core.value.output.sendBatch() }
        return result
    }

    /// Closes one connection with CONNECTION_CLOSE. Event loop only.
    public func close(_ handle: Endpoint.Handle, code: UInt64 = 0, reason: String = "") {
        core.value.close(handle, code: code, reason: reason)
    }

    // MARK: From anywhere

    /// Runs `body` on the event loop, where it may use the event-loop-only API.
    public func submit<T: Sendable>(_ body: @escaping @Sendable (WireServer) throws -> T) async throws -> T {
        try await eventLoop.submit { try body(self) }.get()
    }

    /// `sendControl` from off the event loop.
    public func send(control message: [UInt8], to handle: Endpoint.Handle) async throws(ConnectionError) {
        let result: Result<Void, ConnectionError>
        do {
            result = try await eventLoop.submit { () -> Result<Void, ConnectionError> in
                do throws(ConnectionError) { try self.sendControl(message, to: handle) } catch { return .failure(error) }
                return .success(())
            }.get()
        } catch {
            throw .local(code: 0, reason: "server event loop unavailable: \(error)")
        }
        try result.get()
    }

    /// `sendDatagram` from off the event loop (one hop per datagram: not for the relay's hot path).
    @discardableResult
    public func send(datagram payload: [UInt8], to handle: Endpoint.Handle) async -> Bool {
        (try? await eventLoop.submit { payload.withUnsafeBytes { self.sendDatagram($0, to: handle) } }.get()) ?? false
    }

    /// `close` from off the event loop.
    public func close(_ handle: Endpoint.Handle, code: UInt64 = 0, reason: String = "") async {
        try? await eventLoop.submit { self.close(handle, code: code, reason: reason) }.get()
    }

    /// Stops serving and closes the socket. With `closingConnections` every client first gets a
    /// CONNECTION_CLOSE with `code` and `reason` (best effort: one datagram each). Without it the
    /// server vanishes as in a crash, and clients learn from a stateless reset once a server with the
    /// same reset key is back. Returns once the socket is closed; calling it again is harmless.
    public func stop(closingConnections: Bool = true, code: UInt64 = 0, reason: String = "server shutting down") async {
        try? await eventLoop.flatSubmit { self.core.value.stop(closingConnections: closingConnections, code: code, reason: reason) }.get()
    }
}

/// Everything the server owns on its event loop.
final class ServerCore: DatagramDriver {
    enum State { case starting, running, stopping, stopped }

    let endpoint: Endpoint
    let eventLoop: any EventLoop
    let host: String
    let options: UDPOptions
    var delegate: (any WireServerDelegate)?
    /// Set once `start` returns; the delegate needs it. Released on stop, which breaks the cycle
    /// server → box → core → server.
    var server: WireServer?
    var state = State.starting
    var port = 0
    var channel: (any Channel)?
    var output: DatagramOutput
    let receiveBuffer = ScratchBuffer(size: 65_536)
    var timer = LoopTimer()
    /// Datagrams of the current receive, as offsets into `receiveBuffer`. They are handed to the
    /// delegate after `Endpoint.receive` returns, so that the delegate may send (even to the same
    /// connection) without re-entering a connection in the middle of its receive.
    var received: [(handle: Endpoint.Handle, offset: Int, count: Int)] = []
    /// In a read cycle or a timer: output is flushed at its end, so commands need not schedule it.
    var inCycle = false
    var outputScheduled = false
    var stats = WireServerStats()
    /// The relay's extra senders, if any.
    var fanout: FanoutWorkers?
    /// Talker packets relayed in this read cycle (`withRelaySender`).
    var relayedThisCycle = 0
    var lastError: (any Error)?
    var rebindDelay = TimeAmount.zero
    /// When the socket closed under a running server, until a rebind succeeds.
    var socketLostAt: NIODeadline?
    /// Why the last attempt to bind again failed, while the socket is lost.
    var rebindError: (any Error)?
    var stopPromise: EventLoopPromise<Void>?

    init(endpoint: Endpoint, delegate: (any WireServerDelegate)?, host: String, options: UDPOptions, eventLoop: any EventLoop) {
        self.endpoint = endpoint
        self.delegate = delegate
        self.host = host
        self.options = options
        self.eventLoop = eventLoop
        output = DatagramOutput(slot: max(endpoint.configuration.connection.maxDatagramSize, 1200))
        received.reserveCapacity(16)
    }

    // MARK: Socket lifecycle

    func start(port: Int) -> EventLoopFuture<SocketAddress> {
        self.port = port
        return bind().flatMapThrowing { channel in
            guard let address = channel.localAddress else { throw ChannelError.unknownLocalAddress }
            return address
        }
    }

    func adopt(_ server: WireServer) {
        guard state == .starting else { return }
        self.server = server
        state = .running
        deliverEvents()
        flushOutput()
    }

    /// Binds `host:port` on this event loop with the handler in place before the first read. The
    /// socket is made here, not by NIO, so that a duplicate of its descriptor can carry the fan-out
    /// (`BatchSender`).
    func bind() -> EventLoopFuture<any Channel> {
        let bound = NIOLoopBound(self, eventLoop: eventLoop)
        let socket: CInt
        let sendSocket: CInt
        do {
            socket = try boundUDPSocket(host: host, port: port)
            sendSocket = dup(socket)
            guard sendSocket >= 0 else {
                let error = errno
                _ = Glibc.close(socket)
                throw IOError(errnoCode: error, reason: "dup")
            }
            fanout?.useSocket(socket, slot: output.slot)
        } catch {
            return eventLoop.makeFailedFuture(error)
        }
        let batch = NIOLoopBound(BatchSender(descriptor: sendSocket, slot: output.slot), eventLoop: eventLoop)
        return options.bootstrap(on: eventLoop)
            .channelInitializer { channel in
                do {
                    try channel.pipeline.syncOperations.addHandler(DatagramHandler(driver: bound.value))
                    return channel.eventLoop.makeSucceededVoidFuture()
                } catch {
                    return channel.eventLoop.makeFailedFuture(error)
                }
            }
            .withBoundSocket(socket)
            .flatMapErrorThrowing { [bound, batch] error in
                batch.value.close()
                bound.value.fanout?.useSocket(nil, slot: bound.value.output.slot)
                throw error
            }
            .flatMapThrowing { [bound, batch] channel in
                do {
                    try bound.value.attach(channel, batch: batch.value)
                } catch {
                    batch.value.close()
                    bound.value.fanout?.useSocket(nil, slot: bound.value.output.slot)
                    throw error
                }
                return channel
            }
    }

    func attach(_ channel: any Channel, batch: BatchSender) throws {
        guard state != .stopping, state != .stopped else {
            channel.close(promise: nil)
            throw ChannelError.ioOnClosedChannel
        }
        let context = try channel.pipeline.syncOperations.context(handlerType: DatagramHandler.self)
        output.attach(context, socketIsIPv6: channel.localAddress?.protocol == .inet6, batch: batch)
        // Rebinds reuse the port actually bound, which matters when the caller asked for port 0.
        if let bound = channel.localAddress?.port { port = bound }
        self.channel = channel
        channel.closeFuture.assumeIsolated().whenComplete { [self] _ in closed(channel) }
    }

    func closed(_ channel: any Channel) {
        guard channel === self.channel else { return }
        self.channel = nil
        output.socketClosed()
        fanout?.useSocket(nil, slot: output.slot)
        // A read cycle the close cut short never reaches channelReadComplete.
        inCycle = false
        switch state {
        case .starting, .running:
            stats.rebinds += 1
            if socketLostAt == nil { socketLostAt = .now() }
            scheduleRebind()
        case .stopping:
            finishStop()
        case .stopped:
            break
        }
    }

    func scheduleRebind() {
        eventLoop.assumeIsolated().scheduleTask(in: rebindDelay) { [self] in
            guard state == .starting || state == .running, channel == nil else { return }
            bind().assumeIsolated().whenComplete { [self] result in
                switch result {
                case .success:
                    rebindDelay = .zero
                    socketLostAt = nil
                    rebindError = nil
                    if let delegate, let server { delegate.wireServer(server, didRebindAfter: lastError) }
                    // Output that queued in the endpoint while there was no socket goes out now.
                    flushOutput()
                case .failure(let error):
                    lastError = error
                    rebindError = error
                    // The port may be briefly taken or the interface gone: back off up to 2 s.
                    rebindDelay = min(max(rebindDelay * 2, .milliseconds(50)), .seconds(2))
                    scheduleRebind()
                }
            }
        }
    }

    func stop(closingConnections: Bool, code: UInt64, reason: String) -> EventLoopFuture<Void> {
        if let stopPromise { return stopPromise.futureResult }
        let promise = eventLoop.makePromise(of: Void.self)
        stopPromise = promise
        state = .stopping
        if closingConnections {
            let now = WireNIO.now()
            for handle in endpoint.handles { endpoint.close(handle, code: code, reason: reason, now: now) }
            deliverEvents()
            // Every connection's close goes now, however many there are: the socket closes right
            // after this, so nothing may be left for the next tick. Each pass is one batch flushed.
            // Bounded all the same (each connection has one close to send), in case a bug makes the
            // endpoint produce without end.
            var passes = endpoint.handles.count / max(options.datagramsPerDrain, 1) + 2
            while output.context != nil, passes > 0, !drainOnce(now: now) {
                flushSocket()
                passes -= 1
            }
            deliverEvents()
            flushSocket()
        }
        timer.cancel()
        guard let channel else {
            finishStop()
            return promise.futureResult
        }
        // Closes the kernel's buffer couldn't take went to NIO, which drops what it still holds when
        // the socket closes: wait for them, for a second at most. (Loopback never fills the buffer,
        // so the tests can't reach this; a real NIC with tens of thousands of members can.)
        if let pending = output.lastFallbackWrite {
            let deadline = eventLoop.scheduleTask(in: .seconds(1)) { channel.close(promise: nil) }
            pending.whenComplete { _ in
                deadline.cancel()
                channel.close(promise: nil)
            }
        } else {
            channel.close(promise: nil)
        }
        return promise.futureResult
    }

    func finishStop() {
        state = .stopped
        fanout?.useSocket(nil, slot: output.slot)
        timer.cancel()
        delegate = nil
        server = nil
        stopPromise?.succeed()
    }

    // MARK: DatagramDriver

    func attached(_ context: ChannelHandlerContext) {}

    func detached(_ context: ChannelHandlerContext) { output.detach(context) }

    func read(_ envelope: AddressedEnvelope<ByteBuffer>) {
        inCycle = true
        guard state != .stopped else { return }
        stats.datagramsReceived += 1
        guard let source = PathAddress(envelope.remoteAddress), output.addresses.learn(source, envelope.remoteAddress) else {
            stats.droppedSources += 1
            return
        }
        guard let datagram = receiveBuffer.load(envelope.data), let base = receiveBuffer.bytes.baseAddress else {
            stats.droppedOversize += 1
            return
        }
        received.removeAll(keepingCapacity: true)
        endpoint.receive(datagram, from: source, now: WireNIO.now()) { handle, payload in
            received.append((handle, payload.baseAddress.map { UnsafeRawPointer(base).distance(to: $0) } ?? 0, payload.count))
        }
        deliverEvents()
        guard let delegate, let server, !received.isEmpty else { return }
        for (handle, offset, count) in received {
            delegate.wireServer(server, handle: handle, datagram: UnsafeRawBufferPointer(start: base + offset, count: count))
        }
    }

    func readComplete() {
        inCycle = true
        let now = WireNIO.now()
        endpoint.handleTimeout(now: now)
        finishCycle(now: now)
    }

    func caught(_ error: any Error) {
        stats.socketErrors += 1
        lastError = error
    }

    // MARK: Commands

    func sendControl(_ message: [UInt8], to handle: Endpoint.Handle) throws(ConnectionError) {
        try endpoint.sendControl(message, to: handle, now: WireNIO.now())
        requestOutput()
    }

    func sendDatagram(_ payload: UnsafeRawBufferPointer, to handle: Endpoint.Handle) -> Bool {
        guard state == .running else { return false }
        return sendDatagram(payload, to: handle, now: WireNIO.now())
    }

    func withDatagramSender<Result>(enveloped: Bool, _ body: ((UnsafeRawBufferPointer, Endpoint.Handle) -> Bool) -> Result) -> Result {
        guard state == .running else { return body { _, _ in false } }
        let now = WireNIO.now()
        return body { payload, handle in self.sendDatagram(payload, to: handle, now: now, enveloped: enveloped) }
    }

    func sendDatagram(_ payload: UnsafeRawBufferPointer, to handle: Endpoint.Handle, now: WireInstant, enveloped: Bool = false) -> Bool {
        let emitted = output.emit {
            enveloped ? endpoint.sendEnvelope(payload, to: handle, into: $0, now: now)
                      : endpoint.sendDatagram(payload, to: handle, into: $0, now: now)
        }
        switch emitted {
        case .written:
            stats.datagramsSent += 1
            requestOutput()
            return true
        case .refused:
            stats.refusedDestinations += 1
            return false
        case .nothing:
            return false
        }
    }

    func close(_ handle: Endpoint.Handle, code: UInt64, reason: String) {
        endpoint.close(handle, code: code, reason: reason, now: WireNIO.now())
        requestOutput()
    }

    // MARK: Output and timers

    /// Outside a read cycle or timer, output waits for the end of the current event-loop tick, so a
    /// burst of commands still leaves in one flush.
    func requestOutput() {
        guard !inCycle else { return }
        scheduleOutput()
    }

    func scheduleOutput() {
        guard !outputScheduled else { return }
        outputScheduled = true
        eventLoop.assumeIsolated().execute { [self] in
            outputScheduled = false
            flushOutput()
        }
    }

    func flushOutput() {
        inCycle = true
        finishCycle(now: WireNIO.now())
    }

    func finishCycle(now: WireInstant, timerFired: Bool = false) {
        deliverEvents()
        drainOutput(now: now)
        flushSocket()
        inCycle = false
        relayedThisCycle = 0
        // A deadline the core did not move past after its timer ran would fire again at once; the
        // floor keeps such a bug from spinning the event loop.
        armTimer(minimum: timerFired ? now.nanoseconds + 1_000_000 : 0)
    }

    func flushSocket() {
        output.flush()
        let failed = output.takeFailures()
        let workersFailed = fanout?.takeFailures() ?? 0
        if workersFailed > 0 { stats.socketErrors += workersFailed }
        if failed.count > 0 {
            stats.socketErrors += failed.count
            lastError = IOError(errnoCode: failed.errno, reason: "sendmmsg")
        }
    }

    func drainOutput(now: WireInstant) {
        guard output.context != nil, state != .stopped else { return }
        // Bounded so that a core that never runs dry can't hold the event loop; the rest goes out
        // at the end of this tick.
        let done = drainOnce(now: now)
        deliverEvents()
        if !done { scheduleOutput() }
    }

    /// Writes up to `options.datagramsPerDrain` datagrams; true if the endpoint has nothing more.
    func drainOnce(now: WireInstant) -> Bool {
        for _ in 0..<options.datagramsPerDrain {
            switch output.emit({ endpoint.poll(into: $0, now: now) }) {
            case .written: stats.datagramsSent += 1
            case .refused: stats.refusedDestinations += 1
            case .nothing: return true
            }
        }
        return false
    }

    func deliverEvents() {
        guard let delegate, let server else { return }
        while let (handle, event) = endpoint.nextEvent() {
            delegate.wireServer(server, handle: handle, event: event)
        }
    }

    func armTimer(minimum: UInt64 = 0) {
        guard state == .running || state == .starting else { return }
        timer.arm(endpoint.nextDeadline, minimum: minimum, on: eventLoop) { [self] in
            timer.fired()
            guard state == .running || state == .starting else { return }
            inCycle = true
            let now = WireNIO.now()
            endpoint.handleTimeout(now: now)
            finishCycle(now: now, timerFired: true)
        }
    }
}
