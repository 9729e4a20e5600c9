import NIOConcurrencyHelpers
import NIOCore
import NIOPosix

/// A datagram a test peer received, with when (NIODeadline's clock, the proxy's clock too).
struct Received: Sendable {
    var bytes: [UInt8]
    var from: SocketAddress
    var at: UInt64
}

/// A real UDP socket on 127.0.0.1 for the tests: a client that records what comes back, or an echo server that
/// also records who sent each datagram (to see the proxy's per-client source ports).
final class UDPPeer: Sendable {
    let channel: Channel
    private let inbox: NIOLockedValueBox<[Received]>

    private init(channel: Channel, inbox: NIOLockedValueBox<[Received]>) {
        self.channel = channel
        self.inbox = inbox
    }

    static func bind(echo: Bool, port: Int = 0) async throws -> UDPPeer {
        let inbox = NIOLockedValueBox<[Received]>([])
        let channel = try await DatagramBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            // Large enough that the byte-for-byte test can tell truncation by the proxy from truncation here.
            .channelOption(.recvAllocator, value: FixedSizeRecvByteBufferAllocator(capacity: 65_536))
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(RecordingHandler(inbox: inbox, echo: echo))
                }
            }
            .bind(host: "127.0.0.1", port: port)
            .get()
        return UDPPeer(channel: channel, inbox: inbox)
    }

    var port: Int { channel.localAddress?.port ?? 0 }
    var address: SocketAddress { channel.localAddress! }

    var received: [Received] { inbox.withLockedValue { $0 } }

    func send(_ bytes: [UInt8], to address: SocketAddress) {
        channel.writeAndFlush(AddressedEnvelope(remoteAddress: address, data: ByteBuffer(bytes: bytes)), promise: nil)
    }

    /// Waits until at least `count` datagrams have arrived or `timeout` passes; returns what arrived.
    @discardableResult
    func waitFor(count: Int, timeout: Duration = .seconds(5)) async -> [Received] {
        await waitUntil(timeout: timeout) { self.received.count >= count }
        return received
    }

    func close() async {
        try? await channel.close()
    }
}

private final class RecordingHandler: ChannelInboundHandler, Sendable {
    typealias InboundIn = AddressedEnvelope<ByteBuffer>
    typealias OutboundOut = AddressedEnvelope<ByteBuffer>

    private let inbox: NIOLockedValueBox<[Received]>
    private let echo: Bool

    init(inbox: NIOLockedValueBox<[Received]>, echo: Bool) {
        self.inbox = inbox
        self.echo = echo
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let envelope = unwrapInboundIn(data)
        let now = NIODeadline.now().uptimeNanoseconds
        inbox.withLockedValue {
            $0.append(Received(bytes: Array(envelope.data.readableBytesView), from: envelope.remoteAddress, at: now))
        }
        if echo {
            context.writeAndFlush(wrapOutboundOut(envelope), promise: nil)
        }
    }
}

/// Polls `condition` every 10 ms until it holds or `timeout` passes. Returns whether it held.
@discardableResult
func waitUntil(timeout: Duration, _ condition: @Sendable () async -> Bool) async -> Bool {
    let clock = ContinuousClock()
    let deadline = clock.now + timeout
    while clock.now < deadline {
        if await condition() { return true }
        try? await Task.sleep(for: .milliseconds(10))
    }
    return await condition()
}

/// Deterministic test payloads: `count` datagrams of varied sizes whose first bytes are the index.
func payloads(count: Int, sizes: [Int] = [4, 20, 160, 1200, 1400, 8000]) -> [[UInt8]] {
    (0..<count).map { index in
        let size = sizes[index % sizes.count]
        var bytes = (0..<size).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ index &* 7) }
        bytes[0] = UInt8(truncatingIfNeeded: index >> 8)
        bytes[1] = UInt8(truncatingIfNeeded: index)
        return bytes
    }
}

func index(of payload: [UInt8]) -> Int {
    Int(payload[0]) << 8 | Int(payload[1])
}
