import Foundation

// The messages client and server exchange on the Wire control stream (docs/protocol.md §16).
// Each control message is one UTF-8 JSON object with a "type" member naming the message; the other
// members are the message's fields. JSON because the control stream carries a handful of messages
// per talk burst, and a readable format is worth more here than bytes; audio has its own binary
// header (`AudioHeader`).

/// How a channel carries speech.
public enum TransmissionMode: String, Codable, Sendable, CaseIterable {
    /// One talker at a time (the walkie-talkie default).
    case halfDuplex
    /// Up to the server's configured number of simultaneous talkers.
    case fullDuplex
}

/// Who delivers a push token's pushes: Apple (a token from one of its two APNs environments), or
/// squelchd's own device push service (`device`: a Linux walkie, which Apple would refuse).
public enum PushEnvironment: String, Codable, Sendable, CaseIterable {
    case production, sandbox
    case device
}

/// Why a client joins: Apple's `PTChannelJoinReason`.
public enum JoinReason: String, Codable, Sendable {
    case developerRequest
    case channelRestoration
}

/// Limits that client and server must agree on.
public enum ChannelLimits {
    /// The most members a full-duplex channel lets talk at once (squelchd's `fullDuplexMaxTalkers`
    /// goes up to it), and so the most talkers a client mixes: a client mixing fewer would drop the
    /// rest without anyone knowing.
    public static let maxSimultaneousTalkers = 16
}

/// A channel as members see it: Apple's channel descriptor plus what the server enforces.
public struct ChannelInfo: Codable, Sendable, Equatable {
    public var id: UUID
    public var name: String
    /// An http(s) URL or a `data:image/png;base64,…` URL.
    public var image: String?
    public var mode: TransmissionMode
    public var maxBurstSeconds: Int

    public init(id: UUID, name: String, image: String?, mode: TransmissionMode, maxBurstSeconds: Int) {
        self.id = id
        self.name = name
        self.image = image
        self.mode = mode
        self.maxBurstSeconds = maxBurstSeconds
    }
}

/// A member's connection as the roster shows it (after the IVS stage renderer's connection state).
public enum ConnectionState: String, Codable, Sendable {
    /// Connected now.
    case connected
    /// The connection dropped moments ago; the server holds the member's place for the grace period.
    case reconnecting
    /// A member who is not connected (reachable by push if it registered a token).
    case offline
}

/// One entry of a channel's roster.
public struct RosterMember: Codable, Sendable, Equatable {
    /// The member's number in this channel, stable while the server runs; audio headers carry it.
    public var slot: UInt16
    public var userID: String
    public var name: String
    public var role: String?
    /// The member's picture (an https URL, from its token); absent without one, and from older servers.
    public var image: String?
    public var priority: UInt8
    public var canTalk: Bool
    public var canListen: Bool
    public var connection: ConnectionState
    public var talking: Bool
    public var muted: Bool

    public init(slot: UInt16, userID: String, name: String, role: String? = nil, image: String? = nil, priority: UInt8 = 0,
                canTalk: Bool = true, canListen: Bool = true, connection: ConnectionState = .connected,
                talking: Bool = false, muted: Bool = false) {
        self.slot = slot
        self.userID = userID
        self.name = name
        self.role = role
        self.image = image
        self.priority = priority
        self.canTalk = canTalk
        self.canListen = canListen
        self.connection = connection
        self.talking = talking
        self.muted = muted
    }
}

/// Why the server refused a join, or removed a member. Codes 1-5 and 14 are the participant token's
/// own (`TokenError.code`), so a client can tell "expired" from "forged" from "revoked"; 16, a renewal
/// with another user's token, is a token problem too (`isTokenProblem`).
public enum RefusalCode: UInt16, Codable, Sendable {
    case tokenExpired = 1
    case tokenForged = 2
    case tokenMalformed = 3
    case tokenWrongChannel = 4
    case tokenNotYetValid = 5
    case channelNotFound = 6
    case notJoined = 7
    case serverBusy = 8
    case removedByAdmin = 9
    case channelDeleted = 10
    case replaced = 11
    case internalError = 12
    case protocolError = 13
    /// The token was revoked, or its member removed after it was issued (`TokenError.revoked`).
    case tokenRevoked = 14
    /// (`error` only) the connection sent control messages faster than the server allows; the
    /// message was dropped.
    case rateLimited = 15
    /// (`error` only) a `renewToken` token names another user than the member renewing it.
    case tokenWrongUser = 16

