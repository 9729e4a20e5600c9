import ChannelProtocol
import Foundation

/// A channel as stored and as the admin API shows it.
public struct ChannelRecord: Codable, Sendable, Equatable, Identifiable {
    public var id: UUID
    public var name: String
    /// An http(s) URL, or a small inline image as a `data:image/png;base64,…` URL (at most
    /// `ChannelRecord.maxImageBytes`).
    public var image: String?
    public var mode: TransmissionMode
    /// A talk burst longer than this is revoked.
    public var maxBurstSeconds: Int
    public var createdAt: Date
    public var updatedAt: Date

    public static let maxNameLength = 64
    /// Characters are counted as people see them, and one of them may hold any number of combining
    /// marks: the bytes are bounded too, so that a name and an inline image always fit the control
    /// message that carries them (`descriptor`, `joined`: 64 KiB).
    public static let maxNameBytes = 1_024
    public static let maxImageBytes = 16 * 1024
    public static let maxBurstRange = 1...600

    public init(id: UUID = UUID(), name: String, image: String? = nil, mode: TransmissionMode = .halfDuplex,
                maxBurstSeconds: Int = 60, createdAt: Date = Date(), updatedAt: Date = Date()) {
        self.id = id
        self.name = name
        self.image = image
        self.mode = mode
        self.maxBurstSeconds = maxBurstSeconds
        self.createdAt = createdAt
        self.updatedAt = updatedAt
    }

    /// Largest width and height of an inline image, in pixels: a channel icon, not a photo.
    public static let maxImagePixels = 1_024

    /// Checks the fields a user typed; the message says what to change.
    public func validate() throws(StoreError) {
        let trimmed = name.trimmingCharacters(in: .whitespacesAndNewlines)
        guard !trimmed.isEmpty, trimmed.count <= Self.maxNameLength else {
            throw .invalid("channel name must be 1-\(Self.maxNameLength) characters")
        }
        guard trimmed.utf8.count <= Self.maxNameBytes else {
            throw .invalid("channel name is \(trimmed.utf8.count) bytes of UTF-8; at most \(Self.maxNameBytes) (fewer combining marks)")
        }
        if let problem = Self.plainTextProblem(name) { throw .invalid("channel name contains \(problem); use plain text") }
        guard Self.maxBurstRange.contains(maxBurstSeconds) else {
            throw .invalid("maximum burst must be \(Self.maxBurstRange.lowerBound)-\(Self.maxBurstRange.upperBound) seconds, not \(maxBurstSeconds)")
        }
        if let image { try Self.validateImage(image) }
    }

    /// What keeps `text` from being shown as it is on a member's screen or terminal, if anything: a
    /// control character (an escape sequence, a line break) could rewrite a terminal or break a
    /// layout, and bidirectional overrides and isolates make text display as something else.
    public static func plainTextProblem(_ text: String) -> String? {
        if text.unicodeScalars.contains(where: { $0.properties.generalCategory == .control || $0 == "\u{2028}" || $0 == "\u{2029}" }) {
            return "control characters (escape sequences, tabs or line breaks)"
        }
        if text.unicodeScalars.contains(where: { (0x202A...0x202E).contains($0.value) || (0x2066...0x2069).contains($0.value) }) {
            return "bidirectional text controls (U+202A-202E, U+2066-2069)"
        }
        return nil
    }

