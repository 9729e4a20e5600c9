import NIOCore
import NIOPosix

/// Errors from ``ImpairmentProxy``.
public enum ImpairmentProxyError: Error, Sendable, Hashable {
    /// `start()` was called on a proxy that was already started or stopped.
    case alreadyStarted
    /// The proxy is not running (not started yet, or stopped).
    case notRunning
    /// No datagram has come from this client address yet.
    case unknownClient(SocketAddress)
    /// The client's first upstream socket is still being opened (or failed to open), so there is nothing to rebind.
    case upstreamNotReady(SocketAddress)
}

/// One client's NAT-style mapping.
public struct ProxyClient: Sendable, Hashable {
    /// The client's address as the proxy sees it.
    public var client: SocketAddress
    /// The local port of the client's current upstream socket: the source port the server sees. `nil` while the
    /// first socket is still being opened.
    public var upstreamPort: Int?
}

/// A snapshot of the proxy's counters.
public struct ProxyStats: Sendable, Hashable {
    /// The impairment model's per-direction counters.
    public var impairment: ImpairmentStats
    /// Clients currently mapped, each holding one upstream socket; 0 after `stop()`.
    public var clients: Int
    /// Distinct client addresses seen since `start()`.
    public var clientsSeen: UInt64
    /// Successful upstream socket replacements (NAT rebinds).
    public var rebinds: UInt64
    /// Datagrams waiting on a delivery timer.
    public var scheduled: Int
    /// Copies the model forwarded that could not be sent: no upstream socket could be opened, the pending queue
    /// of a socket still opening was full, or the proxy stopped first.
    public var undeliverable: UInt64
    /// Sockets the proxy holds open: the listening socket plus one per client with an upstream socket.
    public var openSockets: Int
}

/// A seeded UDP impairment proxy between UDP clients and one UDP server, for reproducible transport tests.
///
/// Clients send to the proxy's listening port; for each distinct client address the proxy opens its own upstream
/// socket, like a NAT, so the server sees one proxy port per client and its replies find their way back. Both
/// directions go through an ``ImpairmentModel``; each copy it forwards is sent from a timer at its `deliverAt`.
/// One `scheduleTask` per datagram costs a heap insertion and a small allocation, which is well within budget at
/// push-to-talk rates (tens of datagrams per second per talker, and ~10k/s for a whole benchmark).
///
/// ```swift
/// let proxy = ImpairmentProxy(
///     upstream: try SocketAddress(ipAddress: "127.0.0.1", port: serverPort),
///     clientToServer: Impairment(lossPercent: 5, delayMilliseconds: 20, jitterMilliseconds: 10, seed: 42),
///     serverToClient: Impairment(lossPercent: 5, delayMilliseconds: 20, seed: 42))
/// let port = try await proxy.start()   // point the client at 127.0.0.1:port
/// try await proxy.rebind(client: clientAddress)
/// await proxy.stop()
/// ```
///
/// Like a full-cone NAT, a client's upstream socket relays replies from any source back to that client, and a
/// mapping lives until ``stop()``.
///
/// Thread safety: the proxy is `Sendable` because its only mutable state sits in a `NIOLoopBoundBox` bound to one
/// event loop, every socket is created on that same loop (so handlers and timers run there too), and every public
/// method hops onto it before touching the state. The box traps if anything ever reaches it off the loop.
public final class ImpairmentProxy: Sendable {
    /// The event loop that owns every socket, timer and counter of this proxy.
    public let eventLoop: any EventLoop

    private let listenHost: String
    private let listenPort: Int
    private let upstream: SocketAddress
    private let upstreamBindHost: String
    private let maxDatagramSize: Int
    private let maxPendingPerClient: Int
    private let state: NIOLoopBoundBox<State>