    /// The codes that say what is wrong with a participant token (the answer to `join` or
    /// `renewToken`), as opposed to the channel, the membership or the request.
    public var isTokenProblem: Bool {
        switch self {
        case .tokenExpired, .tokenForged, .tokenMalformed, .tokenWrongChannel, .tokenNotYetValid, .tokenRevoked, .tokenWrongUser: true
        default: false
        }
    }
}

/// A floor-control outcome or announcement (after MCPTT TS 24.380).
public enum FloorEventKind: String, Codable, Sendable {
    /// To the requester: you may talk; send audio stamped with `burst`.
    case granted
    /// To the requester: refused; `cause` says why.
    case denied
    /// To the requester: waiting, at `position` (1 is next).
    case queued
    /// To everyone else: `slot` holds the floor for `burst`.
    case taken
    /// To the talker: the floor was taken away; `cause` says why. Everyone else sees `ended`.
    case revoked
    /// To everyone: `slot`'s burst ended.
    case ended
    /// To everyone: nobody holds the floor.
    case idle
}

/// Denial and revocation causes. Raw values follow TS 24.380's Reject Cause numbering where one exists.
public enum FloorCause: UInt16, Codable, Sendable {
    case busy = 1
    case notAllowed = 5
    case queueFull = 7
    case preempted = 100
    case maxBurstReached = 101
    /// (`revoked` only) the talker stayed disconnected past the grace period, or sent no audio for
    /// `talkerSilenceLimit` (5 s).
    case disconnected = 102
    case notJoined = 103
    case serviceUnavailable = 104
    /// The request came faster than the server allows control messages (`RefusalCode.rateLimited`).
    case rateLimited = 105
    /// (`revoked` only) an administrator changed the channel so that fewer members may talk at once
    /// (full duplex to half duplex), and this talker's burst was the one to end.
    case channelChanged = 106
}

/// A floor event. Which optional fields are set depends on `kind` (docs/protocol.md §16.3).
public struct FloorEvent: Codable, Sendable, Equatable {
    public var kind: FloorEventKind
    public var slot: UInt16?
    public var burst: UInt16?
    public var cause: FloorCause?
    public var position: Int?
    public var maxBurstSeconds: Int?
    public var reason: String?
    /// (`granted`, `queued`, `denied`) the `floorRequest` this answers: the newest the member sent, as
    /// numbered by its client. Absent when the request carried no number.
    public var request: UInt32?

    public init(kind: FloorEventKind, slot: UInt16? = nil, burst: UInt16? = nil, cause: FloorCause? = nil,
                position: Int? = nil, maxBurstSeconds: Int? = nil, reason: String? = nil, request: UInt32? = nil) {
        self.kind = kind
        self.slot = slot
        self.burst = burst
        self.cause = cause
        self.position = position
        self.maxBurstSeconds = maxBurstSeconds
        self.reason = reason
        self.request = request
    }

    private enum CodingKeys: String, CodingKey {
        case kind, slot, burst, cause, position, maxBurstSeconds, reason, request
    }

    /// A `cause` this version doesn't know reads as absent rather than failing the whole message:
    /// servers add causes (106 came after the first clients), and a client acts on `kind` first.
    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        kind = try c.decode(FloorEventKind.self, forKey: .kind)
        slot = try c.decodeIfPresent(UInt16.self, forKey: .slot)
        burst = try c.decodeIfPresent(UInt16.self, forKey: .burst)
        cause = try c.decodeIfPresent(UInt16.self, forKey: .cause).flatMap(FloorCause.init(rawValue:))
        position = try c.decodeIfPresent(Int.self, forKey: .position)
        maxBurstSeconds = try c.decodeIfPresent(Int.self, forKey: .maxBurstSeconds)
        reason = try c.decodeIfPresent(String.self, forKey: .reason)
        request = try c.decodeIfPresent(UInt32.self, forKey: .request)
    }
}

