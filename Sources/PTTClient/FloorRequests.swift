import ChannelProtocol

/// This member's floor requests as the server sees them, apart from what the user sees
/// (`ChannelSession.Transmit`): the server learns that a request was withdrawn (by letting go, or by
/// a stall) only after the release it sent, so it may still answer it. Each press gets a number, and
/// an answer that is not the current request's is dropped; taken for the next press, a late grant
/// would start a burst that ends at once.
struct FloorRequests {
    /// How this connection's server tells which request an answer is for.
    enum Answers: Equatable {
        /// By order (a server older than `FloorEvent.request`, or none numbered yet on this
        /// connection): it answers every request, granted, queued or denied, in turn, so the next
        /// `owed` answers are to requests withdrawn before theirs came, not to a newer one.
        case inOrder(owed: Int)
        /// By number: it echoed a request number, and names the request in every answer.
        case numbered
    }

    /// Whether requests may wait in squelchd's queue (`ChannelManagerConfiguration.waitsForFloor`).
    var waitsForFloor = true
    /// The newest request's number, one per press, never reused within the session's life.
    private(set) var newest: UInt32 = 0
    private(set) var answers = Answers.inOrder(owed: 0)

    /// A new press: its request's number.
    @discardableResult
    mutating func press() -> UInt32 {
        newest &+= 1
        return newest
    }

    /// The request of the newest press, to send.
    var request: ClientMessage { .floorRequest(request: newest, queue: waitsForFloor) }

    /// Whether `event` answers a request that is no longer wanted (withdrawn since, or whose
    /// connection is gone): nothing is to be done with it. `pressed`: the user's press is still on
    /// (requesting, queued or talking).
    mutating func isStale(_ event: FloorEvent, pressed: Bool) -> Bool {
        guard event.kind == .granted || event.kind == .queued || event.kind == .denied else { return false }
        if let request = event.request {
            answers = .numbered
            return request != newest || !pressed
        }
        guard case .inOrder(let owed) = answers, owed > 0 else { return false }
        answers = .inOrder(owed: owed - 1)
        return true
    }

    /// A request sent on this connection was withdrawn before its answer came.
    mutating func withdrew() {
        if case .inOrder(let owed) = answers { answers = .inOrder(owed: owed + 1) }
    }

    /// The connection is gone: the next one's server owes nothing, and may be another (older) one.
    mutating func connectionEnded() { answers = .inOrder(owed: 0) }
}
