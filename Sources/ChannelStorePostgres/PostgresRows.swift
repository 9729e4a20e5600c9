import ChannelProtocol
import ChannelStore
import Foundation
import PostgresNIO

// How each record is read back from its table: the column lists and the decoders live together, so
// that a SELECT and its decoder cannot drift apart.

enum ChannelColumns {
    static let list = "id, name, image, mode, max_burst_seconds, created_at, updated_at"

    static func record(_ row: PostgresRow) throws -> ChannelRecord {
        let (id, name, image, mode, maxBurst, created, updated) = try row.decode((UUID, String, String?, String, Int64, Int64, Int64).self)
        guard let parsed = TransmissionMode(rawValue: mode) else {
            throw StoreError.database("channel \(id) has an unknown mode '\(mode)'; was it written by a newer squelchd?")
        }
        return ChannelRecord(id: id, name: name, image: image, mode: parsed, maxBurstSeconds: Int(maxBurst),
                             createdAt: Date(unixMilliseconds: created), updatedAt: Date(unixMilliseconds: updated))
    }
}

enum MemberColumns {
    static let list = """
        channel_id, user_id, display_name, joined_at, last_seen, push_token, push_environment, push_registered_at, \
        can_talk, can_listen, role, priority, token_id, token_issued_at, token_expires_at, unheard
        """

    static func record(_ row: PostgresRow) throws -> MemberRecord {
        let (channel, user, name, joined, seen, pushToken, pushEnvironment, pushRegistered) =
            try row.decode((UUID, String, String, Int64, Int64, String?, String?, Int64?).self)
        var environment: PushEnvironment?
        if let pushEnvironment {
            guard let parsed = PushEnvironment(rawValue: pushEnvironment) else {
                throw StoreError.database("member '\(user)' of channel \(channel) has an unknown push environment '\(pushEnvironment)'")
            }
            environment = parsed
        }
        let columns = Array(row)
        let (canTalk, canListen, role, priority, tokenID, issued, expires, unheard) =
            try (columns[8].decode(Bool?.self), columns[9].decode(Bool?.self), columns[10].decode(String?.self),
                 columns[11].decode(Int64?.self), columns[12].decode(String?.self), columns[13].decode(Int64?.self),
                 columns[14].decode(Int64?.self), columns[15].decode([String]?.self))
        // A row edited by hand into something half-filled or out of range counts as having no grant
        // (the member shows as listen-only until it joins again), as in the SQLite store.
        var grant: MemberGrant?
        if let canTalk, let canListen, let priority, (0...255).contains(priority), let tokenID, let issued, let expires {
            grant = MemberGrant(canTalk: canTalk, canListen: canListen, role: role, priority: UInt8(priority), tokenID: tokenID,
                                tokenIssuedAt: Date(unixMilliseconds: issued), tokenExpiresAt: Date(unixMilliseconds: expires))
        }
        return MemberRecord(channelID: channel, userID: user, displayName: name, joinedAt: Date(unixMilliseconds: joined),
                            lastSeen: Date(unixMilliseconds: seen), pushToken: pushToken, pushEnvironment: environment,
                            pushRegisteredAt: pushRegistered.map(Date.init(unixMilliseconds:)), grant: grant,
                            unheard: unheard ?? [])
    }
}

enum RevocationColumns {
    static let list = "sequence, channel_id, user_id, token_id, revoked_at, expires_at, reason"

    static func record(_ row: PostgresRow) throws -> RevocationRecord {
        let (sequence, channel, user, token, revoked, expires, reason) =
            try row.decode((Int64, UUID, String?, String?, Int64, Int64?, String).self)
        return RevocationRecord(sequence: sequence, channelID: channel, userID: user, tokenID: token,
                                revokedAt: Date(unixMilliseconds: revoked), expiresAt: expires.map(Date.init(unixMilliseconds:)),
                                reason: reason)
    }
}

enum TransmissionColumns {
    static let list = "channel_id, user_id, started_at, duration_ms, end_reason"

    static func record(_ row: PostgresRow) throws -> TransmissionRecord {
        let (channel, user, started, duration, reason) = try row.decode((UUID, String, Int64, Int64, String).self)
        return TransmissionRecord(channelID: channel, userID: user, startedAt: Date(unixMilliseconds: started),
                                  durationMilliseconds: Int(duration), endReason: reason)
    }
}

enum AuditColumns {
    static let list = "id, at, source, actor, action, channel_id, user_id, details::text"

    static func record(_ row: PostgresRow) throws -> AuditRecord {
        let (id, at, source, actor, action, channel, user, details) =
            try row.decode((Int64, Int64, String, String?, String, UUID?, String?, String).self)
        let fields: [String: String]
        do { fields = try JSONDecoder().decode([String: String].self, from: Data(details.utf8)) } catch {
            throw StoreError.database("audit record \(id) has details that are not a JSON object of strings; the database was edited by hand or is damaged")
        }
        var record = AuditRecord(at: Date(unixMilliseconds: at), source: source, actor: actor, action: action, channelID: channel,
                                 userID: user, details: fields)
        record.sequence = id
        return record
    }

    static func details(_ record: AuditRecord) throws(StoreError) -> String {
        do {
            let encoder = JSONEncoder()
            encoder.outputFormatting = .sortedKeys
            return String(decoding: try encoder.encode(record.details), as: UTF8.self)
        } catch {
            throw .invalid("the audit record's details cannot be stored: \(error)")
        }
    }
}
