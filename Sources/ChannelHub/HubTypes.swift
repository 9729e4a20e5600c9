import ChannelProtocol
import ChannelStore
import Foundation
import Wire

/// A member's transport connection, as the endpoint names it.
public typealias Link = Endpoint.Handle

/// The hub's two clocks: monotonic time for timers, and the wall clock for what is stored (last
/// seen, the transmission log). The hub reads neither; callers pass both.
public struct HubTime: Sendable {
    public var instant: WireInstant
    public var date: Date
    public init(instant: WireInstant, date: Date) {
        self.instant = instant
        self.date = date
    }
}

/// Tunables of the live channel state.
public struct HubConfiguration: Sendable {
    /// Simultaneous talkers on a full-duplex channel.
    public var fullDuplexMaxTalkers = 4
    /// A connection that has not sent `join` this long after the liveness sweep first saw it is
    /// refused (`notJoined`) and closed (0: never). Clients join right after the handshake.
    public var joinDeadline: UInt64 = 10_000_000_000
    /// How long a dropped member keeps its place (a talker keeps the floor) before it counts as gone.
    public var disconnectGrace: UInt64 = 2_000_000_000
    /// A member whose connection the liveness sweep found silent shows `reconnecting`; still silent
    /// this much later, it shows `offline` (0: never, until the transport's idle timeout closes the
    /// connection, minutes later). A radio that died or lost its network for good is then not shown
    /// as about to come back. Its session stays open, so a phone back from a long tunnel resumes it
    /// and shows `connected` again. 30 s outlasts a cellular handover or a short tunnel.
    public var silentOffline: UInt64 = 30_000_000_000
    /// A talker whose burst brings no audio for this long loses the floor (`FloorArbiter`'s
    /// `silenceLimit`; 0: never): its phone died or lost its network, and nothing else would free the
    /// floor before the maximum burst length. Five seconds rides out a cellular handover or a short
    /// tunnel; 250 lost packets in a row are no conversation anyway.
    public var talkerSilenceLimit: UInt64 = 5_000_000_000
    /// The same before a burst's first audio, when shorter (`FloorArbiter`'s `firstAudioLimit`; 0:
    /// `talkerSilenceLimit`). A client sends from its grant on; one granted from the queue after it
    /// died (kill -9, a flat battery) held everyone waiting behind it for the whole 5 s.
    public var talkerFirstAudioLimit: UInt64 = 2_500_000_000
    /// How often a burst going on has its length so far written to the transmission log: a server
    /// killed during it leaves the burst `interrupted` with its length to within this (and the
    /// driver's one-second tick), not 0. Once a second costs little: every burst's progress of a
    /// tick goes to the database in one commit (`StoreWriter`), and a write still waiting is replaced
    /// by the next. (It was the first second, then every 5 s: a 4.5 s burst cut by `kill -9` was
    /// logged as 1.9 s.)
    public var burstProgressInterval: UInt64 = 1_000_000_000
    /// Floor requests that may wait in a channel's queue.
    public var maxQueue = 16
    /// Catch-up packets sent to a late joiner at once, before pacing starts.
    public var catchUpInitialPackets = 25
    /// Then this many per `catchUpInterval` (10 per 10 ms is 1,000 packets a second, 20× real time
    /// at 20 ms frames), so that a long burst doesn't overflow the joiner's socket buffer.
    public var catchUpPacketsPerTick = 10
    public var catchUpInterval: UInt64 = 10_000_000
    /// How long after a burst ends a member who missed it (asleep, disconnected or silent when it
    /// started, or dropped during it) is still replayed it on joining: time for a push to wake the
    /// phone and the app to connect. 0 turns it off (only a burst still going is replayed).
    public var missedBurstWindow: UInt64 = 30_000_000_000
    /// Ended bursts a channel keeps at most for members who missed them; past it, the oldest go.
    public var maxMissedBursts = 8
    /// Packets kept per burst for catch-up: a 600 s burst at 50 packets/s.
    public var maxRecordedPackets = 30_000
    /// Payload bytes kept per burst: 600 s at about 110 kbps. Without it, 30,000 full-size packets
    /// would be about 33 MB.
    public var maxRecordedBytes = 8 << 20
    /// A spare recording holding more memory than this gives it back when it is recycled (1 MiB holds
    /// about four minutes at 32 kbps, longer than most bursts), so one long burst doesn't pin its
    /// memory to the channel for good.
    public var spareRecordingCapacity = 1 << 20
    /// Control messages a connection may send per second, on average, and in a burst. A client sends
    /// a handful per talk burst; a loop of floor requests or push-token registrations would otherwise
    /// make the server send a notice to every member and a push to every sleeping one, or a database
    /// write, for each.
    public var controlMessagesPerSecond = 20
    public var controlMessageBurst = 40
    /// Audio packets a talker may send per second, on average, and in a burst; more are dropped
    /// (`over_rate`) before they are recorded or relayed. Every packet is sent to every listener, so
    /// without this one talker sending as fast as it can multiplies its rate by the channel's size on
    /// the server's CPU and every listener's downlink. The shortest Opus frame a sender may use is
    /// 10 ms, 100 packets a second; 150 leaves room for clock drift, and a burst of 150 for a second
    /// and a half of packets held up by the network and then delivered at once.
    public var audioPacketsPerSecond = 150
    public var audioPacketBurst = 150
    /// How long before its participant token expires a connected member is told so (`tokenExpiring`),
    /// so that its app can fetch a new token and `renewToken` without the session ending: five minutes
    /// is room for an app to ask its backend a few times over a poor network. A token with less than
    /// this left at the join is announced at once.
    public var tokenRenewalNotice: UInt64 = 300_000_000_000
    /// How long after its participant token expired an offline member is still woken by push when a
    /// burst starts. Within it, the woken app can fetch a new token from its backend and renew
    /// (docs/architecture.md, "A token left to expire"); past it, a device nobody renews for is
    /// left alone instead of being woken, with the speaker's name, by every burst for good. The
    /// membership and push token stay, so a join with a new token wakes it again.
    public var wakeAfterTokenExpiry: TimeInterval = 7 * 86_400
    /// Whether the server sends wake pushes at all (false with `--apns off`). Without them an asleep
    /// member is not woken by a burst, so the hub neither asks for its push nor keeps the burst for
    /// it to be replayed: it will be back no sooner than any other offline member.
    public var wakesByPush = true
    /// Where each channel's burst numbers start (the low 16 bits are what audio headers carry). A
    /// listener remembers the last bursts it finished so that their repeated end markers can't start
    /// them again; after a restart, a talker that gets its old slot and numbering from 1 again would
    /// have its first bursts taken for those and not played. squelchd therefore starts each channel
    /// at a random number (`randomFirstBurst`); the hub itself draws nothing (tests start at 1).
    public var firstBurst: @Sendable (UUID) -> UInt64 = { _ in 1 }

