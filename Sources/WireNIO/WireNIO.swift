#if canImport(Glibc)
import Glibc
#endif
import NIOCore
import NIOPosix
import Wire

/// SwiftNIO UDP adapters that drive `Wire` connections and endpoints (issue 3).
public enum WireNIO {
    /// The clock the adapters give the sans-I/O core. It is the clock NIO schedules timers on, so a
    /// `WireInstant` deadline maps to `NIODeadline.uptimeNanoseconds` with no conversion.
    @inlinable
    public static func now() -> WireInstant { WireInstant(nanoseconds: NIODeadline.now().uptimeNanoseconds) }

    /// Names the clock `now()` reads (`ServerSecrets.clockEpoch`): the kernel's boot ID, since the
    /// monotonic clock starts again at each boot, hashed (FNV-1a) to 64 bits. Where there is none
    /// (not Linux, no /proc), a random number: tokens then live as long as the process.
    public static func monotonicClockEpoch(bootIDPath: String = "/proc/sys/kernel/random/boot_id") -> UInt64 {
        guard let file = fopen(bootIDPath, "r") else { return .random(in: .min ... .max) }
        defer { fclose(file) }
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        var read = 0
        while read < 64, case let c = fgetc(file), c != EOF, c != 0x0a {
            hash = (hash ^ UInt64(UInt8(truncatingIfNeeded: c))) &* 0x100_0000_01b3
            read += 1
        }
        return read == 0 ? .random(in: .min ... .max) : hash
    }
}

/// Socket settings shared by the server and the client.
public struct UDPOptions: Sendable {
    /// Datagrams per `recvmmsg` call (Linux); 0 turns vector reads off.
    public var vectorReadMessageCount = 32
    /// Bytes set aside per datagram in the receive buffer. Larger than any datagram the peer may
    /// send: NIO slices one buffer into equal slots and never checks MSG_TRUNC, so a smaller slot
    /// truncates datagrams silently.
    public var receiveSlotSize = 2048
    /// Reads per readable event before NIO returns to the event loop (its default is 4).
    public var maxMessagesPerRead = 16
    /// SO_RCVBUF / SO_SNDBUF requests; the kernel caps them at net.core.rmem_max / wmem_max.
    public var receiveBufferSize: Int32 = 4 << 20
    public var sendBufferSize: Int32 = 4 << 20
    /// A fan-out burst must not flip the channel unwritable; the kernel buffer is the real limit.
    public var writeBufferWaterMark = ChannelOptions.Types.WriteBufferWaterMark(low: 1 << 20, high: 4 << 20)
    /// Datagrams written in one pass of the server's output before it yields the event loop (the rest
    /// go at the end of the tick). Not public: only tests make it small, to run the yield with few
    /// connections.
    var datagramsPerDrain = 4096
    /// The local address a client binds its socket to (nil: any). A test or benchmark gives a client
    /// a loopback source of its own (127.x.y.z), so the server sees it as another address.
    public var localHost: String?

    public init() {}

    func bootstrap(on eventLoop: any EventLoop) -> DatagramBootstrap {
        let slots = max(1, vectorReadMessageCount)
        return DatagramBootstrap(group: eventLoop)
            .channelOption(.datagramVectorReadMessageCount, value: vectorReadMessageCount)
            .channelOption(.recvAllocator, value: FixedSizeRecvByteBufferAllocator(capacity: slots * receiveSlotSize))
            .channelOption(.maxMessagesPerRead, value: UInt(maxMessagesPerRead))
            .channelOption(.socketOption(.so_rcvbuf), value: SocketOptionValue(receiveBufferSize))
            .channelOption(.socketOption(.so_sndbuf), value: SocketOptionValue(sendBufferSize))
            .channelOption(.writeBufferWaterMark, value: writeBufferWaterMark)
    }
}

/// One timer for a sans-I/O state machine's `nextDeadline`. It is moved only when the deadline comes
/// earlier: most changes push a deadline later (every packet re-arms the idle timer), and a timer that
/// fires early costs one no-op `handleTimeout`, which is cheaper than cancelling and rescheduling.
public struct LoopTimer {
    public init() {}
    private var scheduled: Scheduled<Void>?
    private var at: UInt64?

    public mutating func arm(_ deadline: WireInstant?, minimum: UInt64 = 0, on eventLoop: any EventLoop, fire: @escaping () -> Void) {
        guard let deadline else { return }
        let target = max(deadline.nanoseconds, minimum)
        if let at, at <= target { return }
        scheduled?.cancel()
        at = target
        scheduled = eventLoop.assumeIsolated().scheduleTask(deadline: .uptimeNanoseconds(target), fire)
    }

    /// Called first thing when the timer fires, so the next `arm` schedules a fresh one.
    public mutating func fired() {
        scheduled = nil
        at = nil
    }

    public mutating func cancel() {
        scheduled?.cancel()
        fired()
    }
}

/// Receives what the socket reads and reports how it ends; the server and the client implement it.
protocol DatagramDriver: AnyObject {
    func attached(_ context: ChannelHandlerContext)
    func read(_ envelope: AddressedEnvelope<ByteBuffer>)
    func readComplete()
    func caught(_ error: any Error)
    func detached(_ context: ChannelHandlerContext)
}

/// The one handler in each UDP pipeline: hands every datagram to its driver, synchronously on the
/// event loop, with no allocation of its own.
final class DatagramHandler: ChannelInboundHandler {
    typealias InboundIn = AddressedEnvelope<ByteBuffer>
    typealias OutboundOut = AddressedEnvelope<ByteBuffer>

    let driver: any DatagramDriver

    init(driver: any DatagramDriver) { self.driver = driver }

    func handlerAdded(context: ChannelHandlerContext) { driver.attached(context) }
    func handlerRemoved(context: ChannelHandlerContext) { driver.detached(context) }
    func channelRead(context: ChannelHandlerContext, data: NIOAny) { driver.read(unwrapInboundIn(data)) }
    func channelReadComplete(context: ChannelHandlerContext) { driver.readComplete() }
    /// Errors NIO survives (EMSGSIZE, EHOSTUNREACH, ECONNREFUSED) arrive here; fatal ones close the
    /// channel, which the driver's supervision handles.
    func errorCaught(context: ChannelHandlerContext, error: any Error) { driver.caught(error) }
}

/// A reusable buffer for decrypting received datagrams in place. NIO's vector reads hand out slices of
/// one shared buffer, so mutating a slice would copy it (ByteBuffer copy-on-write); copying into this
/// buffer instead costs one memcpy and no allocation.
final class ScratchBuffer {
    let bytes: UnsafeMutableRawBufferPointer

    init(size: Int) { bytes = .allocate(byteCount: size, alignment: 16) }
    deinit { bytes.deallocate() }

    /// Copies `buffer`'s readable bytes in and returns them as a mutable view, or nil if they don't fit
    /// (a datagram larger than any this protocol sends).
    func load(_ buffer: ByteBuffer) -> UnsafeMutableRawBufferPointer? {
        guard buffer.readableBytes <= bytes.count else { return nil }
        return buffer.withUnsafeReadableBytes { source in
            let target = UnsafeMutableRawBufferPointer(rebasing: bytes[..<source.count])
            target.copyMemory(from: source)
            return target
        }
    }
}
