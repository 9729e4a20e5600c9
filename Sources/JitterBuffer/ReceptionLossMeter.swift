/// What share of the talkers' frames a listener misses on arrival, measured over windows of heard
/// audio: the figure a listener reports (`receptionReport`) so that talkers add FEC when it is needed.
///
/// A plain value fed with the jitter buffers' running burst statistics; it reads no clock. Loss is
/// counted before FEC and concealment (`BurstStatistics.lost` over frames due), because that is what
/// the redundancy has to cover. A window is a number of frames due, not a time, so a listener that
/// hears little reports seldom and one that hears nothing never.
public struct ReceptionLossMeter: Sendable {
    /// Frames due per window: 150 (3 s of 20 ms frames) keeps one unlucky second from switching a
    /// talker's FEC off and on, and still follows a link that turns bad within a sentence or two.
    public let windowFrames: Int
    /// The first window is shorter (50 frames, 1 s): a listener that joins on a bad link gets the
    /// talker to protect the rest of the first sentence, not only the next one.
    public let firstWindowFrames: Int
    private var windows = 0
    private var due = 0
    private var lost = 0
    /// Per track: the burst last seen, and its counts then.
    private var seen: [Seen?]

    private struct Seen {
        var slot: UInt16
        var burst: UInt16
        var played: Int
        var lost: Int
    }

    public init(tracks: Int, windowFrames: Int = 150, firstWindowFrames: Int = 50) {
        precondition(tracks > 0 && windowFrames > 0 && firstWindowFrames > 0)
        self.windowFrames = windowFrames
        self.firstWindowFrames = firstWindowFrames
        seen = Array(repeating: nil, count: tracks)
    }

    /// Track `track`'s statistics now (nil: it plays nothing). `ended`: these are the burst's final
    /// statistics. Returns the loss in percent when this completes a window.
    public mutating func observe(track: Int, _ statistics: BurstStatistics?, ended: Bool = false) -> Int? {
        guard seen.indices.contains(track) else { return nil }
        // A burst replayed to a late joiner measures the replay (its backlog limit, a gap skipped
        // at once), not the link: it is left out, live part included.
        guard let statistics, statistics.catchUpFrames == 0 else {
            seen[track] = nil
            return nil
        }
        var played = statistics.played, lost = statistics.lost
        if let last = seen[track], last.slot == statistics.slot, last.burst == statistics.burst {
            played -= last.played
            lost -= last.lost
        }
        seen[track] = ended ? nil : Seen(slot: statistics.slot, burst: statistics.burst, played: statistics.played, lost: statistics.lost)
        // Counts only grow within a burst; anything else is a burst this meter never saw start.
        guard played >= 0, lost >= 0 else { return nil }
        due += played + lost
        self.lost += lost
        guard due >= (windows == 0 ? firstWindowFrames : windowFrames) else { return nil }
        let percent = (100 * self.lost + due / 2) / due
        windows += 1
        due = 0
        self.lost = 0
        return min(percent, 100)
    }
}