    /// Creates a stopped proxy; nothing is bound until ``start()``.
    /// - Parameters:
    ///   - listenHost: address the clients send to.
    ///   - listenPort: port to listen on, 0 for any free port (see the value `start()` returns).
    ///   - upstream: the server's address.
    ///   - upstreamBindHost: local address for the per-client upstream sockets (their ports are always ephemeral).
    ///   - clientToServer: impairment for client → server datagrams.
    ///   - serverToClient: impairment for server → client datagrams.
    ///   - maxDatagramSize: largest datagram relayed whole; longer ones are truncated by the socket read.
    ///   - eventLoopGroup: where the proxy takes its one event loop from.
    public init(
        listenHost: String = "127.0.0.1",
        listenPort: Int = 0,
        upstream: SocketAddress,
        upstreamBindHost: String = "127.0.0.1",
        clientToServer: Impairment = .none,
        serverToClient: Impairment = .none,
        maxDatagramSize: Int = 65_536,
        eventLoopGroup: any EventLoopGroup = MultiThreadedEventLoopGroup.singleton
    ) {
        let loop = eventLoopGroup.next()
        self.eventLoop = loop
        self.listenHost = listenHost
        self.listenPort = listenPort
        self.upstream = upstream
        self.upstreamBindHost = upstreamBindHost
        self.maxDatagramSize = max(maxDatagramSize, 1)
        self.maxPendingPerClient = 1024
        let model = ImpairmentModel(clientToServer: clientToServer, serverToClient: serverToClient)
        self.state = NIOLoopBoundBox.makeBoxSendingValue(State(model: model), as: State.self, eventLoop: loop)
    }

    // MARK: Public API

    /// Binds the listening socket and starts relaying.
    /// - Returns: the bound listening port (useful with `listenPort: 0`).
    /// - Throws: ``ImpairmentProxyError/alreadyStarted`` on a second call, or the bind error.
    public func start() async throws -> Int {
        let bound: EventLoopFuture<Channel> = eventLoop.flatSubmit {
            guard case .idle = self.state.value.phase else {
                return self.eventLoop.makeFailedFuture(ImpairmentProxyError.alreadyStarted)
            }
            self.state.value.phase = .starting
            return self.datagramBootstrap { _ in ClientSideHandler(proxy: self) }
                .bind(host: self.listenHost, port: self.listenPort)
                .flatMapError { error in
                    self.state.value.phase = .idle
                    return self.eventLoop.makeFailedFuture(error)
                }
                .flatMap { channel in
                    // stop() may have run while the bind was in flight; it cannot have seen this channel.
                    guard case .starting = self.state.value.phase else {
                        return channel.close().flatMapThrowing { throw ImpairmentProxyError.notRunning }
                    }
                    self.state.value.phase = .running(channel)
                    return self.eventLoop.makeSucceededFuture(channel)
                }
        }
        let channel = try await bound.get()
        return channel.localAddress?.port ?? listenPort
    }

    /// Stops relaying: cancels every pending delivery and closes the listening socket and every upstream socket.
    /// Safe to call more than once, and before `start()`.
    public func stop() async {
        let closed: EventLoopFuture<Void> = eventLoop.flatSubmit {
            var channels: [Channel] = []
            if case .running(let listener) = self.state.value.phase { channels.append(listener) }
            self.state.value.phase = .stopped
            for timer in self.state.value.timers.values { timer.cancel() }
            self.state.value.timers.removeAll()
            for session in self.state.value.sessions.values {
                if let channel = session.channel { channels.append(channel) }
                self.state.value.undeliverable += UInt64(session.pending.count)
            }
            self.state.value.sessions.removeAll()
            let closes = channels.map { channel in
                channel.close().recover { _ in }  // already closed is fine: the goal is closed
            }
            return EventLoopFuture.andAllComplete(closes, on: self.eventLoop)
        }
        try? await closed.get()
    }

    /// Replaces the impairment of one direction while running (see ``ImpairmentModel/setImpairment(_:for:)`` for
    /// how the seed is treated). Datagrams already scheduled keep their delivery time.
    public func setImpairment(_ impairment: Impairment, direction: Direction) async {
        try? await eventLoop.submit {
            self.state.value.model.setImpairment(impairment, for: direction)
        }.get()
    }

