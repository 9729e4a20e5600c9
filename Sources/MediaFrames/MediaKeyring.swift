import ChannelProtocol
import NIOConcurrencyHelpers
import SFrame
import Wire

/// A listener's media keys (docs/protocol.md §16.4.5): the SFrame keys the server handed out for the
/// bursts this member may hear, and the frames that came before their key.
///
/// What it plays, besides frames that open:
/// - each frame once: a replay window per key over the SFrame counter;
/// - under an older key of a burst, only what the talker said before its first frame under a newer
///   one (a member removed mid-burst keeps the old key, and must not put words in the talker's mouth);
/// - nothing under the keys of a burst whose end it opened more than `endedKeyLife` ago.
///
/// Keys and frames travel separately (control stream, datagrams), so a frame can beat its key:
/// such frames wait here, a bounded number and briefly, and are opened once the key comes.
///
/// `@unchecked Sendable`: every read and write of `state` is inside `lock` (the methods below are
/// the only ones that touch it), so its keys' libcrypto contexts and the scratch space are used by
/// one thread at a time.
public final class MediaKeyring: @unchecked Sendable {
    private struct Entry {
        let slot: UInt16
        let burst: UInt16
        let key: SFrameKey
        let bytes: [UInt8]
        var replay = ReplayWindow()
        /// Whether a frame opened under it yet.
        var opened = false
        /// Frames from this sequence on are refused: a newer key of the burst opened there.
        var cutoff: UInt16?
        /// When its burst's end opened.
        var endedAt: UInt64?

        func isSameBurst(_ other: Entry) -> Bool { slot == other.slot && burst == other.burst }
    }

    private struct State {
        var entries: [UInt64: Entry] = [:]
        var order: [UInt64] = []
        var waiting: [(keyID: UInt64, datagram: [UInt8], at: UInt64)] = []
        var refused = 0
    }

    /// Keys kept: a burst has one, plus one per member who left during it; a catch-up replays at
    /// most a few bursts.
    public static let maxKeys = 64
    /// Frames kept waiting for their key, and for how long: a catch-up runs at up to 1,000 frames a
    /// second, right behind the keys it needs.
    public static let maxWaiting = 256
    public static let waitNanoseconds: UInt64 = 2_000_000_000
    /// How long a burst's keys stay after its end opened (its end marker comes three times).
    public static let endedKeyLife: UInt64 = 5_000_000_000

    private let lock = NIOLock()
    private var state = State()
    /// One datagram, opened in place (what the transport hands over is read-only).
    private let scratch = UnsafeMutableRawBufferPointer.allocate(byteCount: AudioHeader.size + AudioHeader.maxPayload, alignment: 8)

    public init() {}
    deinit { scratch.deallocate() }

    private func withLock<T>(_ body: (inout State) -> T) -> T {
        lock.withLock { body(&state) }
    }

    /// Frames refused: not sealed frames, forged or damaged, replayed, or whose key never came.
    public var refused: Int { withLock { $0.refused } }

    /// Takes a key; returns the datagrams that waited for it, to be opened again.
    public func add(_ key: MediaKey) -> [[UInt8]] {
        withLock { state in
            if let known = state.entries[key.keyID], known.bytes == key.key, known.slot == key.slot, known.burst == key.burst { return [] }
            guard let opener = try? SFrameKey(baseKey: key.key, keyID: key.keyID, sealing: false) else { return [] }
            if state.entries[key.keyID] == nil { state.order.append(key.keyID) }
            state.entries[key.keyID] = Entry(slot: key.slot, burst: key.burst, key: opener, bytes: key.key)
            while state.order.count > Self.maxKeys { state.entries[state.order.removeFirst()] = nil }
            var ready: [[UInt8]] = []
            state.waiting.removeAll { frame in
                guard frame.keyID == key.keyID else { return false }
                ready.append(frame.datagram)
                return true
            }
            return ready
        }
    }

    /// Forgets every key (a new session: the server numbers its keys afresh). Frames waiting stay:
    /// the new session's first ones may already be among them.
    public func removeKeys() {
        withLock { state in
            state.entries.removeAll()
            state.order.removeAll()
        }
    }

