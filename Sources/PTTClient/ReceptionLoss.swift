/// The two loss figures of a session: this member's own reception, reported to the server so that
/// talkers can add FEC, and the worst among its listeners', which the server tells it to adapt its
/// encoder. Kept together because both start at 0 with every session, on this side as on the
/// server's, and because whether reports go out at all is the server's to say (`joined`'s
/// `features`), not something learned from an error.
struct ReceptionLoss {
    /// Whether this session's server takes `receptionReport`, and what it was last told.
    enum Reports: Equatable {
        /// No session yet, or a server that did not announce the message (one older than it): it
        /// gets none, which it could only answer with an error.
        case off
        /// The figure last reported in this session; the server starts it at 0.
        case on(last: Int)
    }

    /// The receiver's latest figure, kept across reconnects: a link bad enough to drop the
    /// connection is still bad after it, so the new session is told at once rather than after the
    /// next window of audio.
    private(set) var latest = 0
    private(set) var reports = Reports.off
    /// The worst loss among this member's listeners, as the server last said in this session.
    private(set) var listenerLoss = 0

    /// A session began with a server that takes reports or not. Returns the figure to report at
    /// once: the latest, if it matters.
    mutating func sessionBegan(serverTakesReports: Bool) -> Int? {
        reports = serverTakesReports ? .on(last: 0) : .off
        return latest >= 2 ? measured(latest, joined: true) : nil
    }

    /// The receiver finished a window of heard audio, `percent` of it missing on arrival. Returns
    /// the figure to report: while joined, when it moved by 2 points or more (or came back to 0), so
    /// a steady link costs no messages and a noisy one at most one per window.
    mutating func measured(_ percent: Int, joined: Bool) -> Int? {
        latest = percent
        guard joined, case .on(let last) = reports, percent != last, abs(percent - last) >= 2 || percent == 0 else { return nil }
        reports = .on(last: percent)
        return percent
    }

    /// The server said `percent` of this member's listeners (0 when a session begins or the channel is
    /// left); true if that changed the figure.
    mutating func listenerLossSaid(_ percent: Int) -> Bool {
        guard percent != listenerLoss else { return false }
        listenerLoss = percent
        return true
    }
}