    /// The impairment currently applied to `direction`.
    public func impairment(for direction: Direction) async -> Impairment {
        (try? await eventLoop.submit { self.state.value.model.impairment(for: direction) }.get()) ?? .none
    }

    /// Simulates an outage: every datagram arriving in either direction during the next `duration` is dropped
    /// (counted as blackholed). Datagrams accepted before it started are still delivered. Calling again replaces
    /// the window; a zero duration ends an outage at once.
    public func blackhole(for duration: Duration) async {
        let (seconds, attoseconds) = duration.components
        // Capped at ~30 years so the nanosecond sum cannot overflow.
        let nanoseconds = min(max(0, seconds), 1_000_000_000) * 1_000_000_000 + max(0, attoseconds) / 1_000_000_000
        try? await eventLoop.submit {
            let now = NIODeadline.now().uptimeNanoseconds
            self.state.value.model.blackhole(until: now &+ UInt64(clamping: nanoseconds))
        }.get()
    }

    /// Simulates NAT rebinding for one client: opens a new upstream socket (new source port), switches the client
    /// to it and closes the old one, so the server sees the same session arrive from a new address. The new socket
    /// is opened before the old one closes, which both guarantees a different port and leaves no gap in the
    /// client → server path; replies still in flight to the old port are lost, as with a real rebinding NAT.
    /// - Parameter client: the client's address as the proxy sees it (see ``clients()``).
    /// - Returns: the new upstream source port.
    public func rebind(client: SocketAddress) async throws -> Int {
        let rebound: EventLoopFuture<Int> = eventLoop.flatSubmit { self.rebindOnLoop(client) }
        return try await rebound.get()
    }

    /// Rebinds every client that has an upstream socket (see ``rebind(client:)``).
    /// - Returns: how many clients were rebound.
    @discardableResult
    public func rebindAll() async -> Int {
        let all: EventLoopFuture<Int> = eventLoop.flatSubmit {
            let clients = self.state.value.sessions.values.filter { $0.channel != nil }.map(\.client)
            let rebinds = clients.map { self.rebindOnLoop($0) }
            return EventLoopFuture.whenAllComplete(rebinds, on: self.eventLoop).map { results in
                results.reduce(0) { count, result in
                    if case .success = result { return count + 1 }
                    return count
                }
            }
        }
        return (try? await all.get()) ?? 0
    }

    /// The clients seen so far and the upstream port each is mapped to.
    public func clients() async -> [ProxyClient] {
        let snapshot = eventLoop.submit {
            self.state.value.sessions.values.map { ProxyClient(client: $0.client, upstreamPort: $0.upstreamPort) }
        }
        return (try? await snapshot.get()) ?? []
    }

    /// A snapshot of the counters.
    public func stats() async -> ProxyStats {
        let snapshot = eventLoop.submit { self.statsOnLoop() }
        return (try? await snapshot.get())
            ?? ProxyStats(
                impairment: ImpairmentStats(), clients: 0, clientsSeen: 0, rebinds: 0, scheduled: 0,
                undeliverable: 0, openSockets: 0)
    }

    // MARK: Event-loop internals

    private enum Phase: Sendable {
        case idle
        case starting
        case running(Channel)
        case stopped
    }

    private struct Session: Sendable {
        var client: SocketAddress
        /// The current upstream socket; nil until the first bind completes.
        var channel: Channel?
        var upstreamPort: Int?
        /// Client datagrams due before the first upstream socket was ready.
        var pending: [ByteBuffer] = []
        var binding = false
    }

    private struct State: Sendable {
        var phase: Phase = .idle
        var model: ImpairmentModel
        var sessions: [SocketAddress: Session] = [:]
        var timers: [UInt64: Scheduled<Void>] = [:]
        var nextTimerID: UInt64 = 0
        var rebinds: UInt64 = 0
        var clientsSeen: UInt64 = 0
        var undeliverable: UInt64 = 0