/// Who holds the floor right now.
public struct Talker: Codable, Sendable, Equatable {
    public var slot: UInt16
    public var burst: UInt16
    public init(slot: UInt16, burst: UInt16) {
        self.slot = slot
        self.burst = burst
    }
}

/// The server's ability to serve this channel (Apple's `PTServiceStatus`, as the server sees it).
public enum ServerStatus: String, Codable, Sendable {
    case ready, connecting, unavailable
}

/// Client → server.
public enum ClientMessage: Sendable, Equatable {
    /// Join `channel` with a participant token. The reply is `joined` or `refused`.
    case join(token: String, channel: UUID, reason: JoinReason)
    /// Leave the channel for good: the membership and its push token are removed.
    case leave
    /// Ask for the floor. `request` numbers the press (the client's own counter, new for each press):
    /// the server names it in its answer (`FloorEvent.request`), so that the answer to a request the
    /// client has already withdrawn is never taken for a newer one's. Absent from older clients.
    /// `queue` false: refuse it (`denied`, `busy`) rather than queue it when the floor is taken, as
    /// for a one-shot that won't wait; sent only when false.
    case floorRequest(request: UInt32? = nil, queue: Bool = true)
    /// Let go of the floor, or withdraw the request waiting for it.
    case floorRelease
    case setMuted(Bool)
    /// The ephemeral push token (hex) the device got on join, and its APNs environment.
    case registerPushToken(token: String, environment: PushEnvironment)
    /// The members (by user id) whose audio this member does not want (the app's subscription strategy,
    /// after Amazon IVS's `subscribeType` `none`). Replaces the previous list; the server sends nothing
    /// from them, live or catch-up, and wakes nobody for them for their bursts. The server keeps it with
    /// the membership while it runs, not on disk, so a client sends it again after every join.
    case setSubscriptions(unheard: [String])
    /// A newer participant token for the same user and channel, so that the session outlives the token
    /// it joined with. The reply is `tokenRenewed`, or `error` with a token code (the session carries
    /// on with the old token until that expires).
    case renewToken(token: String)
    /// How much of the talkers' audio this listener missed on arrival (before FEC or concealment), in
    /// percent, over its last few seconds of listening. Sent when the figure moves, not periodically;
    /// the server tells talkers the worst (`receptionLoss`) so that they can add redundancy.
    case receptionReport(lossPercent: Int)
}

/// Something a server understands beyond the first version of this protocol, announced in `joined`
/// so that a client uses it only with a server that does, rather than finding out from an `error`.
/// A name is free text: one this side doesn't know (from a newer server) is kept and means nothing.
public struct ProtocolFeature: RawRepresentable, Hashable, Codable, Sendable {
    public var rawValue: String
    public init(rawValue: String) { self.rawValue = rawValue }

    /// The server takes `receptionReport` and tells talkers `receptionLoss`.
    public static let receptionReport = ProtocolFeature(rawValue: "receptionReport")
    /// The server is a node of a cluster: the channel may move (`move`), and a client whose node stops
    /// answering rejoins through its entry point rather than waiting for the same node.
    public static let cluster = ProtocolFeature(rawValue: "cluster")
}

/// An entry pass for the home a `redirect` names (docs/protocol.md §7.8): the client presents it in
/// its ClientHello there, and the home answers the join the pass carries with its handshake flight,
/// so the redirect costs one round trip more than a join at the home rather than two. `ticket` is
/// opaque to the client (sealed by the cluster, for that node, valid for 30 s); `key` proves the pass
/// is the client's own. A client that can't use it joins at the home as usual.
public struct HomePass: Codable, Sendable, Equatable {
    public var ticket: Data
    public var key: Data

