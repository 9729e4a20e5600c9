import ChannelProtocol
import SFrame

/// A talker's side of docs/protocol.md §16.4.5: seals each media frame once, with the newest key the
/// server gave for the burst, for every member at once.
///
/// The SFrame counter runs over the sealer's whole life, never restarting with a new key or burst,
/// so no key ever sees a nonce twice. Not Sendable: one capture thread uses it.
public final class MediaSealer {
    private var key: SFrameKey?
    /// The next frame's SFrame counter.
    public private(set) var counter: UInt64

    /// `counter`: where the counter starts, for a talker that keeps it across sealers.
    public init(counter: UInt64 = 0) { self.counter = counter }

    /// Writes `header` (as the talker sends it: slot 0, no catch-up flag) and `payload` sealed under
    /// `mediaKey` into `buffer`; the datagram's length, or nil if it doesn't fit or the key is unusable.
    public func seal(_ header: AudioHeader, payload: UnsafeRawBufferPointer, key mediaKey: MediaKey,
                     into buffer: UnsafeMutableRawBufferPointer) -> Int? {
        if key?.keyID != mediaKey.keyID {
            guard let fresh = try? SFrameKey(baseKey: mediaKey.key, keyID: mediaKey.keyID, sealing: true) else { return nil }
            key = fresh
        }
        guard let key else { return nil }
        let headerSize = SFrameHeader(keyID: key.keyID, counter: counter).size
        let length = AudioHeader.size + headerSize + payload.count + SFrameKey.tagLength
        guard length - AudioHeader.size <= AudioHeader.maxPayload, length <= buffer.count else { return nil }
        header.write(to: buffer)
        UnsafeMutableRawBufferPointer(rebasing: buffer[(AudioHeader.size + headerSize)...]).copyMemory(from: payload)
        let frame = UnsafeMutableRawBufferPointer(rebasing: buffer[AudioHeader.size ..< length])
        guard key.seal(frame, counter: counter, metadata: UnsafeRawBufferPointer(rebasing: buffer[..<AudioHeader.size])) else { return nil }
        counter += 1
        return length
    }

    /// The largest Opus packet that fits a sealed frame with room for any header.
    public static let maxOpusPayload = AudioHeader.maxPayload - SFrameHeader.maxSize - SFrameKey.tagLength
}
