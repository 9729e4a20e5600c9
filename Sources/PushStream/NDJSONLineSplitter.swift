// No imports: `make fuzz-build` compiles this file into the device-push-stream target.

/// Cuts a byte stream into lines at `\n`, keeping a partial line until the rest of it arrives (HTTP
/// chunks and TCP reads don't respect line ends).
public struct NDJSONLineSplitter {
    public init() {}

    private var pending: [UInt8] = []
    /// Bytes of the line not yet complete.
    public var pendingCount: Int { pending.count }

    /// The lines completed by `bytes`, without their `\n` (and without a `\r` before it).
    public mutating func append(_ bytes: some Collection<UInt8>) -> [[UInt8]] {
        var lines: [[UInt8]] = []
        for byte in bytes {
            if byte == UInt8(ascii: "\n") {
                if pending.last == UInt8(ascii: "\r") { pending.removeLast() }
                lines.append(pending)
                pending.removeAll(keepingCapacity: true)
            } else {
                pending.append(byte)
            }
        }
        return lines
    }
}
