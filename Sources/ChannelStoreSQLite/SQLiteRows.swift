import ChannelProtocol
import ChannelStore
import Foundation
import GRDB

// Row types, internal to this module, keep GRDB out of the public records and fix the storage
// format: UUIDs as uppercase strings and dates as unix milliseconds (`Date.unixMilliseconds`), so
// what the sqlite3 shell shows is readable.

func uuid(_ text: String, in table: String) throws(StoreError) -> UUID {
    guard let id = UUID(uuidString: text) else { throw .database("\(table) row has a malformed channel id '\(text)'") }
    return id
}

struct ChannelRow: Codable, FetchableRecord, PersistableRecord {
    static let databaseTableName = "channel"
    var id: String
    var name: String
    var image: String?
    var mode: String
    var maxBurstSeconds: Int
    var createdAt: Int64
    var updatedAt: Int64

    enum CodingKeys: String, CodingKey {
        case id, name, image, mode
        case maxBurstSeconds = "max_burst_seconds", createdAt = "created_at", updatedAt = "updated_at"
    }

    enum Columns {
        static let name = Column(CodingKeys.name)
        static let createdAt = Column(CodingKeys.createdAt)
    }

    init(_ record: ChannelRecord) {
        id = record.id.uuidString
        name = record.name
        image = record.image
        mode = record.mode.rawValue
        maxBurstSeconds = record.maxBurstSeconds
        createdAt = record.createdAt.unixMilliseconds
        updatedAt = record.updatedAt.unixMilliseconds
    }

    func record() throws(StoreError) -> ChannelRecord {
        guard let mode = TransmissionMode(rawValue: mode) else {
            throw .database("channel \(id) has an unknown mode '\(mode)'; was it written by a newer squelchd?")
        }
        return ChannelRecord(id: try uuid(id, in: "channel"), name: name, image: image, mode: mode, maxBurstSeconds: maxBurstSeconds,
                             createdAt: Date(unixMilliseconds: createdAt), updatedAt: Date(unixMilliseconds: updatedAt))
    }
}

struct MemberRow: Codable, FetchableRecord, PersistableRecord {
    static let databaseTableName = "member"
    var channelID: String
    var userID: String
    var displayName: String
    var joinedAt: Int64
    var lastSeen: Int64
    var pushToken: String?
    var pushEnvironment: String?
    var pushRegisteredAt: Int64?
    var canTalk: Bool?
    var canListen: Bool?
    var role: String?
    var priority: Int64?
    var tokenID: String?
    var tokenIssuedAt: Int64?
    var tokenExpiresAt: Int64?
    /// JSON, written and read by hand (`unheardIDs`) so that a damaged value loses the list, not the row.
    var unheard: String?

    enum CodingKeys: String, CodingKey {
        case channelID = "channel_id", userID = "user_id", displayName = "display_name", joinedAt = "joined_at"
        case lastSeen = "last_seen", pushToken = "push_token", pushEnvironment = "push_environment"
        case pushRegisteredAt = "push_registered_at"
        case canTalk = "can_talk", canListen = "can_listen", role, priority, tokenID = "token_id"
        case tokenIssuedAt = "token_issued_at", tokenExpiresAt = "token_expires_at", unheard
    }

    enum Columns {
        static let channelID = Column(CodingKeys.channelID)
        static let userID = Column(CodingKeys.userID)
        static let joinedAt = Column(CodingKeys.joinedAt)
        static let lastSeen = Column(CodingKeys.lastSeen)
        static let pushToken = Column(CodingKeys.pushToken)
        static let pushEnvironment = Column(CodingKeys.pushEnvironment)
        static let pushRegisteredAt = Column(CodingKeys.pushRegisteredAt)
        static let unheard = Column(CodingKeys.unheard)
    }

    static func key(_ channel: UUID, _ user: String) -> [String: (any DatabaseValueConvertible)?] {
        [CodingKeys.channelID.rawValue: channel.uuidString, CodingKeys.userID.rawValue: user]
    }

    var key: [String: (any DatabaseValueConvertible)?] {
        [CodingKeys.channelID.rawValue: channelID, CodingKeys.userID.rawValue: userID]
    }

