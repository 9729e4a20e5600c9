import NIOCore
import NIOPosix
import Wire

/// Counters for what the client adapter handled (the connection keeps its own in `Connection.stats`).
public struct WireClientStats: Sendable, Equatable {
    public var datagramsReceived = 0
    public var datagramsSent = 0
    /// From an address other than the server's: never given to the connection.
    public var droppedForeign = 0
    public var droppedOversize = 0
    public var socketErrors = 0
    /// New local sockets: `rebind()` calls, and recoveries after NIO closed the socket.
    public var rebinds = 0
    public init() {}
}

/// Why a `WireClientChannel` call could not be carried out.
public enum WireClientError: Error, Sendable, Equatable {
    /// `rebind()` or a send before `connect()`, or after `close()`.
    case notRunning
}

/// Drives a sans-I/O `WireClient` over a UDP socket of its own: the client side of Squelch.
///
/// The client keeps itself connected: after a stateless reset (the server restarted), an idle
/// timeout or a server that stopped answering (`ConnectionError.clientReconnects`) it handshakes again by itself and reports `.reconnecting` then `.connection(.connected)`
/// on `events`. `rebind()` moves the session to a new local port without a new handshake, which is
/// what an app does when it wakes on a new network (fast resume).
///
/// Call `close()` when done: until then the socket and the event loop's references keep it alive.
public final class WireClientChannel: Sendable {
    public let eventLoop: any EventLoop
    /// Every client event, in order. Finishes when the session ends for good (a close or a failure
    /// that reconnecting does not fix).
    public let events: AsyncStream<ClientEvent>
    /// Received audio datagrams, unless the client was made with an `onDatagram` handler (then this
    /// stream stays empty). Keeps the newest 1024 if the consumer falls behind: late audio is
    /// worthless, and memory must stay bounded.
    public let datagrams: AsyncStream<[UInt8]>

    /// Takes each received audio datagram on the event loop, synchronously, as it is opened: the
    /// bytes are valid only during the call, and the handler must not block. For a real-time consumer
    /// (a jitter buffer) that must see packets when they arrive: the `datagrams` stream hands them over
    /// through a task, which a busy cooperative thread pool can hold back for hundreds of milliseconds.
    public typealias DatagramHandler = @Sendable (UnsafeRawBufferPointer) -> Void
    /// Takes each client event on the event loop, synchronously, instead of `events` (which then only
    /// finishes): for a consumer that must know when a message arrived. Must not block.
    public typealias EventHandler = @Sendable (ClientEvent) -> Void
    let core: NIOLoopBoundBox<ClientCore>

    /// Prepares a client for `server`; nothing is sent until `connect()`. Throws
    /// `SocketAddressError.unsupported` for an address a UDP client can't use (Unix socket, port 0,
    /// broadcast, multicast).
    public init(configuration: ClientConfiguration, server: SocketAddress, options: UDPOptions = UDPOptions(),
                group: any EventLoopGroup = MultiThreadedEventLoopGroup.singleton, onDatagram: DatagramHandler? = nil,
                onEvent: EventHandler? = nil) throws {
        guard let remote = PathAddress(server), remote.isUnicastSendable else {
            throw SocketAddressError.unsupported
        }
        eventLoop = group.next()
        let (events, eventSink) = AsyncStream.makeStream(of: ClientEvent.self)
        let (datagrams, datagramSink) = AsyncStream.makeStream(of: [UInt8].self, bufferingPolicy: .bufferingNewest(1024))
        self.events = events
        self.datagrams = datagrams
        core = NIOLoopBoundBox.makeBoxSendingValue(
            ClientCore(configuration: configuration, server: server, remote: remote, options: options, eventLoop: eventLoop,
                       events: eventSink, datagrams: datagramSink, onDatagram: onDatagram, onEvent: onEvent),
            as: ClientCore.self, eventLoop: eventLoop)
    }

