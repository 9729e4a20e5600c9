/// Rejects packets already received, or too old to tell (RFC 6479's sliding bitmap, as WireGuard uses).
/// The window is 4,032 packets: a packet that arrives more than that many numbers late is dropped,
/// which costs nothing for audio (it is long past its playout time) and the control stream retransmits.
///
/// It runs after the AEAD has authenticated the packet, so only the legitimate peer can move it.
public struct ReplayWindow: Sendable {
    private static let words = 64
    public static let size = UInt64((words - 1) * 64)
    private var bitmap: [UInt64]
    public private(set) var largest: UInt64?

    public init() { bitmap = Array(repeating: 0, count: Self.words) }

    /// Whether `pn` is new and inside the window. Doesn't record it.
    public func isFresh(_ pn: UInt64) -> Bool {
        guard let largest else { return true }
        if pn > largest { return true }
        if largest - pn >= Self.size { return false }
        let index = Int((pn / 64) % UInt64(Self.words))
        return bitmap[index] & (1 << (pn % 64)) == 0
    }

    /// Records `pn` (which must be fresh).
    public mutating func record(_ pn: UInt64) {
        if let largest, pn > largest {
            // Clear the words that slide into the window.
            let currentWord = largest / 64, newWord = pn / 64
            let clear = min(newWord - currentWord, UInt64(Self.words))
            var i: UInt64 = 1
            while i <= clear {
                bitmap[Int((currentWord + i) % UInt64(Self.words))] = 0
                i += 1
            }
            self.largest = pn
        } else if largest == nil {
            self.largest = pn
        }
        bitmap[Int((pn / 64) % UInt64(Self.words))] |= 1 << (pn % 64)
    }
}
