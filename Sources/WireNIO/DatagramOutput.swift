import NIOCore
#if canImport(Glibc)
import Glibc
#endif
import Wire

/// Writes what a sans-I/O core produces to the socket: each datagram is written once (no flush), and
/// one `flush()` per read cycle sends them all with one `sendmmsg`. Event loop only.
///
/// With a `BatchSender` (the server) datagrams are sealed into its arena and sent by it; NIO's write
/// path is the fallback for when the socket's send buffer is full, since NIO then waits for the
/// socket to become writable. Without one (the client, at a handful of datagrams a second) every
/// datagram goes through NIO.
struct DatagramOutput {
    enum Outcome { case nothing, written, refused }

    /// The live socket's handler context; nil while there is no socket (between a failure and the
    /// rebind), when output stays queued in the sans-I/O core.
    private(set) var context: ChannelHandlerContext?
    var addresses = AddressCache()
    /// Bytes offered to the core per datagram: at least its `maxDatagramSize`.
    let slot: Int
    private var batch: BatchSender?
    /// The buffer of the last poll that produced nothing, kept for the next one: the final poll of
    /// every drain comes back empty, and without this it would cost an allocation each time.
    private var spare: ByteBuffer?
    private var needsFlush = false
    private(set) var written = 0
    /// Datagrams the kernel refused outright since the last `takeFailures()`, and the last errno.
    private var failures = 0
    private var lastErrno: CInt = 0
    /// The last datagram handed to NIO because the kernel's buffer was full. NIO completes a
    /// channel's writes in order, so when this one is done all of them are: stop waits for it before
    /// closing the socket, which would otherwise discard them.
    private(set) var lastFallbackWrite: EventLoopFuture<Void>?

    init(slot: Int) { self.slot = slot }

    /// `batch`: the server's own sender on a duplicate of the socket's descriptor; the output closes
    /// it when the socket goes.
    mutating func attach(_ context: ChannelHandlerContext, socketIsIPv6: Bool, batch: BatchSender? = nil) {
        self.context = context
        addresses.socketIsIPv6 = socketIsIPv6
        spare = nil
        needsFlush = false
        self.batch?.close()
        self.batch = batch
    }

    mutating func detach(_ context: ChannelHandlerContext) {
        guard self.context === context else { return }
        self.context = nil
        spare = nil
        needsFlush = false
        socketClosed()
    }

    /// NIO closed the socket: close the duplicate descriptor too, so the port is free for the rebind.
    mutating func socketClosed() {
        batch?.close()
        batch = nil
    }

    /// Lets `produce` write one datagram into a fresh buffer and queues it on the socket (no flush).
    mutating func emit(_ produce: (UnsafeMutableRawBufferPointer) -> Transmit?) -> Outcome {
        guard let context else { return .nothing }
        if let batch { return emit(into: batch, produce) }
        var buffer = spare ?? context.channel.allocator.buffer(capacity: slot)
        spare = nil
        var transmit: Transmit?
        buffer.writeWithUnsafeMutableBytes(minimumWritableBytes: slot) { raw in
            transmit = produce(raw)
            return transmit?.count ?? 0
        }
        guard let transmit else {
            spare = buffer
            return .nothing
        }
        guard let remote = addresses.socketAddress(for: transmit.address) else {
            buffer.clear()
            spare = buffer
            return .refused
        }
        context.write(NIOAny(AddressedEnvelope(remoteAddress: remote, data: buffer)), promise: nil)
        needsFlush = true
        written += 1
        return .written
    }

    private mutating func emit(into batch: BatchSender, _ produce: (UnsafeMutableRawBufferPointer) -> Transmit?) -> Outcome {
        if batch.isFull { send(batch) }
        guard let transmit = produce(batch.nextSlot) else { return .nothing }
        guard let length = addresses.writeSockaddr(for: transmit.address, into: batch.nextAddress) else { return .refused }
        batch.commit(length: transmit.count, path: transmit.address, addressLength: length)
        written += 1
        return .written
    }

    mutating func flush() {
        sendBatch()
        guard needsFlush, let context else { return }
        needsFlush = false
        context.flush()
    }

    /// Hands what the batch holds to the kernel now, ahead of the cycle's flush (what NIO holds for a
    /// full send buffer still waits for it).
    mutating func sendBatch() {
        if let batch, batch.count > 0 { send(batch) }
    }

    private mutating func send(_ batch: BatchSender) {
        let outcome = batch.send()
        failures += outcome.failures
        if outcome.failures > 0 { lastErrno = outcome.lastErrno }
        if let blocked = outcome.blockedFrom, let context {
            // The kernel's buffer is full: NIO keeps the rest and sends it when the socket drains,
            // up to the channel's high watermark. Past it, what doesn't fit is dropped and counted
            // (ENOBUFS): NIO's queue has no limit of its own, and under sustained overload it would
            // grow every cycle while listeners got audio seconds late. The core counted the
            // datagrams as sent, so for audio this is loss, and control data is sent again.
            for index in blocked..<batch.count {
                guard context.channel.isWritable else {
                    failures += batch.count - index
                    lastErrno = ENOBUFS
                    break
                }
                let (bytes, path) = batch.datagram(index)
                guard let remote = addresses.socketAddress(for: path) else { continue }
                var buffer = context.channel.allocator.buffer(capacity: bytes.count)
                buffer.writeBytes(bytes)
                let promise = index == batch.count - 1 ? context.eventLoop.makePromise(of: Void.self) : nil
                context.write(NIOAny(AddressedEnvelope(remoteAddress: remote, data: buffer)), promise: promise)
                if let promise { lastFallbackWrite = promise.futureResult }
                needsFlush = true
            }
        }
        batch.reset()
    }

    /// Datagrams the kernel refused since the last call, with the last errno (the server counts them
    /// as socket errors).
    mutating func takeFailures() -> (count: Int, errno: CInt) {
        defer { failures = 0 }
        return (failures, lastErrno)
    }
}