    init(_ record: MemberRecord) {
        channelID = record.channelID.uuidString
        userID = record.userID
        displayName = record.displayName
        joinedAt = record.joinedAt.unixMilliseconds
        lastSeen = record.lastSeen.unixMilliseconds
        pushToken = record.pushToken
        pushEnvironment = record.pushEnvironment?.rawValue
        pushRegisteredAt = record.pushRegisteredAt?.unixMilliseconds
        grant = record.grant
        unheardIDs = record.unheard
    }

    /// The stored subscription list. A value that doesn't read back as a list of strings (edited by
    /// hand, or damaged) counts as none: the member hears everyone until it says otherwise, rather
    /// than keeping its channel from loading.
    var unheardIDs: [String] {
        get {
            guard let unheard, let ids = try? JSONDecoder().decode([String].self, from: Data(unheard.utf8)) else { return [] }
            return ids
        }
        set { unheard = Self.unheardColumn(newValue) }
    }

    /// The column's value for a subscription list: NULL for none, as rows from before v5 have.
    static func unheardColumn(_ ids: [String]) -> String? {
        ids.isEmpty ? nil : (try? JSONEncoder().encode(ids.sorted())).map { String(decoding: $0, as: UTF8.self) }
    }

    /// The grant, if the row has one. A row edited by hand into something half-filled or out of range
    /// counts as having none (the member shows as listen-only until it joins again), rather than as an
    /// error that would keep its channel from loading.
    var grant: MemberGrant? {
        get {
            guard let canTalk, let canListen, let priority, (0...255).contains(priority), let tokenID,
                  let tokenIssuedAt, let tokenExpiresAt else { return nil }
            return MemberGrant(canTalk: canTalk, canListen: canListen, role: role, priority: UInt8(priority), tokenID: tokenID,
                               tokenIssuedAt: Date(unixMilliseconds: tokenIssuedAt), tokenExpiresAt: Date(unixMilliseconds: tokenExpiresAt))
        }
        set {
            canTalk = newValue?.canTalk
            canListen = newValue?.canListen
            role = newValue?.role
            priority = newValue.map { Int64($0.priority) }
            tokenID = newValue?.tokenID
            tokenIssuedAt = newValue?.tokenIssuedAt.unixMilliseconds
            tokenExpiresAt = newValue?.tokenExpiresAt.unixMilliseconds
        }
    }

    func record() throws(StoreError) -> MemberRecord {
        var environment: PushEnvironment?
        if let pushEnvironment {
            guard let parsed = PushEnvironment(rawValue: pushEnvironment) else {
                throw .database("member '\(userID)' of channel \(channelID) has an unknown push environment '\(pushEnvironment)'")
            }
            environment = parsed
        }
        return MemberRecord(channelID: try uuid(channelID, in: "member"), userID: userID, displayName: displayName,
                            joinedAt: Date(unixMilliseconds: joinedAt), lastSeen: Date(unixMilliseconds: lastSeen),
                            pushToken: pushToken, pushEnvironment: environment,
                            pushRegisteredAt: pushRegisteredAt.map(Date.init(unixMilliseconds:)), grant: grant,
                            unheard: unheardIDs)
    }
}

struct ServerKeyRow: Codable, FetchableRecord, PersistableRecord {
    static let databaseTableName = "server_key"
    var name: String
    var value: Data
    var createdAt: Int64

    enum CodingKeys: String, CodingKey {
        case name, value, createdAt = "created_at"
    }
}

struct TransmissionRow: Codable, FetchableRecord, PersistableRecord {
    static let databaseTableName = "transmission"
    /// Nil on insert: SQLite assigns it, and it orders bursts that started in the same millisecond.
    var id: Int64?
    var channelID: String
    var userID: String
    var startedAt: Int64
    var durationMilliseconds: Int
    var endReason: String

    enum CodingKeys: String, CodingKey {
        case id, channelID = "channel_id", userID = "user_id", startedAt = "started_at"
        case durationMilliseconds = "duration_ms", endReason = "end_reason"
    }

    enum Columns {
        static let id = Column(CodingKeys.id)
        static let channelID = Column(CodingKeys.channelID)
        static let startedAt = Column(CodingKeys.startedAt)
    }