    /// An image is an http(s) URL with a host, or a `data:image/png;base64,` URL whose bytes are a PNG
    /// (signature and header) of at most `maxImagePixels` a side: every client that joins receives and
    /// decodes it, so what isn't an image is refused here, where the operator can fix it.
    static func validateImage(_ image: String) throws(StoreError) {
        guard image.utf8.count <= maxImageBytes else {
            throw .invalid("channel image is \(image.utf8.count) bytes; inline images must be at most \(maxImageBytes) bytes, or use an https URL")
        }
        let lower = image.lowercased()
        let inlinePrefix = "data:image/png;base64,"
        if lower.hasPrefix(inlinePrefix) {
            guard let bytes = Data(base64Encoded: String(image.dropFirst(inlinePrefix.count))) else {
                throw .invalid("channel image's inline data is not base64; encode the PNG file with 'base64 -w0 icon.png'")
            }
            let size: (width: UInt32, height: UInt32)
            do throws(PNGHeaderError) { size = try PNGHeader.size(of: bytes) } catch {
                throw .invalid("channel image's inline data is not a PNG (\(error.description)); convert the image to PNG first")
            }
            guard size.width <= maxImagePixels, size.height <= maxImagePixels else {
                throw .invalid("channel image is \(size.width)×\(size.height) pixels; at most \(maxImagePixels)×\(maxImagePixels), so scale it down")
            }
            return
        }
        guard lower.hasPrefix("https://") || lower.hasPrefix("http://") else {
            throw .invalid("channel image must be an http(s) URL or a data:image/png;base64, URL")
        }
        guard !image.unicodeScalars.contains(where: { $0.properties.isWhitespace || $0.properties.generalCategory == .control }),
              let url = URL(string: image), let host = url.host, !host.isEmpty else {
            throw .invalid("channel image '\(image.prefix(80))' is not a valid URL; give one like https://example.com/icon.png")
        }
    }
}

/// Why bytes are not a PNG, for `ChannelRecord.validateImage`.
struct PNGHeaderError: Error, CustomStringConvertible {
    var description: String
}

/// The part of a PNG file that says it is one and how big it is: the 8-byte signature, then the IHDR
/// chunk (length 13, type, width, height). The rest is the client's decoder's business.
enum PNGHeader {
    static let signature: [UInt8] = [0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A]

    static func size(of data: Data) throws(PNGHeaderError) -> (width: UInt32, height: UInt32) {
        let bytes = [UInt8](data.prefix(24))
        guard bytes.count == 24 else { throw PNGHeaderError(description: "only \(data.count) bytes") }
        guard Array(bytes[0..<8]) == signature else { throw PNGHeaderError(description: "no PNG signature") }
        guard Array(bytes[8..<16]) == [0, 0, 0, 13] + Array("IHDR".utf8) else {
            throw PNGHeaderError(description: "no IHDR header after the signature")
        }
        func word(_ at: Int) -> UInt32 { bytes[at..<at + 4].reduce(0) { $0 << 8 | UInt32($1) } }
        let width = word(16), height = word(20)
        guard width > 0, height > 0 else { throw PNGHeaderError(description: "a width or height of 0") }
        return (width, height)
    }
}

/// A member of a channel: someone who joined it with a token and has not left. Members persist, so
/// a member with a push token can be woken while disconnected.
public struct MemberRecord: Codable, Sendable, Equatable {
    public var channelID: UUID
    public var userID: String
    public var displayName: String
    public var joinedAt: Date
    public var lastSeen: Date
    /// The ephemeral push token as lowercase hex, if the member registered one.
    public var pushToken: String?
    public var pushEnvironment: PushEnvironment?
    public var pushRegisteredAt: Date?
    /// What the token the member last joined with allows, and which token it was. Nil for a member
    /// stored before the store kept it (schema v3), until it joins again.
    public var grant: MemberGrant?
    /// The user ids whose audio the member chose not to hear (`setSubscriptions`), sorted. Kept so
    /// that after a restart a member the server has not heard from since is neither woken by nor
    /// replayed the talkers it unsubscribed from.
    public var unheard: [String]

    public init(channelID: UUID, userID: String, displayName: String, joinedAt: Date = Date(), lastSeen: Date = Date(),
                pushToken: String? = nil, pushEnvironment: PushEnvironment? = nil, pushRegisteredAt: Date? = nil,
                grant: MemberGrant? = nil, unheard: [String] = []) {
        self.channelID = channelID
        self.userID = userID
        self.displayName = displayName
        self.joinedAt = joinedAt
        self.lastSeen = lastSeen
        self.pushToken = pushToken
        self.pushEnvironment = pushEnvironment
        self.pushRegisteredAt = pushRegisteredAt
        self.grant = grant
        self.unheard = unheard
    }
}

/// The claims of a member's last participant token that outlive its connection. Kept so that after a
/// restart an offline member is shown with its real role, priority and capabilities, is woken only
/// if it may listen, and is removed when its token is revoked by id.
public struct MemberGrant: Codable, Sendable, Equatable {
    public var canTalk: Bool
    public var canListen: Bool
    public var role: String?
    public var priority: UInt8
    /// The token's `jti`, `iat` and `exp`.
    public var tokenID: String
    public var tokenIssuedAt: Date
    public var tokenExpiresAt: Date