    /// Opens the media datagram `datagram` (audio header, sealed frame) and calls `body` with its
    /// header and plaintext (the Opus packet), valid only during the call; false if it did not open.
    /// A frame whose key isn't here, or doesn't open with the key here (one from before a new session
    /// reused its ID), waits for a key a while.
    @discardableResult
    public func open(_ datagram: UnsafeRawBufferPointer, now: UInt64, _ body: (AudioHeader, UnsafeRawBufferPointer) -> Void) -> Bool {
        guard let header = AudioHeader(parsing: datagram) else {
            withLock { $0.refused += 1 }
            return false
        }
        let frame = UnsafeRawBufferPointer(rebasing: datagram[AudioHeader.size...])
        return withLock { state in
            guard let (sframe, _) = SFrameHeader.parse(frame) else {
                state.refused += 1
                return false
            }
            guard let entry = state.entries[sframe.keyID], entry.slot == header.slot, entry.burst == header.burst else {
                wait(&state, sframe.keyID, datagram, now: now)
                return false
            }
            // Cheap refusals first: a replay, a frame past the key's cutoff or after its burst's end.
            if !entry.replay.isFresh(sframe.counter) || entry.cutoff.map({ header.sequence >= $0 }) == true
                || entry.endedAt.map({ now &- $0 > Self.endedKeyLife }) == true {
                state.refused += 1
                return false
            }
            // The metadata is the audio header as the talker wrote it: what the relay sets (the
            // slot, the catch-up flag) is checked against the key instead, or needs no protection.
            AudioHeader(flags: header.flags.intersection(.endOfBurst), burst: header.burst, sequence: header.sequence)
                .write(to: scratch)
            let sealed = UnsafeMutableRawBufferPointer(rebasing: scratch[AudioHeader.size ..< datagram.count])
            sealed.copyMemory(from: frame)
            guard let (_, headerSize) = entry.key.open(sealed, metadata: UnsafeRawBufferPointer(rebasing: scratch[..<AudioHeader.size])) else {
                wait(&state, sframe.keyID, datagram, now: now)
                return false
            }
            state.entries[sframe.keyID]!.replay.record(sframe.counter)
            if !entry.opened { firstOpened(&state, sframe.keyID, at: header.sequence) }
            if header.flags.contains(.endOfBurst) { ended(&state, sframe.keyID, now: now) }
            body(header, UnsafeRawBufferPointer(rebasing: sealed[headerSize ..< sealed.count - SFrameKey.tagLength]))
            return true
        }
    }

    /// A key's first frame: the burst's older keys take nothing from this sequence on.
    private func firstOpened(_ state: inout State, _ keyID: UInt64, at sequence: UInt16) {
        guard let entry = state.entries[keyID] else { return }
        state.entries[keyID]!.opened = true
        for (id, other) in state.entries where id < keyID && other.isSameBurst(entry) {
            state.entries[id]!.cutoff = min(other.cutoff ?? sequence, sequence)
        }
    }

    /// The burst ended: its keys go a while later, and keys of bursts ended long ago go now.
    private func ended(_ state: inout State, _ keyID: UInt64, now: UInt64) {
        guard let entry = state.entries[keyID] else { return }
        for (id, other) in state.entries where other.isSameBurst(entry) && other.endedAt == nil { state.entries[id]!.endedAt = now }
        state.order.removeAll { id in
            guard let endedAt = state.entries[id]?.endedAt, now &- endedAt > Self.endedKeyLife else { return false }
            state.entries[id] = nil
            return true
        }
    }

    private func wait(_ state: inout State, _ keyID: UInt64, _ datagram: UnsafeRawBufferPointer, now: UInt64) {
        let before = state.waiting.count
        state.waiting.removeAll { now &- $0.at > Self.waitNanoseconds }
        state.refused += before - state.waiting.count
        if state.waiting.count == Self.maxWaiting {
            state.waiting.removeFirst()
            state.refused += 1
        }
        state.waiting.append((keyID, Array(datagram), now))
    }
}