    public init(ticket: Data, key: Data) {
        self.ticket = ticket
        self.key = key
    }
}

/// A node of a squelchd cluster that is a channel's home: where a client joins it. `epoch` counts the
/// channel's homes (it only grows), so that a client never follows a redirect older than the home it
/// already had.
public struct NodeAddress: Codable, Sendable, Equatable, CustomStringConvertible {
    /// The node's id, for logs and status lines.
    public var node: String
    /// Where clients reach the node's voice transport: a host name or an IP address.
    public var host: String
    public var port: UInt16
    public var epoch: UInt64

    public init(node: String, host: String, port: UInt16, epoch: UInt64) {
        self.node = node
        self.host = host
        self.port = port
        self.epoch = epoch
    }

    public var description: String { "\(node) (\(host.contains(":") ? "[\(host)]" : host):\(port))" }

    /// A refusal of what no node would advertise: an empty or oversized host, port 0, a node id
    /// that is empty or too long.
    public var problem: String? {
        if host.isEmpty || host.utf8.count > 255 { return "the home's host is empty or longer than 255 bytes" }
        if port == 0 { return "the home's port is 0" }
        if node.isEmpty || node.utf8.count > ControlLimits.maxUserIDBytes { return "the home's node id is empty or too long" }
        return nil
    }
}

/// Server → client.
public enum ServerMessage: Sendable, Equatable {
    /// `roster` holds the first chunk (`RosterChunker`); a larger roster continues in `roster`
    /// messages, made as the connection has room, with other messages possibly between them.
    /// `features`: what this server understands beyond the first version of the protocol (none from
    /// a server older than the field).
    case joined(channel: ChannelInfo, you: UInt16, roster: [RosterMember], talkers: [Talker], features: [ProtocolFeature] = [])
    /// More roster entries, following `joined` (large channels), as they are when sent: replace
    /// entries by slot.
    case roster([RosterMember])
    /// The join (or the membership) is refused or ended; the server closes the connection after it.
    case refused(code: RefusalCode, reason: String)
    /// A roster entry appeared or changed.
    case participant(RosterMember)
    /// A member left the channel (not just disconnected: that is a `participant` with `.offline`).
    case participantLeft(slot: UInt16, userID: String)
    case floor(FloorEvent)
    case descriptor(ChannelInfo)
    case serviceStatus(ServerStatus, reason: String?)
    /// The push token was stored.
    case pushTokenRegistered
    /// The subscription list now in force (the answer to `setSubscriptions`).
    case subscriptions(unheard: [String])
    /// A request that made no sense in the current state, or a `renewToken` whose token was refused;
    /// the connection stays.
    case error(code: RefusalCode, reason: String)
    /// The session's participant token expires at `expiresAt` (within the server's notice period, five
    /// minutes by default): send `renewToken` with a new one before then, or the session ends.
    case tokenExpiring(expiresAt: Date)
    /// The token sent with `renewToken` is the session's now; it expires at `expiresAt`.
    case tokenRenewed(expiresAt: Date)
    /// To a talker: the worst loss the members who hear it reported (`receptionReport`), in percent.
    /// Sent when it changes while the member holds the floor, and with a grant when it differs from
    /// what the member was last told in this session. A client starts each session at 0.
    case receptionLoss(lossPercent: Int)
    /// The answer to `join` from a node of a cluster that is not the channel's home: join at `home`
    /// instead. The server closes the connection after it. (docs/protocol.md §19)
    case redirect(home: NodeAddress, pass: HomePass? = nil)
    /// The channel's home moved while this session was on (its node drains, or lost the channel):
    /// join again at `home` at once. The server closes the connection after it.
    case move(home: NodeAddress)
    /// A key a burst's audio is sealed with: to its talker (seal with the newest for the burst) and to
    /// every member who may hear it, before the floor event or audio that needs it.
    case mediaKey(MediaKey)
}