    public init(canTalk: Bool, canListen: Bool, role: String?, priority: UInt8, tokenID: String, tokenIssuedAt: Date,
                tokenExpiresAt: Date) {
        self.canTalk = canTalk
        self.canListen = canListen
        self.role = role
        self.priority = priority
        self.tokenID = tokenID
        self.tokenIssuedAt = tokenIssuedAt
        self.tokenExpiresAt = tokenExpiresAt
    }

    /// The token's capabilities as its claim spells them, "talk" first.
    public var capabilities: [String] { (canTalk ? ["talk"] : []) + (canListen ? ["listen"] : []) }
}

/// A member as operators see it (admin API, `squelchd channel show`): the push token itself never
/// leaves the server, only whether there is one and for which APNs environment.
public struct MemberSummary: Codable, Sendable, Equatable {
    public var userID: String
    public var displayName: String
    public var joinedAt: Date
    public var lastSeen: Date
    public var hasPushToken: Bool
    public var pushEnvironment: PushEnvironment?
    public var pushRegisteredAt: Date?
    /// From the member's last token (all nil for a member stored before the store kept them).
    public var capabilities: [String]?
    public var role: String?
    public var priority: Int?
    public var tokenExpiresAt: Date?
    /// The `jti` of that token: what `squelchd token revoke --channel … --id …` and the admin API's
    /// revocations take. An identifier, not a credential: it lets nobody in.
    public var tokenID: String?

    public init(_ member: MemberRecord) {
        userID = member.userID
        displayName = member.displayName
        joinedAt = member.joinedAt
        lastSeen = member.lastSeen
        hasPushToken = member.pushToken != nil
        pushEnvironment = member.pushToken != nil ? member.pushEnvironment : nil
        pushRegisteredAt = member.pushToken != nil ? member.pushRegisteredAt : nil
        if let grant = member.grant {
            capabilities = grant.capabilities
            role = grant.role
            priority = Int(grant.priority)
            tokenExpiresAt = grant.tokenExpiresAt
            tokenID = grant.tokenID
        }
    }

    /// Absent push fields are written as `null`, so every member has the same JSON shape.
    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(userID, forKey: .userID)
        try container.encode(displayName, forKey: .displayName)
        try container.encode(joinedAt, forKey: .joinedAt)
        try container.encode(lastSeen, forKey: .lastSeen)
        try container.encode(hasPushToken, forKey: .hasPushToken)
        try container.encode(pushEnvironment, forKey: .pushEnvironment)
        try container.encode(pushRegisteredAt, forKey: .pushRegisteredAt)
        try container.encode(capabilities, forKey: .capabilities)
        try container.encode(role, forKey: .role)
        try container.encode(priority, forKey: .priority)
        try container.encode(tokenExpiresAt, forKey: .tokenExpiresAt)
        try container.encode(tokenID, forKey: .tokenID)
    }
}

/// One talk burst, for the transmission log.
public struct TransmissionRecord: Codable, Sendable, Equatable {
    public var channelID: UUID
    public var userID: String
    public var startedAt: Date
    public var durationMilliseconds: Int
    /// Why it ended: "released", "preempted", "maxBurst", "disconnected", "silent", "channelDeleted", …;
    /// `inProgress` while it goes on, and `interrupted` for one the server never ended (it was killed).
    public var endReason: String

    /// The end reason of a burst still going: written at its start, so that a crash does not erase it
    /// from the log; its end replaces it.
    public static let inProgress = "inProgress"
    /// The end reason a server starting gives the bursts its predecessor left `inProgress`: it died
    /// during them (kill -9, power), and how long they went on is not known (duration 0).
    public static let interrupted = "interrupted"

    public init(channelID: UUID, userID: String, startedAt: Date, durationMilliseconds: Int, endReason: String) {
        self.channelID = channelID
        self.userID = userID
        self.startedAt = startedAt
        self.durationMilliseconds = durationMilliseconds
        self.endReason = endReason
    }
}

