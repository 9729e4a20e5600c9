import ChannelProtocol
import ChannelStore
import FloorControl
import Foundation
import Wire

/// The live state of every channel: who is connected, who holds the floor, and where each audio
/// packet goes. A sans-I/O state machine in the manner of `Endpoint`: transport events, control
/// messages, verified tokens, admin edits and time go in; control messages, closes, store writes
/// and pushes come out of `takeOutputs()`, and audio goes out through the `send` closure the caller
/// passes (so the relay hands each sealed datagram straight to the transport, allocating nothing).
///
/// Not Sendable: it lives on the server's event loop, next to the endpoint.
public final class ChannelHub {
    /// The same push token registered again is written to the store at most this often (seconds).
    static let pushTokenRewriteInterval: TimeInterval = 600

    enum Session {
        /// Transport connected; no join yet.
        case connected
        /// A join is being verified.
        case verifying(channel: UUID)
        case joined(ChannelState, slot: UInt16)
        /// The join was refused; the connection closes after a short delay (so the client can read
        /// why) and nothing it sends meanwhile counts.
        case refused
    }

    public let configuration: HubConfiguration
    public internal(set) var counters = HubCounters()
    var channels: [UUID: ChannelState] = [:]
    /// Channels deleted while this hub ran: a join's check that read one just before must not bring
    /// it back (`channelSeenByCheck`). One UUID per deletion.
    var deletedChannels: Set<UUID> = []
    var channelsLoadedByChecks = false
    var sessions: [Link: Session] = [:]
    /// Connections that entered with a pass and whose handshake has not finished (`entered`).
    var handshaking: Set<Link> = []
    /// Connections with no `join` yet, and the sweep that first saw them so (`closeUnjoined`).
    var unjoined: [Link: WireInstant] = [:]
    /// Each connection's allowance of control messages (`HubConfiguration.controlMessagesPerSecond`).
    var controlBudget: [Link: TokenBucket] = [:]
    var outputs: [HubOutput] = []
    /// Bursts whose first audio has just been relayed and whose listeners are owed their wake
    /// (`wakeOwedListeners`).
    var owedWakes: [(channel: ChannelState, slot: UInt16, recording: BurstRecording)] = []
    /// The SFrame key ID the next media key gets. Only this hub's keys are live in its sessions (a
    /// client drops its keys with its connection), so a counter is enough, and keeps headers short.
    var nextMediaKeyID: UInt64 = 1
    let codec = MessageCodec()
    /// One datagram being forwarded: its header is rewritten here and the payload copied once.
    let scratch: UnsafeMutableRawBufferPointer
    /// Members waiting to go from reconnecting to offline, and members being replayed bursts: the
    /// only per-member timers, so `nextDeadline` needn't walk every member.
    var reconnecting: [MemberRef] = []
    var catchingUp = CatchUpSchedule()
    /// When each connected member's token expires, and when it is to be told so.
    var expiries = TokenExpiryQueue()
    /// No later than when the first ended burst kept for members who missed it stops being kept (it
    /// may be earlier, which costs a wake-up that finds nothing due).
    var nextMissedExpiry: WireInstant?
    /// Joiners whose roster is still being sent: the slots it had at the join, in slot order, and how
    /// far the sending got. A big channel's roster leaves a chunk at a time as the connection has room
    /// (`continueRoster`), so a join holds no encoded roster in memory and no single step encodes
    /// megabytes while audio waits on the event loop. Each chunk shows its members as they are when
    /// it is made.
    var rosterStreams: [Link: RosterStream] = [:]
    /// Joins and renewals whose token is being checked, and the revocations they must be checked
    /// against again when they end.
    var tokenChecks = TokenCheckWindow()
    /// Members whose roster entry waits for `HubConfiguration.rosterUpdateInterval`, in the order
    /// they began waiting (`ChannelHub+RosterPacing`).
    var heldAnnouncements: [MemberRef] = []
    /// When the first of them is due.
    var nextHeldAnnouncement: WireInstant?

    struct RosterStream {
        let channel: ChannelState
        let slots: [UInt16]
        var next: Int
        var isFinished: Bool { next == slots.count }
    }

    public init(configuration: HubConfiguration = HubConfiguration()) {
        self.configuration = configuration
        scratch = .allocate(byteCount: AudioHeader.size + AudioHeader.maxPayload, alignment: 8)
    }

    deinit { scratch.deallocate() }

    /// Whether anything waits in `takeOutputs()`: after an audio packet, normally not (a burst's first
    /// packet asks for its wake pushes), so the relay's path checks before it takes.
    public var hasOutputs: Bool { !outputs.isEmpty }

    /// Everything the hub wants done since the last call, in order.
    public func takeOutputs() -> [HubOutput] {
        defer { outputs.removeAll(keepingCapacity: true) }
        return outputs
    }

    // MARK: Time

    public var nextDeadline: WireInstant? {
        var earliest: WireInstant?
        for timer in HubTimer.allCases {
            if let due = deadline(of: timer), earliest.map({ due < $0 }) ?? true { earliest = due }
        }
        return earliest
    }

    /// When `timer` is next due (nil: not armed). The per-channel and per-member timers are read
    /// where they live, so nothing is kept in step with them; none of it allocates.
    func deadline(of timer: HubTimer) -> WireInstant? {
        switch timer {
        case .floor: channels.values.lazy.compactMap { $0.floor.nextDeadline }.min().map(WireInstant.init(nanoseconds:))
        case .missedBursts: nextMissedExpiry
        case .reconnecting: reconnecting.lazy.compactMap { $0.channel.members[$0.slot]?.reconnectingUntil }.min()
        case .tokenExpiry: expiries.next
        case .catchUp: catchingUp.nextTick
        case .roster: nextHeldAnnouncement
        }
    }

    /// Runs whatever is due, in `HubTimer` order: maximum-burst and disconnect revocations, kept
    /// bursts expiring, reconnecting members going offline, sessions whose token expired, and
    /// catch-up packets (through `send`, like `receiveAudio`), and roster entries held back.
    public func handleTimeout(at time: HubTime, send: (UnsafeRawBufferPointer, Link) -> Bool) {
        for timer in HubTimer.allCases {
            guard let due = deadline(of: timer), due <= time.instant else { continue }
            switch timer {
            case .floor: floorTimersDue(at: time)
            case .missedBursts: missedBurstsExpire(at: time)
            case .reconnecting: reconnectingGraceEnds(at: time)
            case .tokenExpiry: expireTokens(at: time)
            case .catchUp: serveCatchUp(at: time, send: send)
            case .roster: sendHeldAnnouncements(at: time)
            }
        }
    }
}