    init(_ record: TransmissionRecord) {
        id = nil
        channelID = record.channelID.uuidString
        userID = record.userID
        startedAt = record.startedAt.unixMilliseconds
        durationMilliseconds = record.durationMilliseconds
        endReason = record.endReason
    }

    func record() throws(StoreError) -> TransmissionRecord {
        TransmissionRecord(channelID: try uuid(channelID, in: "transmission"), userID: userID,
                           startedAt: Date(unixMilliseconds: startedAt), durationMilliseconds: durationMilliseconds,
                           endReason: endReason)
    }
}

struct AuditRow: Codable, FetchableRecord, PersistableRecord {
    static let databaseTableName = "audit"
    /// Nil on insert: SQLite assigns it, in the order the changes were made.
    var id: Int64?
    var at: Int64
    var source: String
    var actor: String?
    var action: String
    var channelID: String?
    var userID: String?
    /// A JSON object of strings.
    var details: String

    enum CodingKeys: String, CodingKey {
        case id, at, source, actor, action, channelID = "channel_id", userID = "user_id", details
    }

    enum Columns {
        static let id = Column(CodingKeys.id)
        static let channelID = Column(CodingKeys.channelID)
    }

    init(_ record: AuditRecord) throws(StoreError) {
        id = nil
        at = record.at.unixMilliseconds
        source = record.source
        actor = record.actor
        action = record.action
        channelID = record.channelID?.uuidString
        userID = record.userID
        do {
            let encoder = JSONEncoder()
            encoder.outputFormatting = .sortedKeys
            details = String(decoding: try encoder.encode(record.details), as: UTF8.self)
        } catch {
            throw .invalid("the audit record's details cannot be stored: \(error)")
        }
    }

    func record() throws(StoreError) -> AuditRecord {
        let fields: [String: String]
        do { fields = try JSONDecoder().decode([String: String].self, from: Data(details.utf8)) } catch {
            throw .database("audit record \(id ?? 0) has details that are not a JSON object of strings; the database was edited by hand or is damaged")
        }
        var record = AuditRecord(at: Date(unixMilliseconds: at), source: source, actor: actor, action: action,
                                 channelID: try channelID.map { id throws(StoreError) in try uuid(id, in: "audit") },
                                 userID: userID, details: fields)
        record.sequence = id ?? 0
        return record
    }
}

struct RevocationRow: Codable, FetchableRecord, MutablePersistableRecord {
    static let databaseTableName = "revocation"
    /// Nil on insert: SQLite assigns it.
    var sequence: Int64?
    var channelID: String
    var userID: String?
    var tokenID: String?
    var revokedAt: Int64
    var expiresAt: Int64?
    var reason: String

    enum CodingKeys: String, CodingKey {
        case sequence, channelID = "channel_id", userID = "user_id", tokenID = "token_id", revokedAt = "revoked_at"
        case expiresAt = "expires_at", reason
    }

    enum Columns {
        static let sequence = Column(CodingKeys.sequence)
        static let channelID = Column(CodingKeys.channelID)
        static let userID = Column(CodingKeys.userID)
        static let tokenID = Column(CodingKeys.tokenID)
        static let revokedAt = Column(CodingKeys.revokedAt)
        static let expiresAt = Column(CodingKeys.expiresAt)
    }

    init(_ record: RevocationRecord) {
        sequence = nil
        channelID = record.channelID.uuidString
        userID = record.userID
        tokenID = record.tokenID
        revokedAt = record.revokedAt.unixMilliseconds
        expiresAt = record.expiresAt?.unixMilliseconds
        reason = record.reason
    }

    mutating func didInsert(_ inserted: InsertionSuccess) { sequence = inserted.rowID }

    func record() throws(StoreError) -> RevocationRecord {
        RevocationRecord(sequence: sequence ?? 0, channelID: try uuid(channelID, in: "revocation"), userID: userID, tokenID: tokenID,
                         revokedAt: Date(unixMilliseconds: revokedAt), expiresAt: expiresAt.map(Date.init(unixMilliseconds:)),
                         reason: reason)
    }
}