/// One change an administrator made, through the admin API or a `squelchd` command on the host: the
/// audit trail. Kept in the database, not only in squelchd's log, so that it outlives log rotation and
/// includes the commands, which run in processes of their own.
public struct AuditRecord: Codable, Sendable, Equatable {
    /// The store's order of records (0 until stored).
    public var sequence: Int64
    public var at: Date
    /// Where the change came from: `api` (the admin HTTP API) or `cli` (a `squelchd` command).
    public var source: String
    /// Who made it, as far as the server can tell: for `cli` the operating-system user and host that
    /// ran the command; for `api` nil, since every caller presents the same admin key.
    public var actor: String?
    /// What was done: "channel created", "token revoked", … (`AuditRecord.Action`).
    public var action: String
    public var channelID: UUID?
    public var userID: String?
    /// The rest: name, mode, token id (never the token), reason, …
    public var details: [String: String]

    public enum Source {
        public static let api = "api"
        public static let cli = "cli"
    }

    public init(at: Date = Date(), source: String, actor: String? = nil, action: String, channelID: UUID? = nil,
                userID: String? = nil, details: [String: String] = [:]) {
        self.sequence = 0
        self.at = at
        self.source = source
        self.actor = actor
        self.action = action
        self.channelID = channelID
        self.userID = userID
        self.details = details
    }
}

/// A revoked participant token, or every token a member held when an administrator removed it. A
/// token stays signed and unexpired after it leaks or its holder leaves; this is what voids it.
public struct RevocationRecord: Codable, Sendable, Equatable {
    /// The store's order of revocations (0 until stored), so that a server can pick up the ones other
    /// processes made since it last looked.
    public var sequence: Int64
    public var channelID: UUID
    /// Whose tokens. With `tokenID` nil, every token of this user for the channel issued before
    /// `revokedAt`, or in its millisecond, is void; a token issued later is good.
    public var userID: String?
    /// The one token (`jti`) that is void.
    public var tokenID: String?
    public var revokedAt: Date
    /// When the record stops mattering: the revoked token's own expiry. Nil: kept for good.
    public var expiresAt: Date?
    /// For the operator and the refused member: "removed by an administrator", "token leaked", …
    public var reason: String

    /// Every token `user` holds for `channel` now.
    public static func member(channel: UUID, user: String, at time: Date, reason: String) -> RevocationRecord {
        RevocationRecord(sequence: 0, channelID: channel, userID: user, tokenID: nil, revokedAt: time, expiresAt: nil, reason: reason)
    }

    /// One token.
    public static func token(_ id: String, channel: UUID, user: String?, expiresAt: Date?, at time: Date,
                             reason: String) -> RevocationRecord {
        RevocationRecord(sequence: 0, channelID: channel, userID: user, tokenID: canonicalTokenID(id), revokedAt: time,
                         expiresAt: expiresAt, reason: reason)
    }

    /// Whether `id` can be a token id squelchd issued (a UUID, in any case, spaces around it
    /// allowed). A revocation by any other id would be stored, reported as done, and match nothing.
    public static func isIssuedTokenID(_ id: String) -> Bool {
        UUID(uuidString: id.trimmingCharacters(in: .whitespacesAndNewlines)) != nil
    }

    /// A token id as revocations keep and compare it. squelchd issues UUIDs in upper case; the same id
    /// typed or pasted in lower case (as many tools print UUIDs), or with spaces around it, must name
    /// the same token: a revocation of the lower-case form used to be stored, answered with success,
    /// and match nothing, which left a lost phone in the channel.
    public static func canonicalTokenID(_ id: String) -> String {
        let trimmed = id.trimmingCharacters(in: .whitespacesAndNewlines)
        return UUID(uuidString: trimmed)?.uuidString ?? trimmed
    }

    /// Whether a token with these claims is void by this revocation.
    ///
    /// Times are compared in whole milliseconds, as the store keeps them, and a token issued in the
    /// same millisecond as a member's removal is void: it may have been issued just before it, and
    /// letting a removed member back in is the worse mistake (a new token a millisecond later works).
    public func voids(channel: UUID, user: String, tokenID: String, issuedAt: Date) -> Bool {
        guard channel == channelID else { return false }
        if let revoked = self.tokenID { return Self.canonicalTokenID(revoked) == Self.canonicalTokenID(tokenID) }
        return userID == user && issuedAt.unixMilliseconds <= revokedAt.unixMilliseconds
    }