    /// A uniformly random start in 1...65535, for `firstBurst`: the chance that a restarted
    /// channel's next burst repeats one of the 8 a listener remembers is 8 in 65535.
    public static let randomFirstBurst: @Sendable (UUID) -> UInt64 = { _ in UInt64.random(in: 1...0xFFFF) }

    public init() {}
}

/// Effects the hub asks its driver to carry out, in order.
public enum HubOutput: Sendable, Equatable {
    /// Encode `message` once and send it on each link's control stream.
    case send(ServerMessage, to: [Link])
    /// Close the link with an application close code.
    case close(Link, code: CloseCode, reason: String)
    /// Check a join token (asynchronously), then call `admit` or `refuse`.
    case verify(Link, token: String, channel: UUID, reason: JoinReason)
    /// Check a `renewToken` token for `channel` the same way, then call `renew` or `renewalRefused`.
    case verifyRenewal(Link, token: String, channel: UUID)
    /// Write to the store (asynchronously, in order; the relay never waits for it).
    case store(StoreOperation)
    /// A talk burst started. Members in `wake` have a push token and no connection; those in `connected`
    /// have both, and the driver wakes the ones whose connection has gone silent (the hub sees no
    /// transport keepalives, the driver does).
    case burstStarted(channel: UUID, talker: Participant, wake: [MemberRecord], connected: [WakeCandidate])
    /// An administrator removed the member or deleted the channel: its device should be told to leave by push.
    case memberGone(channel: UUID, member: MemberRecord)
}

/// A member with a push token and a live-looking connection, at a burst's start.
public struct WakeCandidate: Sendable, Equatable {
    public var member: MemberRecord
    public var link: Link

    public init(member: MemberRecord, link: Link) {
        self.member = member
        self.link = link
    }
}

/// Why the relay dropped an incoming audio datagram.
public enum DropReason: Int, CaseIterable, Sendable {
    /// Not an audio datagram of this protocol.
    case malformed
    /// The connection has not joined a channel.
    case notJoined
    /// The sender doesn't hold the floor.
    case notFloorHolder
    /// The sender holds the floor, but the packet belongs to an earlier burst.
    case staleBurst
    /// The transport couldn't send to a listener right now (the listener's connection is closing).
    case sendFailed
    /// The talker sent faster than any Opus sender may (`audioPacketsPerSecond`).
    case overRate