/// One SFrame key of a burst (docs/protocol.md §16.4.5). The server makes a new one for each burst,
/// and again whenever a member who could hear it leaves or loses the right to listen, so that a
/// former member can't open what is said after it left. A burst may have several (older frames in
/// flight and in catch-up still use the earlier ones).
public struct MediaKey: Codable, Sendable, Equatable {
    public var slot: UInt16
    public var burst: UInt16
    /// The SFrame KID. Below 2^53, so that any JSON reader takes it exactly.
    public var keyID: UInt64
    /// The 16-byte SFrame base key.
    public var key: [UInt8]

    public static let keyLength = 16
    public static let maxKeyID: UInt64 = 1 << 53 - 1

    public init(slot: UInt16, burst: UInt16, keyID: UInt64, key: [UInt8]) {
        self.slot = slot
        self.burst = burst
        self.keyID = keyID
        self.key = key
    }

    private enum CodingKeys: String, CodingKey { case slot, burst, keyID, key }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        slot = try c.decode(UInt16.self, forKey: .slot)
        burst = try c.decode(UInt16.self, forKey: .burst)
        keyID = try c.decode(UInt64.self, forKey: .keyID)
        let hex = try c.decode(String.self, forKey: .key)
        guard keyID <= Self.maxKeyID else {
            throw DecodingError.dataCorruptedError(forKey: .keyID, in: c, debugDescription: "key ID \(keyID) is above 2^53")
        }
        guard let bytes = Self.bytes(hex: hex), bytes.count == Self.keyLength else {
            throw DecodingError.dataCorruptedError(forKey: .key, in: c, debugDescription: "a media key is 32 hex digits")
        }
        key = bytes
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(slot, forKey: .slot)
        try c.encode(burst, forKey: .burst)
        try c.encode(keyID, forKey: .keyID)
        try c.encode(key.map { String(format: "%02x", $0) }.joined(), forKey: .key)
    }

    static func bytes(hex: String) -> [UInt8]? {
        let digits = Array(hex.utf8)
        guard digits.count % 2 == 0, digits.count <= 64 else { return nil }
        var bytes = [UInt8]()
        for i in stride(from: 0, to: digits.count, by: 2) {
            guard let high = hexValue(digits[i]), let low = hexValue(digits[i + 1]) else { return nil }
            bytes.append(high << 4 | low)
        }
        return bytes
    }

    private static func hexValue(_ digit: UInt8) -> UInt8? {
        switch digit {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): digit - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): digit - UInt8(ascii: "a") + 10
        default: nil
        }
    }
}

/// A control message that could not be read.
public struct MessageError: Error, Sendable, Equatable, CustomStringConvertible {
    public var description: String
    public init(_ description: String) { self.description = description }
}

/// Limits both sides enforce before parsing.
public enum ControlLimits {
    /// The largest control message either side accepts (an inline channel image is at most 16 KB).
    public static let maxMessageBytes = 64 * 1024
    /// Longest token or string field we accept.
    public static let maxTokenBytes = 8 * 1024
    public static let maxPushTokenHexLength = 200
    /// Most roster entries per message; `rosterChunkBytes` may make a chunk shorter.
    public static let rosterChunk = 128
    /// Most user ids in one `setSubscriptions`.
    public static let maxUnheard = 1_024
    /// Longest user id accepted in a control message.
    public static let maxUserIDBytes = 256
}

/// Application close codes the server puts in CONNECTION_CLOSE (docs/protocol.md §16.5).
public enum CloseCode: UInt64, Sendable {
    /// The member left, or the client closed on purpose (quit, background): the server shows it
    /// offline at once.
    case normal = 0
    /// From the server: it is shutting down or restarting: reconnect (with backoff) and rejoin. From
    /// a client: this connection is being replaced by a new one; keep the member's place for the
    /// grace period.
    case goingAway = 1
    /// The join was refused; the `refused` message before the close says why. Don't retry blindly.
    case refused = 2
    /// An admin removed the member or deleted the channel.
    case removed = 3
    /// The same user joined from another connection.
    case replaced = 4
}