    /// Longest token id (as `ParticipantClaims.maxTokenIDBytes`) and reason, in UTF-8 bytes.
    public static let maxTokenIDBytes = 128
    public static let maxReasonBytes = 200

    /// The one check of what a revocation may hold; the admin API and the CLI rely on it.
    public func validate() throws(StoreError) {
        guard tokenID != nil || userID != nil else { throw .invalid("a revocation names a token id, a user, or both") }
        if let tokenID, tokenID.trimmingCharacters(in: .whitespaces).isEmpty || tokenID.utf8.count > Self.maxTokenIDBytes {
            throw .invalid("a token id is 1-\(Self.maxTokenIDBytes) bytes")
        }
        if let userID, userID.isEmpty || userID.utf8.count > ControlLimits.maxUserIDBytes {
            throw .invalid("a user id is 1-\(ControlLimits.maxUserIDBytes) bytes")
        }
        guard reason.utf8.count <= Self.maxReasonBytes else { throw .invalid("a revocation reason is at most \(Self.maxReasonBytes) bytes") }
        // The revoked member's client shows the reason, often in a terminal.
        if let problem = ChannelRecord.plainTextProblem(reason) {
            throw .invalid("a revocation reason contains \(problem); use plain text")
        }
    }
}

/// A storage failure, worded for whoever has to fix it.
public enum StoreError: Error, Sendable, Equatable, CustomStringConvertible {
    /// A value the caller supplied is not acceptable.
    case invalid(String)
    case channelNotFound(UUID)
    case memberNotFound(channel: UUID, user: String)
    /// The database could not be opened or migrated, or a statement failed.
    case database(String)
    /// The database could not take the statement just now, for a reason that passes or that freeing
    /// space mends: another process held its lock too long, the disk is full, an I/O error (other than
    /// data that reads back damaged). The same statement can succeed later, so the server's store
    /// writer keeps such writes and tries them again.
    case unavailable(String)

    public var description: String {
        switch self {
        case .invalid(let why): return why
        case .channelNotFound(let id): return "no channel \(id); 'squelchd channel list' shows the channels"
        case .memberNotFound(let channel, let user): return "user '\(user)' is not a member of channel \(channel)"
        case .database(let why): return "database error: \(why)"
        case .unavailable(let why): return "database unavailable: \(why)"
        }
    }

    /// Whether the same operation can succeed later without anything about it changing.
    public var isTransient: Bool {
        if case .unavailable = self { true } else { false }
    }
}

/// One membership: a channel and a user.
public struct MemberKey: Hashable, Sendable {
    public var channel: UUID
    public var user: String
    public init(channel: UUID, user: String) {
        self.channel = channel
        self.user = user
    }
}

/// A write the hub wants persisted, as the store's own methods of the same names do it: what
/// `ChannelStore.apply(_:)` takes many of at once.
public enum StoreOperation: Sendable, Equatable {
    case upsertMember(MemberRecord)
    case touchMember(channel: UUID, user: String, lastSeen: Date)
    case setPushToken(channel: UUID, user: String, token: String, environment: PushEnvironment, registeredAt: Date)
    case removeMember(channel: UUID, user: String)
    /// APNs said the token is dead.
    case clearPushToken(channel: UUID, user: String)
    /// The member's subscription list (`MemberRecord.unheard`) changed.
    case setSubscriptions(channel: UUID, user: String, unheard: [String])
    case logTransmission(TransmissionRecord)
}

/// Where squelchd keeps what must survive a restart. SQLite (`SQLiteChannelStore`) is the embedded
/// default; the protocol leaves room for PostgreSQL in a multi-node deployment.
///
/// Every write is durable when the call returns. Implementations are safe to use from several
/// processes at once (the `squelchd channel` CLI edits the same database a running server uses), and
/// `revision()` lets a server notice channel edits made elsewhere.
public protocol ChannelStore: Sendable {
    // Channels
    func createChannel(_ channel: ChannelRecord) async throws(StoreError)
    func channel(_ id: UUID) async throws(StoreError) -> ChannelRecord?
    func channels() async throws(StoreError) -> [ChannelRecord]
    /// Replaces the stored channel with the same id (bumping `updatedAt`); `channelNotFound` if absent.
    func updateChannel(_ channel: ChannelRecord) async throws(StoreError) -> ChannelRecord
    /// Deletes the channel and its members; keeps its transmission log. `channelNotFound` if absent.
    func deleteChannel(_ id: UUID) async throws(StoreError)
    /// A number that changes whenever any process creates, updates or deletes a channel, removes a
    /// member or revokes a token: cheap enough to poll every second.
    func revision() async throws(StoreError) -> Int64

