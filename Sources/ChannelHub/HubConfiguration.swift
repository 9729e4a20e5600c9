import ChannelProtocol
import Foundation

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
    /// A member's roster entry goes to everyone at most once in this long: a change sooner after the
    /// last is held and sent at the end of it, merged with any that follow. The first change goes at
    /// once, so a join or a burst of ordinary length shows without delay; a member toggling mute, or
    /// tapping the floor, can't make the server send every member a message each time. 0: no limit.
    public var rosterUpdateInterval: UInt64 = 500_000_000
    /// Floor grants a member may have per minute, on average, and in a row. Each grant and its end
    /// tell every member three or four things and log the burst, so a member cycling requests and
    /// releases at the control rate would otherwise make the channel's size in messages ten times
    /// a second. 15 a minute is one every four seconds, more than a talker in a busy exchange needs.
    public var floorGrantsPerMinute = 15
    public var floorGrantBurst = 3
    /// Wake pushes one sleeping member may be sent per minute, on average, and in a row, whoever is
    /// talking: several members taking turns must not wake a phone every second.
    public var wakesPerMinute = 10
    public var wakeBurst = 3
    /// How long before its participant token expires a connected member is told so (`tokenExpiring`),
    /// so that its app can fetch a new token and `renewToken` without the session ending: five minutes
    /// is room for an app to ask its backend a few times over a poor network. A token with less than
    /// this left at the join is announced at once.
    public var tokenRenewalNotice: UInt64 = 300_000_000_000
    /// How long after its participant token expired an offline member is still woken by push when a
    /// burst starts. Within it, the woken app can fetch a new token from its backend and renew
    /// (docs/decisions/0022-token-expiry-and-renewal.md); past it, a device nobody renews for is
    /// left alone instead of being woken, with the speaker's name, by every burst for good. The
    /// membership and push token stay, so a join with a new token wakes it again.
    public var wakeAfterTokenExpiry: TimeInterval = 7 * 86_400
    /// The kinds of push token the server delivers: Apple's two with APNs (or its simulator) on,
    /// `device` with its device push service on. An asleep member whose token is of a kind not
    /// served is not woken by a burst, so the hub neither asks for its push nor keeps the burst for
    /// it to be replayed: it will be back no sooner than any other offline member.
    public var pushKinds: Set<PushEnvironment> = Set(PushEnvironment.allCases)
    /// Whether the server sends wake pushes at all (false with both kinds of delivery off).
    public var wakesByPush: Bool {
        get { !pushKinds.isEmpty }
        set { pushKinds = newValue ? Set(PushEnvironment.allCases) : [] }
    }
    /// Where each channel's burst numbers start (the low 16 bits are what audio headers carry). A
    /// listener remembers the last bursts it finished so that their repeated end markers can't start
    /// them again; after a restart, a talker that gets its old slot and numbering from 1 again would
    /// have its first bursts taken for those and not played. squelchd therefore starts each channel
    /// at a random number (`randomFirstBurst`); the hub itself draws nothing (tests start at 1).
    public var firstBurst: @Sendable (UUID) -> UInt64 = { _ in 1 }

    /// Draws each burst's 16-byte media base key (docs/protocol.md §16.4.5). The system's secure
    /// generator; tests may fix it.
    public var newMediaKey: @Sendable () -> [UInt8] = {
        var generator = SystemRandomNumberGenerator()
        return (0..<MediaKey.keyLength).map { _ in UInt8.random(in: 0...255, using: &generator) }
    }

    /// A uniformly random start in 1...65535, for `firstBurst`: the chance that a restarted
    /// channel's next burst repeats one of the 8 a listener remembers is 8 in 65535.
    public static let randomFirstBurst: @Sendable (UUID) -> UInt64 = { _ in UInt64.random(in: 1...0xFFFF) }

    /// A node of a cluster: a channel is served (floor granted, audio relayed) only while this node
    /// holds its lease (`ChannelHub.leaseHeld`); off, every channel is always served.
    public var clustered = false

    public init() {}
}
