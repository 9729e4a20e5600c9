import NIOCore
import Wire

/// The sending half shared by the server and the client: seals straight into a NIO buffer, writes
/// without flushing, and flushes once per batch so that NIO sends the batch with one `sendmmsg`.
struct DatagramOutput {
    enum Outcome { case nothing, written, refused }

    /// The live socket's handler context; nil while there is no socket (between a failure and the
    /// rebind), when output stays queued in the sans-I/O core.
    private(set) var context: ChannelHandlerContext?
    var addresses = AddressCache()
    /// Bytes offered to the core per datagram: at least its `maxDatagramSize`.
    let slot: Int
    /// The buffer of the last poll that produced nothing, kept for the next one: the final poll of
    /// every drain comes back empty, and without this it would cost an allocation each time.
    private var spare: ByteBuffer?
    private var needsFlush = false
    private(set) var written = 0

    init(slot: Int) { self.slot = slot }

    mutating func attach(_ context: ChannelHandlerContext, socketIsIPv6: Bool) {
        self.context = context
        addresses.socketIsIPv6 = socketIsIPv6
        spare = nil
        needsFlush = false
    }

    mutating func detach(_ context: ChannelHandlerContext) {
        guard self.context === context else { return }
        self.context = nil
        spare = nil
        needsFlush = false
    }

    /// Lets `produce` write one datagram into a fresh buffer and queues it on the socket (no flush).
    mutating func emit(_ produce: (UnsafeMutableRawBufferPointer) -> Transmit?) -> Outcome {
        guard let context else { return .nothing }
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

    mutating func flush() {
        guard needsFlush, let context else { return }
        needsFlush = false
        context.flush()
    }
}