    // Members
    /// Inserts or updates the member (matching channel and user). Push fields are kept unless set.
    func upsertMember(_ member: MemberRecord) async throws(StoreError)
    func members(of channel: UUID) async throws(StoreError) -> [MemberRecord]
    func member(channel: UUID, user: String) async throws(StoreError) -> MemberRecord?
    /// Removes the member and its push token; `memberNotFound` if absent.
    func removeMember(channel: UUID, user: String) async throws(StoreError)
    func touchMember(channel: UUID, user: String, lastSeen: Date) async throws(StoreError)
    /// Stores an ephemeral push token on the membership (replacing any earlier one).
    func setPushToken(channel: UUID, user: String, token: String, environment: PushEnvironment,
                      registeredAt: Date) async throws(StoreError)
    func clearPushToken(channel: UUID, user: String) async throws(StoreError)
    /// Replaces the member's subscription list (`MemberRecord.unheard`); `memberNotFound` if absent.
    func setSubscriptions(channel: UUID, user: String, unheard: [String]) async throws(StoreError)

    /// Sets the last-seen time of each member given (those still stored; none is created), in one
    /// transaction, never moving a time back: what the server writes hourly for its connected members.
    func touchMembers(_ members: [MemberKey], lastSeen: Date) async throws(StoreError)
    /// Records that the server is running as of `now`, and returns when it last said so (nil: never).
    /// With `creditingDowntime`, in the same transaction, every member's last-seen time moves on by the
    /// time the server was down (since the later of that record and the newest last-seen time), at
    /// most to `now`: an outage does not count as the members' absence, and is credited once.
    func recordServerAlive(at now: Date, creditingDowntime: Bool) async throws(StoreError) -> Date?

    // Revocations
    /// Stores `revocation` and returns it with its sequence; also drops revocations whose tokens have
    /// expired. A member revocation replaces an earlier one for the same member (its cut-off is later);
    /// a token already revoked returns the stored revocation (completed with the token's expiry and
    /// user if it was made by id alone) rather than a second one, with `isNew` false. Decided in the
    /// write itself, so of two identical requests at once exactly one is told new.
    func storeRevocation(_ revocation: RevocationRecord) async throws(StoreError) -> (record: RevocationRecord, isNew: Bool)
    /// The revocation that voids a token with these claims, if any: checked on every join.
    func revocation(channel: UUID, user: String, tokenID: String, issuedAt: Date) async throws(StoreError) -> RevocationRecord?
    /// Revocations stored after `sequence`, oldest first; only `channel`'s when given.
    func revocations(after sequence: Int64, channel: UUID?) async throws(StoreError) -> [RevocationRecord]

    // Server keys (transport reset key, address-token key, …), created once and kept.
    func serverKey(named name: String) async throws(StoreError) -> [UInt8]?
    /// Stores `value` under `name` unless a key of that name exists; returns the stored key either way,
    /// so two processes starting at once agree.
    func storeServerKeyIfAbsent(named name: String, value: [UInt8]) async throws(StoreError) -> [UInt8]
    /// Stores `value` under `name`, replacing what was there: for what the server records about itself
    /// at each start (the public half of its token key), which other processes then check against.
    func setServerKey(named name: String, value: [UInt8]) async throws(StoreError)

    // Transmission log
    /// Logs a burst. A record with another end reason than `inProgress`, or an `inProgress` one with
    /// a length (the burst's progress so far), replaces the `inProgress` record of the same channel,
    /// user and start (written when the burst began), or is added. An `inProgress` record of length 0
    /// (the start) is always added.
    func logTransmission(_ record: TransmissionRecord) async throws(StoreError)
    /// Marks every `inProgress` record `interrupted`, and returns how many there were: what a server
    /// does at start, since only one server runs on a data directory and it ended none of them.
    func closeInterruptedTransmissions() async throws(StoreError) -> Int
    /// Newest first.
    func transmissions(of channel: UUID, limit: Int) async throws(StoreError) -> [TransmissionRecord]
    /// Deletes at most `limit` transmission records, of any channel, that started before `cutoff`,
    /// oldest first; returns how many. Batched so that no single write holds the database for long.
    func pruneTransmissions(startedBefore cutoff: Date, limit: Int) async throws(StoreError) -> Int