        init(model: ImpairmentModel) {
            self.model = model
        }

        var isRunning: Bool {
            if case .running = phase { return true }
            return false
        }

        var listener: Channel? {
            if case .running(let channel) = phase { return channel }
            return nil
        }
    }

    private func statsOnLoop() -> ProxyStats {
        let state = self.state.value
        let upstreamSockets = state.sessions.values.filter { $0.channel != nil }.count
        return ProxyStats(
            impairment: state.model.stats,
            clients: state.sessions.count,
            clientsSeen: state.clientsSeen,
            rebinds: state.rebinds,
            scheduled: state.timers.count,
            undeliverable: state.undeliverable,
            openSockets: (state.listener == nil ? 0 : 1) + upstreamSockets
        )
    }

    private func datagramBootstrap(
        _ makeHandler: @escaping @Sendable (Channel) -> any ChannelHandler
    ) -> DatagramBootstrap {
        DatagramBootstrap(group: eventLoop)
            .channelOption(.recvAllocator, value: FixedSizeRecvByteBufferAllocator(capacity: maxDatagramSize))
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(makeHandler(channel))
                }
            }
    }

    /// A datagram from a client arrived on the listening socket.
    fileprivate func clientDatagram(_ envelope: AddressedEnvelope<ByteBuffer>) {
        guard state.value.isRunning else { return }
        let client = envelope.remoteAddress
        if state.value.sessions[client] == nil {
            state.value.sessions[client] = Session(client: client)
            state.value.clientsSeen += 1
            openFirstUpstream(for: client)
        }
        impair(envelope.data, direction: .clientToServer) { buffer in
            self.sendUpstream(buffer, for: client)
        }
    }

    /// A reply arrived on one client's upstream socket.
    fileprivate func upstreamDatagram(
        _ envelope: AddressedEnvelope<ByteBuffer>, on channel: Channel, for client: SocketAddress
    ) {
        // A socket replaced by a rebind may still drain a read; the NAT has forgotten that mapping.
        guard state.value.isRunning, let current = state.value.sessions[client]?.channel, current === channel else {
            return
        }
        impair(envelope.data, direction: .serverToClient) { buffer in
            guard let listener = self.state.value.listener else {
                self.state.value.undeliverable += 1
                return
            }
            listener.writeAndFlush(AddressedEnvelope(remoteAddress: client, data: buffer), promise: nil)
        }
    }

    private func impair(
        _ buffer: ByteBuffer, direction: Direction, send: @escaping @Sendable (ByteBuffer) -> Void
    ) {
        let now = NIODeadline.now().uptimeNanoseconds
        let decision = state.value.model.process(byteCount: buffer.readableBytes, direction: direction, now: now)
        let deliveries = decision.deliveries
        guard !deliveries.isEmpty else { return }
        // The read buffer has the full receive capacity behind it; shrink it before holding it on a timer so a
        // backlog of delayed datagrams costs their size, not 64 KiB each.
        let wasteful = buffer.capacity > 4 * buffer.readableBytes + 64
        let held =
            wasteful && deliveries.contains(where: { $0.deliverAt > now })
            ? ByteBuffer(bytes: buffer.readableBytesView) : buffer
        for delivery in deliveries {
            // Sending inline only while no timer is pending, so an immediate datagram cannot overtake one whose
            // timer is already due but has not fired yet.
            if delivery.deliverAt <= now && state.value.timers.isEmpty {
                send(held)
            } else {
                schedule(at: delivery.deliverAt) { send(held) }
            }
        }
    }

    private func schedule(at deliverAt: UInt64, _ action: @escaping @Sendable () -> Void) {
        let id = state.value.nextTimerID
        state.value.nextTimerID &+= 1
        let timer = eventLoop.scheduleTask(deadline: .uptimeNanoseconds(deliverAt)) {
            guard self.state.value.timers.removeValue(forKey: id) != nil else { return }
            action()
        }
        state.value.timers[id] = timer
    }

    private func sendUpstream(_ buffer: ByteBuffer, for client: SocketAddress) {
        guard state.value.isRunning, var session = state.value.sessions[client] else {
            state.value.undeliverable += 1
            return
        }
        if let channel = session.channel {
            channel.writeAndFlush(AddressedEnvelope(remoteAddress: upstream, data: buffer), promise: nil)
            return
        }
        guard session.pending.count < maxPendingPerClient else {
            state.value.undeliverable += 1
            return
        }
        session.pending.append(buffer)
        if !session.binding {
            // The first bind failed earlier; a new datagram is the cue to try again, as a NAT would.
            state.value.sessions[client] = session
            openFirstUpstream(for: client)
            return
        }
        state.value.sessions[client] = session
    }

    private func openFirstUpstream(for client: SocketAddress) {
        state.value.sessions[client]?.binding = true
        bindUpstream(for: client).whenComplete { result in
            guard self.state.value.isRunning, var session = self.state.value.sessions[client] else {
                if case .success(let channel) = result { channel.close(promise: nil) }
                return
            }
            session.binding = false
            switch result {
            case .success(let channel):
                session.channel = channel
                session.upstreamPort = channel.localAddress?.port
                for buffer in session.pending {
                    channel.write(AddressedEnvelope(remoteAddress: self.upstream, data: buffer), promise: nil)
                }
                channel.flush()
            case .failure:
                self.state.value.undeliverable += UInt64(session.pending.count)
            }
            session.pending.removeAll()
            self.state.value.sessions[client] = session
        }
    }

    private func bindUpstream(for client: SocketAddress) -> EventLoopFuture<Channel> {
        datagramBootstrap { _ in UpstreamHandler(proxy: self, client: client) }
            .bind(host: upstreamBindHost, port: 0)
    }

    private func rebindOnLoop(_ client: SocketAddress) -> EventLoopFuture<Int> {
        guard state.value.isRunning else { return eventLoop.makeFailedFuture(ImpairmentProxyError.notRunning) }
        guard let session = state.value.sessions[client] else {
            return eventLoop.makeFailedFuture(ImpairmentProxyError.unknownClient(client))
        }
        guard session.channel != nil else {
            return eventLoop.makeFailedFuture(ImpairmentProxyError.upstreamNotReady(client))
        }
        return bindUpstream(for: client).flatMapThrowing { channel in
            guard self.state.value.isRunning, var session = self.state.value.sessions[client] else {
                channel.close(promise: nil)
                throw ImpairmentProxyError.notRunning
            }
            let old = session.channel
            session.channel = channel
            session.upstreamPort = channel.localAddress?.port
            self.state.value.sessions[client] = session
            self.state.value.rebinds += 1
            old?.close(promise: nil)
            return session.upstreamPort ?? 0
        }
    }
}

/// Reads client datagrams off the listening socket.
private final class ClientSideHandler: ChannelInboundHandler, Sendable {
    typealias InboundIn = AddressedEnvelope<ByteBuffer>

    private let proxy: ImpairmentProxy

    init(proxy: ImpairmentProxy) {
        self.proxy = proxy
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        proxy.clientDatagram(unwrapInboundIn(data))
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        // A UDP socket keeps working after a failed read or an ICMP error; a proxy that closed on one would turn
        // a transient error into an outage the test did not ask for.
    }
}

/// Reads server replies off one client's upstream socket.
private final class UpstreamHandler: ChannelInboundHandler, Sendable {
    typealias InboundIn = AddressedEnvelope<ByteBuffer>

    private let proxy: ImpairmentProxy
    private let client: SocketAddress

    init(proxy: ImpairmentProxy, client: SocketAddress) {
        self.proxy = proxy
        self.client = client
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        // The channel identifies the socket, so a read drained from one a rebind replaced can be told apart.
        proxy.upstreamDatagram(unwrapInboundIn(data), on: context.channel, for: client)
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        // Same as the client side: stay open through transient socket errors.
    }
}