    /// Binds a local port, handshakes, and returns once the connection is established (including the
    /// certificate check). Throws the `ConnectionError` that ended the handshake, or the bind error.
    /// After a reconnect has started, waits for the new connection.
    /// Cancelling the calling task stops the wait (with `CancellationError`), not the handshake.
    public func connect() async throws {
        let token = WaiterToken()
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (waiter: CheckedContinuation<Void, any Error>) in
                eventLoop.execute { self.core.value.connect(waiter, token: token) }
            }
        } onCancel: {
            eventLoop.execute { self.core.value.cancelWait(token) }
        }
    }

    /// Queues a control message (reliable, in order). Throws the `ConnectionError` from
    /// `WireClient.sendControl`, or `WireClientError.notRunning`.
    public func send(control message: [UInt8]) async throws {
        try await eventLoop.submit { try self.core.value.sendControl(message) }.get()
    }

    /// Sends one audio datagram now. False if the connection can't send it (not established, too
    /// large); audio is never queued.
    @discardableResult
    public func send(datagram payload: [UInt8]) async -> Bool {
        (try? await eventLoop.submit { payload.withUnsafeBytes { self.core.value.sendDatagram($0) } }.get()) ?? false
    }

    /// Moves the session to a new local socket (a new port) and tells the server with a path probe;
    /// no new handshake. This is what the app does after waking on a new network, and what NAT
    /// rebinding looks like to the server.
    public func rebind() async throws {
        try await eventLoop.flatSubmit { self.core.value.rebind() }.get()
    }

    /// Closes the connection (CONNECTION_CLOSE with `code` and `reason`, best effort), then the socket,
    /// and finishes both streams. Calling it again is harmless.
    public func close(code: UInt64 = 0, reason: String = "") async {
        try? await eventLoop.flatSubmit { self.core.value.close(code: code, reason: reason) }.get()
    }

    /// The local socket's address (it changes with `rebind()`), or nil while there is none.
    public func localAddress() async -> SocketAddress? {
        try? await eventLoop.submit { self.core.value.channel?.localAddress }.get()
    }

    /// Runs `body` on the event loop with the client (nil before `connect()`), e.g. to read statistics.
    public func withClient<T: Sendable>(_ body: @escaping @Sendable (WireClient?) throws -> T) async throws -> T {
        try await eventLoop.submit { try body(self.core.value.client) }.get()
    }

    // MARK: Event loop only

    /// Seals and writes one datagram, flushed at the end of this event-loop tick. Event loop only.
    @discardableResult
    public func sendDatagram(_ payload: UnsafeRawBufferPointer) -> Bool { core.value.sendDatagram(payload) }

    /// The adapter's counters. Event loop only.
    public var stats: WireClientStats { core.value.stats }
}

/// Identifies one `connect()` wait, so that its cancellation resumes that wait and no other.
final class WaiterToken: Sendable {}

/// Everything the client owns on its event loop.
final class ClientCore: DatagramDriver {
    enum State { case idle, binding, running, closed }

    let configuration: ClientConfiguration
    let server: SocketAddress
    let remote: PathAddress
    let options: UDPOptions
    let eventLoop: any EventLoop
    let eventSink: AsyncStream<ClientEvent>.Continuation
    let datagramSink: AsyncStream<[UInt8]>.Continuation
    let onDatagram: WireClientChannel.DatagramHandler?
    let onEvent: WireClientChannel.EventHandler?
    var state = State.idle
    var client: WireClient?
    var channel: (any Channel)?
    var output: DatagramOutput
    let receiveBuffer = ScratchBuffer(size: 65_536)
    var timer = LoopTimer()
    var waiters: [(token: WaiterToken, continuation: CheckedContinuation<Void, any Error>)] = []
    /// Cancellations that arrived before their wait did (a task cancelled before it called connect).
    var cancelledEarly: [WaiterToken] = []
    /// The connection whose certificate is being checked, and a counter that tells a stale answer
    /// (from a connection a reconnect replaced) from the current one.
    var checking: Connection?
    var checkGeneration = 0
    var inCycle = false
    var outputScheduled = false
    var stats = WireClientStats()
    var rebindDelay = TimeAmount.zero

    init(configuration: ClientConfiguration, server: SocketAddress, remote: PathAddress, options: UDPOptions, eventLoop: any EventLoop,
         events: AsyncStream<ClientEvent>.Continuation, datagrams: AsyncStream<[UInt8]>.Continuation,
         onDatagram: WireClientChannel.DatagramHandler?, onEvent: WireClientChannel.EventHandler?) {
        self.configuration = configuration
        self.server = server
        self.remote = remote
        self.options = options
        self.eventLoop = eventLoop
        eventSink = events
        datagramSink = datagrams
        self.onDatagram = onDatagram
        self.onEvent = onEvent
        output = DatagramOutput(slot: max(configuration.connection.maxDatagramSize, 1200))
    }

    // MARK: Commands

