// The media envelope (docs/protocol.md §3.6). Like PacketHeader.swift, this file needs only
// WireBytes.swift and Frames.swift, so the packet fuzz target compiles it alone.

/// How the server relays a talker's sealed media frame to each listener: the frame as the talker
/// sealed it (end to end, SFrame), behind the listener's connection ID, in a datagram that is not a
/// protected packet at all. The server seals nothing per listener; the listener authenticates the
/// frame with the burst's key, which only members get (docs/protocol.md §16.4).
///
/// ```
/// 0        0x2A: the long-header and fixed bits clear, which no packet of this protocol has
/// 1..8     the listener's connection ID (as in a short header)
/// 9..      the media datagram: audio header and sealed frame
/// ```
public enum MediaEnvelope {
    public static let marker: UInt8 = 0x2A
    public static let headerSize = 1 + ConnectionID.length

    /// Whether a datagram's first byte says it is an envelope rather than a packet.
    public static func isEnvelope(_ first: UInt8) -> Bool { first == marker }

    /// The connection ID and the media datagram inside an envelope; nil if it is not one, or holds
    /// nothing.
    public static func parse(_ datagram: UnsafeRawBufferPointer) -> (destination: ConnectionID, media: Range<Int>)? {
        var reader = WireReader(datagram)
        guard let first = try? reader.u8("envelope marker"), isEnvelope(first),
              let id = try? reader.uint(8, "destination connection ID"), reader.offset < datagram.count else { return nil }
        return (ConnectionID(id), reader.offset ..< datagram.count)
    }

    /// Writes an envelope of `media` for `destination` into `buffer`; its length, or nil if it doesn't fit.
    public static func write(_ media: UnsafeRawBufferPointer, to destination: ConnectionID,
                             into buffer: UnsafeMutableRawBufferPointer) -> Int? {
        let length = headerSize + media.count
        guard !media.isEmpty, length <= buffer.count else { return nil }
        buffer[0] = marker
        for i in 0..<ConnectionID.length {
            buffer[1 + i] = UInt8(truncatingIfNeeded: destination.value >> UInt64(56 - 8 * i))
        }
        UnsafeMutableRawBufferPointer(rebasing: buffer[headerSize ..< length]).copyMemory(from: media)
        return length
    }
}