    public var label: String {
        switch self {
        case .malformed: return "malformed"
        case .notJoined: return "not_joined"
        case .notFloorHolder: return "not_floor_holder"
        case .staleBurst: return "stale_burst"
        case .sendFailed: return "send_failed"
        case .overRate: return "over_rate"
        }
    }
}

/// Plain counters the hub bumps on its event loop; the driver publishes them as metrics.
public struct HubCounters: Sendable, Equatable {
    public var packetsIn = 0
    public var bytesIn = 0
    public var packetsOut = 0
    public var bytesOut = 0
    public var catchUpPacketsOut = 0
    public var catchUpBytesOut = 0
    /// Indexed by `DropReason.rawValue`.
    public var drops = [Int](repeating: 0, count: DropReason.allCases.count)
    public var bursts = 0
    public var floorGrants = 0
    public var floorDenials = 0
    public var floorRevocations = 0
    public var joins = 0
    public var refusals = 0
    public var controlErrors = 0
    /// Control messages dropped because their connection sent more than its rate allows.
    public var controlRateLimited = 0
    /// Sessions ended because their participant token expired while connected.
    public var tokenExpiries = 0
    /// `renewToken` requests that gave a session a new token, and those refused.
    public var tokenRenewals = 0
    public var tokenRenewalsRefused = 0
    /// `receptionReport`s that changed a listener's loss figure.
    public var receptionReports = 0
    /// Connected members the liveness sweep marked `reconnecting` because their connection went silent.
    public var silentMembers = 0
    /// Bursts that had ended replayed to a member who missed them (one per member and burst).
    public var missedBurstReplays = 0

    public init() {}

    public func drops(_ reason: DropReason) -> Int { drops[reason.rawValue] }
}

/// A token bucket on the hub's clock: a connection's control messages, a talker's audio packets.
struct TokenBucket {
    var tokens: Double
    var refilledAt: WireInstant
    /// When the connection was last told it is over its rate.
    var noticedAt: WireInstant?

    /// Takes one token; false when there is none left.
    mutating func take(at now: WireInstant, perSecond: Int, burst: Int) -> Bool {
        let elapsed = Double(now.since(refilledAt)) / 1e9
        tokens = min(Double(burst), tokens + elapsed * Double(perSecond))
        refilledAt = now
        guard tokens >= 1 else { return false }
        tokens -= 1
        return true
    }

    /// True at most once a second.
    mutating func noticeDue(at now: WireInstant) -> Bool {
        if let noticedAt, now.since(noticedAt) < 1_000_000_000 { return false }
        noticedAt = now
        return true
    }
}

/// A member as an operator sees it (`GET /v1/channels/:id/roster`): its roster entry, flattened into
/// the same JSON object, and what only the server knows of it.
public struct LiveMember: Codable, Sendable, Equatable {
    public var participant: Participant
    /// The share of the audio (percent) the member last reported missing on its way in, this session:
    /// a dispatcher's lead to a bad radio link. Nil while it is not connected or may not listen; 0 as
    /// well when it has reported nothing (clients report a move of 2 points, older ones never).
    public var receptionLoss: Int?
    /// Its place in the floor queue (1 is next), while it waits to talk: who is kept waiting, and
    /// behind whom, is a dispatcher's question too.
    public var queuePosition: Int?

    public init(participant: Participant, receptionLoss: Int? = nil, queuePosition: Int? = nil) {
        self.participant = participant
        self.receptionLoss = receptionLoss
        self.queuePosition = queuePosition
    }

    private enum Keys: String, CodingKey { case receptionLoss, queuePosition }

    public init(from decoder: any Decoder) throws {
        participant = try Participant(from: decoder)
        let container = try decoder.container(keyedBy: Keys.self)
        receptionLoss = try container.decodeIfPresent(Int.self, forKey: .receptionLoss)
        queuePosition = try container.decodeIfPresent(Int.self, forKey: .queuePosition)
    }

    public func encode(to encoder: any Encoder) throws {
        try participant.encode(to: encoder)
        var container = encoder.container(keyedBy: Keys.self)
        try container.encodeIfPresent(receptionLoss, forKey: .receptionLoss)
        try container.encodeIfPresent(queuePosition, forKey: .queuePosition)
    }
}
