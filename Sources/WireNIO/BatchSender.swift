import CUDPBatch
import NIOCore
import Wire

#if canImport(Glibc)
import Glibc
#endif

/// The server's send path. Datagrams are sealed straight into a preallocated arena and leave in
/// `sendmmsg` batches, so sending a fan-out copy allocates nothing. NIO's own write path costs a
/// `ByteBuffer`, an `AddressedEnvelope` and a pending-write record per datagram; at 200 listeners
/// that was most of the relay's user-space time (docs/benchmarks.md).
///
/// It writes to its own duplicate of the socket's descriptor. NIO closes its descriptor when the
/// socket fails; with a shared number, a send between that close and our detach could reach whatever
/// file reused the number. The duplicate stays valid until `close()`, which the owner calls as soon
/// as NIO reports the channel closed (the port is free again only then).
///
/// Event loop only, like everything in the adapters.
final class BatchSender {
    /// Datagrams per batch; a full batch is sent at once, mid-cycle.
    static let capacity = Int(CUDP_BATCH_CHUNK)
    /// Room per destination: a `sockaddr_in6` (28 bytes), rounded up for alignment.
    static let addressRoom = 32

    let slot: Int
    private let arena: UnsafeMutableRawPointer
    private let addressArena: UnsafeMutableRawPointer
    private let messages: UnsafeMutablePointer<cudp_message>
    private let paths: UnsafeMutablePointer<PathAddress>
    private(set) var count = 0
    private var descriptor: CInt

    /// Takes ownership of `descriptor`.
    init(descriptor: CInt, slot: Int) {
        self.descriptor = descriptor
        self.slot = slot
        arena = .allocate(byteCount: Self.capacity * slot, alignment: 16)
        addressArena = .allocate(byteCount: Self.capacity * Self.addressRoom, alignment: 16)
        messages = .allocate(capacity: Self.capacity)
        paths = .allocate(capacity: Self.capacity)
        paths.initialize(repeating: PathAddress(ipv4: 0, port: 0), count: Self.capacity)
    }

    deinit {
        close()
        arena.deallocate()
        addressArena.deallocate()
        messages.deallocate()
        paths.deinitialize(count: Self.capacity)
        paths.deallocate()
    }

    var isOpen: Bool { descriptor >= 0 }
    var isFull: Bool { count == Self.capacity }

    /// Where the next datagram is to be written.
    var nextSlot: UnsafeMutableRawBufferPointer { UnsafeMutableRawBufferPointer(start: arena + count * slot, count: slot) }
    /// Where the next datagram's `sockaddr` is to be written (`addressRoom` bytes, 16-aligned).
    var nextAddress: UnsafeMutableRawPointer { addressArena + count * Self.addressRoom }

    /// Adds the datagram written into `nextSlot`, for `path`, whose `sockaddr` is in `nextAddress`.
    func commit(length: Int, path: PathAddress, addressLength: Int) {
        precondition(count < Self.capacity && length <= slot && addressLength <= Self.addressRoom)
        messages[count] = cudp_message(bytes: arena + count * slot, length: length,
                                       address: addressArena + count * Self.addressRoom, address_length: UInt32(addressLength))
        paths[count] = path
        count += 1
    }

    /// The datagram at `index` of the current batch.
    func datagram(_ index: Int) -> (bytes: UnsafeRawBufferPointer, path: PathAddress) {
        (UnsafeRawBufferPointer(start: messages[index].bytes, count: messages[index].length), paths[index])
    }

    struct Outcome {
        /// The kernel refused these datagrams outright (an unreachable destination, a firewall): each
        /// is lost like a dropped packet, and the others still go.
        var failures = 0
        var lastErrno: CInt = 0
        /// The socket's send buffer is full from this index on: the caller hands the rest to NIO,
        /// which waits for the socket to become writable. Nil when everything was sent.
        var blockedFrom: Int?
    }

    /// Sends the batch. The caller must `reset()` after handling a `blockedFrom`.
    func send() -> Outcome {
        var outcome = Outcome()
        var index = 0
        while index < count {
            guard descriptor >= 0 else { outcome.blockedFrom = index; break }
            let result = cudp_send_batch(descriptor, messages + index, UInt32(count - index))
            if result > 0 {
                index += Int(result)
                continue
            }
            let error = -result
            if error == EAGAIN || error == EWOULDBLOCK || error == ENOBUFS {
                outcome.blockedFrom = index
                break
            }
            outcome.failures += 1
            outcome.lastErrno = error
            index += 1
        }
        return outcome
    }

    func reset() { count = 0 }

    func close() {
        guard descriptor >= 0 else { return }
        _ = Glibc.close(descriptor)
        descriptor = -1
        count = 0
    }
}

/// A non-blocking UDP socket bound to `host:port`, for `DatagramBootstrap.withBoundSocket`: made
/// here, rather than by NIO's `bind`, so that the server can keep a duplicate of its descriptor for
/// `BatchSender`. Public for `squelch-bench`, whose kernel-floor measurement sends from a socket
/// set up exactly as the server's. The caller owns the descriptor.
public func boundUDPSocket(host: String, port: Int) throws -> CInt {
    let address = try SocketAddress.makeAddressResolvingHost(host, port: port)
    let family: CInt = address.protocol == .inet6 ? AF_INET6 : AF_INET
    let descriptor = socket(family, CInt(SOCK_DGRAM.rawValue) | CInt(SOCK_CLOEXEC.rawValue) | CInt(SOCK_NONBLOCK.rawValue),
                            CInt(IPPROTO_UDP))
    guard descriptor >= 0 else { throw IOError(errnoCode: errno, reason: "socket") }
    if family == AF_INET {
        // Don't fragment, as QUIC requires (every path carries our 1,200-byte datagrams), and ignore
        // the kernel's path-MTU guess (PROBE). With DF set the kernel also skips the shared IP-ID
        // generator it otherwise runs for every datagram of an unconnected socket: 6 % of the
        // kernel's instructions in the 200-listener fan-out.
        var probe = CInt(IP_PMTUDISC_PROBE)
        _ = setsockopt(descriptor, CInt(IPPROTO_IP), IP_MTU_DISCOVER, &probe, socklen_t(MemoryLayout<CInt>.size))
    }
    let bound = address.withSockAddr { bind(descriptor, $0, socklen_t($1)) }
    guard bound == 0 else {
        let error = errno
        _ = Glibc.close(descriptor)
        throw IOError(errnoCode: error, reason: "bind \(host):\(port)")
    }
    return descriptor
}
