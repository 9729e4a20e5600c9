// The two byte streams: CRYPTO (handshake messages, one per packet space) and CONTROL (the reliable,
// ordered control stream). Both may arrive out of order and duplicated; both are bounded.

/// Reorders stream fragments into a contiguous byte sequence.
///
/// Bounded against a hostile sender as well as a lossy path: what it holds (bytes, plus a fixed charge
/// per fragment) never exceeds twice `limit` (the slack is for a retransmission cut differently from
/// the original), and each fragment costs O(log n) to store and to deliver, however they are cut,
/// ordered or overlapped. A flood of one-byte fragments in reverse order is the case this guards.
struct ReassemblyBuffer {
    /// Bytes delivered so far (everything before this offset).
    private(set) var delivered: UInt64 = 0
    /// Fragments beyond `delivered`, by offset.
    private var pending: [UInt64: [UInt8]] = [:]
    /// The offsets in `pending`, smallest first.
    private var order = MinHeap<UInt64, Void>()
    private var pendingBytes = 0
    /// Raised once an unadmitted connection is admitted (`Connection.admitted`).
    var limit: Int

    /// What each held fragment is charged beyond its bytes (its array and table entry).
    static let fragmentCharge = 64

    init(limit: Int) { self.limit = limit }

    enum Failure: Error { case overflow }

    /// Bytes plus per-fragment charges held now.
    var heldCost: Int { pendingBytes + pending.count * Self.fragmentCharge }

    /// Accepts a fragment; appends whatever becomes contiguous to `output`.
    mutating func receive(offset: UInt64, data: UnsafeRawBufferPointer, into output: inout [UInt8]) throws(Failure) {
        let (end, overflowed) = offset.addingReportingOverflow(UInt64(data.count))
        guard !overflowed else { throw .overflow }
        guard end > delivered else { return }  // a duplicate
        guard end - delivered <= UInt64(limit) else { throw .overflow }
        if offset <= delivered {
            output.append(contentsOf: data[Int(delivered - offset)...])
            delivered = end
            drain(into: &output)
            return
        }
        let held = pending[offset]?.count
        if let held, held >= data.count { return }  // nothing new at this offset
        guard heldCost + data.count - (held ?? 0) + (held == nil ? Self.fragmentCharge : 0) <= 2 * limit else { throw .overflow }
        pendingBytes += data.count - (held ?? 0)
        pending[offset] = Array(data)
        if held == nil { order.push(offset, ()) }
    }

    private mutating func drain(into output: inout [UInt8]) {
        while let (first, _) = order.peek(), first <= delivered {
            order.pop()
            guard let bytes = pending.removeValue(forKey: first) else { continue }
            pendingBytes -= bytes.count
            let end = first + UInt64(bytes.count)
            if end > delivered {
                output.append(contentsOf: bytes[Int(delivered - first)...])
                delivered = end
            }
        }
    }
}

/// The sending side of the control stream: bytes queued, sent, lost and acknowledged.
struct SendStream {
    /// Offset of `buffer[0]`; everything before is acknowledged and freed.
    private(set) var base: UInt64 = 0
    private var buffer: [UInt8] = []
    /// Offset of the first byte never sent.
    private(set) var nextUnsent: UInt64 = 0
    /// Ranges to send again, in order.
    private var lost: [Range<UInt64>] = []
    /// Acknowledged ranges above `base`, sorted and disjoint.
    private var acked: [Range<UInt64>] = []
    let limit: Int

    init(limit: Int) { self.limit = limit }

    /// Capacity an empty buffer may keep. Small: control messages are rare, and an idle connection's
    /// memory is mostly what it keeps between them (a joiner's `joined` alone is about 600 bytes).
    static let keptCapacity = 256

    var end: UInt64 { base + UInt64(buffer.count) }
    var hasDataToSend: Bool { !lost.isEmpty || nextUnsent < end }
    var unacknowledged: Int { buffer.count }
    /// Bytes the buffer holds on to (its capacity).
    var retainedCapacity: Int { buffer.capacity }

    enum Failure: Error { case full }

    mutating func append(_ bytes: [UInt8]) throws(Failure) {
        guard buffer.count + bytes.count <= limit else { throw .full }
        buffer.append(contentsOf: bytes)
    }

    /// The next range to send, at most `maximum` bytes: retransmissions first.
    mutating func nextChunk(maximum: Int) -> Range<UInt64>? {
        while let first = lost.first {
            let start = max(first.lowerBound, base)
            var range = start..<min(first.upperBound, start + UInt64(maximum))
            // Skip a prefix that has since been acknowledged.
            if let covering = acked.first(where: { $0.contains(range.lowerBound) }) {
                let skipTo = min(covering.upperBound, first.upperBound)
                lost[0] = skipTo..<first.upperBound
                if lost[0].isEmpty { lost.removeFirst() }
                continue
            }
            if let next = acked.first(where: { $0.lowerBound > range.lowerBound && $0.lowerBound < range.upperBound }) {
                range = range.lowerBound..<next.lowerBound
            }
            if range.isEmpty { lost.removeFirst(); continue }
            if range.upperBound >= first.upperBound { lost.removeFirst() } else { lost[0] = range.upperBound..<first.upperBound }
            return range
        }
        guard nextUnsent < end else { return nil }
        let range = nextUnsent..<min(end, nextUnsent + UInt64(maximum))
        nextUnsent = range.upperBound
        return range
    }

    func withBytes<R>(_ range: Range<UInt64>, _ body: (UnsafeRawBufferPointer) -> R) -> R {
        buffer.withUnsafeBytes { all in
            body(UnsafeRawBufferPointer(rebasing: all[Int(range.lowerBound - base)..<Int(range.upperBound - base)]))
        }
    }

    mutating func markLost(_ range: Range<UInt64>) {
        let clipped = max(range.lowerBound, base)..<range.upperBound
        guard !clipped.isEmpty else { return }
        lost.append(clipped)
        lost.sort { $0.lowerBound < $1.lowerBound }
    }

    mutating func markAcknowledged(_ range: Range<UInt64>) {
        guard range.upperBound > base else { return }
        var merged = max(range.lowerBound, base)..<range.upperBound
        var kept: [Range<UInt64>] = []
        for existing in acked {
            if existing.upperBound < merged.lowerBound || existing.lowerBound > merged.upperBound {
                kept.append(existing)
            } else {
                merged = min(existing.lowerBound, merged.lowerBound)..<max(existing.upperBound, merged.upperBound)
            }
        }
        kept.append(merged)
        kept.sort { $0.lowerBound < $1.lowerBound }
        acked = kept
        // Free the acknowledged prefix.
        if let first = acked.first, first.lowerBound <= base {
            let freed = Int(first.upperBound - base)
            if freed == buffer.count, buffer.capacity > Self.keptCapacity {
                // Everything is acknowledged: give back what a burst of control traffic (a joiner's
                // whole roster) grew the buffer to, instead of keeping it for the connection's life.
                buffer = []
            } else {
                buffer.removeFirst(freed)
            }
            base = first.upperBound
            acked.removeFirst()
            lost = lost.compactMap { $0.upperBound <= base ? nil : max($0.lowerBound, base)..<$0.upperBound }
        }
    }
}
