import ChannelProtocol
import Wire

/// The packets of one talk burst, kept so that a member who joins in the middle hears it from its
/// first word.
///
/// Payloads go into one growing byte arena and an index of fixed-size entries; `start` keeps both
/// capacities, so after the first few bursts recording allocates nothing per packet. At 32 kbps a
/// minute is about 240 KB.
final class BurstRecording {
    struct Entry {
        var offset: Int32
        var length: Int16
        var flags: AudioHeader.Flags
        var sequence: UInt16
    }

    private(set) var talker: UInt16 = 0
    private(set) var burst: UInt16 = 0
    private(set) var bytes: [UInt8] = []
    private(set) var entries: [Entry] = []
    /// The talker finished; no more packets will come.
    private(set) var ended = false
    /// Catch-up cursors still reading this recording: it can't be reused until they finish.
    var readers = 0
    /// Packets not kept because the recording was full (the relay still forwarded them).
    private(set) var overflow = 0
    /// Members who missed some or all of this burst as it went out live (asleep, disconnected, silent)
    /// and are owed a replay if they join before `HubConfiguration.missedBurstWindow` after its end. An
    /// ended recording is kept while this is not empty; a short burst is usually over before a phone
    /// woken by its push has joined, and without this the wake would bring it nothing to hear.
    /// A set: when the server's own network drops, every member is added and later taken off.
    var missed: Set<UInt16> = []
    /// When the talker finished.
    private(set) var endedAt: WireInstant?
    /// Until when it is kept for the members owed it: its end plus the window, or later for a member
    /// whose replay of it was cut off by a dropped connection (it needs time to come back).
    var keepUntil: WireInstant?
    /// The talker's audio rate budget for this burst, taken over from its last burst (see
    /// `Member.audioPace`). It lives here because the relay already finds the burst's recording for
    /// every packet, so policing costs no second lookup.
    var pace = TokenBucket(tokens: 0, refilledAt: WireInstant(nanoseconds: 0))
    /// Set when the floor is taken, and cleared when its first audio packet asks for the burst's wake
    /// pushes: a burst that carries no audio wakes nobody (`ChannelHub.wakeListeners`).
    var wakeOwed: HubTime?
    /// The burst's media keys, oldest first; the talker seals with the newest (`ChannelHub+MediaKeys`).
    var keys: [MediaKey] = []

    /// Whether a frame sealed under `keyID` belongs to this burst.
    func hasKey(_ keyID: UInt64) -> Bool {
        for key in keys where key.keyID == keyID { return true }
        return false
    }

    func start(talker: UInt16, burst: UInt16, pace: TokenBucket) {
        self.talker = talker
        self.burst = burst
        self.pace = pace
        wakeOwed = nil
        bytes.removeAll(keepingCapacity: true)
        entries.removeAll(keepingCapacity: true)
        ended = false
        overflow = 0
        missed.removeAll(keepingCapacity: true)
        endedAt = nil
        keepUntil = nil
        keys.removeAll(keepingCapacity: true)
    }

    func end(at now: WireInstant) {
        ended = true
        wakeOwed = nil
        endedAt = now
    }

    /// Takes `slot` off the members owed a replay; true when it was on.
    func forgetMissed(_ slot: UInt16) -> Bool { missed.remove(slot) != nil }

    /// Keeps the packet unless the recording already holds `maxPackets` packets or adding it would pass
    /// `maxBytes`: a talker sending faster than real time, or full-size packets, must not be able to make
    /// the server hold more than that per burst.
    func append(_ header: AudioHeader, payload: UnsafeRawBufferPointer, maxPackets: Int, maxBytes: Int) {
        // Once one packet is refused, so is every later one: a recording with holes would replay as
        // a burst with words missing, where stopping at the limit only ends the replay early.
        guard overflow == 0, entries.count < maxPackets, bytes.count + payload.count <= maxBytes else {
            overflow += 1
            return
        }
        entries.append(Entry(offset: Int32(bytes.count), length: Int16(payload.count),
                             flags: header.flags.intersection(.endOfBurst), sequence: header.sequence))
        bytes.append(contentsOf: payload)
    }

    var count: Int { entries.count }

    /// Memory held for payloads and the index, used or not.
    var capacityBytes: Int { bytes.capacity + entries.capacity * MemoryLayout<Entry>.stride }

    /// Gives the memory back. A spare that once held a long or oversized burst would otherwise keep that
    /// much for good; the next burst it records grows the arrays again.
    func releaseStorage() {
        bytes = []
        entries = []
    }

    /// Writes packet `index` as a catch-up datagram into `buffer`; returns its length.
    func write(_ index: Int, into buffer: UnsafeMutableRawBufferPointer) -> Int {
        let entry = entries[index]
        AudioHeader(flags: entry.flags.union(.catchUp), slot: talker, burst: burst, sequence: entry.sequence)
            .write(to: buffer)
        let length = Int(entry.length)
        bytes.withUnsafeBytes { source in
            let start = Int(entry.offset)
            UnsafeMutableRawBufferPointer(rebasing: buffer[AudioHeader.size ..< AudioHeader.size + length])
                .copyMemory(from: UnsafeRawBufferPointer(rebasing: source[start ..< start + length]))
        }
        return AudioHeader.size + length
    }
}

/// Where a late joiner is in a recording.
struct CatchUpCursor {
    var recording: BurstRecording
    var next: Int
}