    func connect(_ waiter: CheckedContinuation<Void, any Error>, token: WaiterToken) {
        if let index = cancelledEarly.firstIndex(where: { $0 === token }) {
            cancelledEarly.remove(at: index)
            waiter.resume(throwing: CancellationError())
            return
        }
        switch state {
        case .closed:
            waiter.resume(throwing: client?.connection.error ?? ConnectionError.local(code: 0, reason: "closed"))
        case .running where client?.connection.state == .established:
            waiter.resume()
        case .running, .binding:
            waiters.append((token, waiter))
        case .idle:
            waiters.append((token, waiter))
            state = .binding
            bind().assumeIsolated().whenComplete { [self] result in
                guard state == .binding else { return }
                switch result {
                case .success:
                    state = .running
                    let now = WireNIO.now()
                    client = WireClient(configuration: configuration, remote: remote, now: now)
                    inCycle = true
                    finishCycle(now: now)
                case .failure(let error):
                    state = .closed
                    finishStreams()
                    failWaiters(error)
                }
            }
        }
    }

    func sendControl(_ message: [UInt8]) throws {
        guard state == .running, let client else { throw WireClientError.notRunning }
        try client.sendControl(message)
        requestOutput()
    }

    func sendDatagram(_ payload: UnsafeRawBufferPointer) -> Bool {
        guard state == .running, let client else { return false }
        let now = WireNIO.now()
        guard case .written = output.emit({ client.sendDatagram(payload, into: $0, now: now) }) else { return false }
        stats.datagramsSent += 1
        requestOutput()
        return true
    }

    func rebind() -> EventLoopFuture<Void> {
        guard state == .running, client != nil else { return eventLoop.makeFailedFuture(WireClientError.notRunning) }
        let old = channel
        return bind().assumeIsolated().map { [self] _ in migrated(from: old) }.nonisolated()
    }

    /// After a new socket replaced `old`: close the old one and carry the session over. `newPath` is
    /// false after a recovery from a socket error, which is no news about the server.
    func migrated(from old: (any Channel)?, newPath: Bool = true) {
        stats.rebinds += 1
        old?.close(promise: nil)
        guard state == .running, let client else { return }
        let now = WireNIO.now()
        client.migrate(now: now, newPath: newPath)
        inCycle = true
        finishCycle(now: now)
    }

    func close(code: UInt64, reason: String) -> EventLoopFuture<Void> {
        switch state {
        case .idle, .binding:
            state = .closed
            finishStreams()
            failWaiters(ConnectionError.local(code: code, reason: reason))
            return eventLoop.makeSucceededVoidFuture()
        case .closed:
            return channel?.closeFuture ?? eventLoop.makeSucceededVoidFuture()
        case .running:
            let closing = channel
            if let client {
                inCycle = true
                client.close(code: code, reason: reason, now: WireNIO.now())
                finishCycle(now: WireNIO.now())
            }
            // finishCycle saw the connection end and closed the socket.
            return closing?.closeFuture ?? eventLoop.makeSucceededVoidFuture()
        }
    }

    // MARK: Socket lifecycle

    func bind() -> EventLoopFuture<any Channel> {
        let bound = NIOLoopBound(self, eventLoop: eventLoop)
        return options.bootstrap(on: eventLoop)
            .channelInitializer { channel in
                do {
                    try channel.pipeline.syncOperations.addHandler(DatagramHandler(driver: bound.value))
                    return channel.eventLoop.makeSucceededVoidFuture()
                } catch {
                    return channel.eventLoop.makeFailedFuture(error)
                }
            }
            .bind(host: options.localHost ?? (remote.isIPv6 ? "::" : "0.0.0.0"), port: 0)
            .flatMapThrowing { [bound] channel in
                try bound.value.attach(channel)
                return channel
            }
    }

    func attach(_ channel: any Channel) throws {
        guard state == .binding || state == .running else {
            channel.close(promise: nil)
            throw WireClientError.notRunning
        }
        let context = try channel.pipeline.syncOperations.context(handlerType: DatagramHandler.self)
        output.attach(context, socketIsIPv6: remote.isIPv6)
        _ = output.addresses.learn(remote, server)
        self.channel = channel
        channel.closeFuture.assumeIsolated().whenComplete { [self] _ in closed(channel) }
    }

    /// NIO closed the socket (a fatal send or receive error): carry on from a new one, as after a
    /// network change.
    func closed(_ channel: any Channel) {
        guard channel === self.channel else { return }
        self.channel = nil
        // A read cycle the close cut short never reaches channelReadComplete.
        inCycle = false
        if state == .running { scheduleRecovery() }
    }

    func scheduleRecovery() {
        eventLoop.assumeIsolated().scheduleTask(in: rebindDelay) { [self] in
            guard state == .running, channel == nil else { return }
            bind().assumeIsolated().whenComplete { [self] result in
                switch result {
                case .success:
                    rebindDelay = .zero
                    migrated(from: nil, newPath: false)
                case .failure:
                    rebindDelay = min(max(rebindDelay * 2, .milliseconds(50)), .seconds(2))
                    scheduleRecovery()
                }
            }
        }
    }