    // Audit trail
    /// Adds a record of an administrator's change.
    func recordAudit(_ record: AuditRecord) async throws(StoreError)
    /// Newest first; of one channel, or of all (`channel` nil).
    func auditRecords(channel: UUID?, limit: Int) async throws(StoreError) -> [AuditRecord]
    /// Deletes at most `limit` audit records older than `cutoff`, oldest first; returns how many.
    func pruneAudit(before cutoff: Date, limit: Int) async throws(StoreError) -> Int

    /// Makes every committed write durable in the main database file (a WAL checkpoint) and releases
    /// the database. Called on graceful shutdown.
    func close() async throws(StoreError)

    /// Applies `operations` in order, all durable when the call returns, and returns what became of
    /// each: nil when it was applied, or the error it was refused with (`memberNotFound`,
    /// `channelNotFound`, `invalid`, or a `database` error of that write alone), which leaves the
    /// others applied. Throws, with none of them applied, when the database can't take writes now
    /// (an `unavailable` error: locked, disk full) or at all: one transaction, so that a failure
    /// leaves nothing half done to apply twice (a burst's start is added, not replaced). One commit
    /// for many writes matters: a server's writes come in bursts (a channel's members reconnecting
    /// after a restart), and each durable commit costs a disk flush.
    func apply(_ operations: [StoreOperation]) async throws(StoreError) -> [StoreError?]
}

extension ChannelStore {
    /// `storeRevocation`, for callers that don't need to know whether it was new.
    public func revoke(_ revocation: RevocationRecord) async throws(StoreError) -> RevocationRecord {
        try await storeRevocation(revocation).record
    }

    /// The member, and its channel, that last joined with the token whose id is `id`, if any: all a
    /// revocation by id alone can be checked against, since issued tokens themselves are not stored.
    /// Reads every channel's members; for administrators' commands, not for joins.
    public func lastHolder(ofTokenID id: String) async throws(StoreError) -> (channel: UUID, userID: String)? {
        let wanted = RevocationRecord.canonicalTokenID(id)
        for channel in try await channels() {
            let member = try await members(of: channel.id).first {
                $0.grant.map { RevocationRecord.canonicalTokenID($0.tokenID) } == wanted
            }
            if let member { return (channel.id, member.userID) }
        }
        return nil
    }

    /// Revokes one token as an administrator asks it (the admin API, `squelchd token revoke`):
    /// - by id alone (`byIDAlone`), a token a member of another channel last joined with is refused,
    ///   since stored on this channel the revocation would void nothing;
    /// - the revocation names the member of this channel that last joined with it, if it lacks one;
    /// - a token already revoked keeps its first revocation, and says so (`isNew` false). One that
    ///   has expired is pruned by `storeRevocation` and replaced: that counts as new. Of two identical
    ///   requests at once, one is told new.
    public func revokeToken(_ revocation: RevocationRecord, byIDAlone: Bool) async throws(StoreError) -> TokenRevocation {
        var revocation = revocation
        let holder = try await lastHolder(ofTokenID: revocation.tokenID ?? "")
        if byIDAlone, let holder, holder.channel != revocation.channelID {
            return .otherChannel(holder.channel, holder: holder.userID)
        }
        let member = holder?.channel == revocation.channelID ? holder?.userID : nil
        if revocation.userID == nil { revocation.userID = member }
        let (stored, isNew) = try await storeRevocation(revocation)
        return .revoked(stored, isNew: isNew, holder: member)
    }
}

/// What `ChannelStore.revokeToken` did.
public enum TokenRevocation: Sendable, Equatable {
    /// Stored (`isNew`), or already revoked and its first revocation returned. `holder`: the member of
    /// the channel that last joined with the token, if any.
    case revoked(RevocationRecord, isNew: Bool, holder: String?)
    /// Nothing stored: by id alone, the token is the one `holder` of that channel last joined with.
    case otherChannel(UUID, holder: String)
}