    // MARK: DatagramDriver

    func attached(_ context: ChannelHandlerContext) {}

    func detached(_ context: ChannelHandlerContext) { output.detach(context) }

    func read(_ envelope: AddressedEnvelope<ByteBuffer>) {
        inCycle = true
        guard state == .running, let client else { return }
        stats.datagramsReceived += 1
        guard PathAddress(envelope.remoteAddress) == remote else {
            stats.droppedForeign += 1
            return
        }
        guard let datagram = receiveBuffer.load(envelope.data) else {
            stats.droppedOversize += 1
            return
        }
        client.receive(datagram, from: remote, now: WireNIO.now()) { payload in
            if let onDatagram { onDatagram(payload) } else { datagramSink.yield(Array(payload)) }
        }
    }

    func readComplete() {
        inCycle = true
        guard state == .running, let client else { inCycle = false; return }
        let now = WireNIO.now()
        client.handleTimeout(now: now)
        finishCycle(now: now)
    }

    func caught(_ error: any Error) { stats.socketErrors += 1 }

    // MARK: Driving the client

    func requestOutput() {
        guard !inCycle, !outputScheduled else { return }
        outputScheduled = true
        eventLoop.assumeIsolated().execute { [self] in
            outputScheduled = false
            guard state == .running else { return }
            inCycle = true
            finishCycle(now: WireNIO.now())
        }
    }

    /// After anything happened to the client: report events, start a certificate check, send, re-arm
    /// the timer, and shut down if the session ended for good.
    func finishCycle(now: WireInstant, timerFired: Bool = false) {
        defer { inCycle = false }
        guard let client else { return }
        deliverEvents()
        startCertificateCheck()
        while case .written = output.emit({ client.poll(into: $0, now: now) }) { stats.datagramsSent += 1 }
        output.flush()
        // `WireClient` replaces a connection that reconnecting fixes, so an error on the current one
        // is final.
        if let error = client.connection.error {
            finish(error)
            return
        }
        timer.arm(client.nextDeadline, minimum: timerFired ? now.nanoseconds + 1_000_000 : 0, on: eventLoop) { [self] in
            timer.fired()
            guard state == .running, let client = self.client else { return }
            inCycle = true
            let now = WireNIO.now()
            client.handleTimeout(now: now)
            finishCycle(now: now, timerFired: true)
        }
    }

    func deliverEvents() {
        guard let client else { return }
        while let event = client.nextEvent() {
            if let onEvent { onEvent(event) } else { eventSink.yield(event) }
            if case .connection(.connected) = event {
                for waiter in waiters { waiter.continuation.resume() }
                waiters.removeAll()
            }
        }
    }

    func startCertificateCheck() {
        guard let client, let check = client.connection.pendingCertificateCheck, checking !== client.connection else { return }
        checking = client.connection
        checkGeneration += 1
        let generation = checkGeneration
        let validator = configuration.validator
        let bound = NIOLoopBound(self, eventLoop: eventLoop)
        let eventLoop = eventLoop
        // swift-certificates validates asynchronously; the answer comes back to the event loop.
        Task {
            let result = await validator.validate(check)
            eventLoop.execute { bound.value.certificateChecked(result, generation: generation) }
        }
    }

    func certificateChecked(_ result: Result<Void, HandshakeFailure>, generation: Int) {
        guard generation == checkGeneration, state == .running, let client, client.connection === checking else { return }
        checking = nil
        let now = WireNIO.now()
        inCycle = true
        client.completeCertificateCheck(result, now: now)
        finishCycle(now: now)
    }

    /// The session is over: fail whoever waits for it, close the socket, end the streams.
    func finish(_ error: ConnectionError) {
        state = .closed
        timer.cancel()
        failWaiters(error)
        channel?.close(promise: nil)
        finishStreams()
    }

    func failWaiters(_ error: any Error) {
        for waiter in waiters { waiter.continuation.resume(throwing: error) }
        waiters.removeAll()
    }

    func cancelWait(_ token: WaiterToken) {
        guard let index = waiters.firstIndex(where: { $0.token === token }) else {
            // Usually a wait that is about to arrive; a wait that already ended leaves a token here,
            // so keep only a few.
            if cancelledEarly.count >= 64 { cancelledEarly.removeFirst() }
            cancelledEarly.append(token)
            return
        }
        waiters.remove(at: index).continuation.resume(throwing: CancellationError())
    }

    func finishStreams() {
        eventSink.finish()
        datagramSink.finish()
    }
}
