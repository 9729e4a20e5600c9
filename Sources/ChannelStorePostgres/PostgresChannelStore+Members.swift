import ChannelProtocol
import ChannelStore
import Foundation
import Logging
import PostgresNIO

extension PostgresChannelStore {

    public func upsertMember(_ member: MemberRecord) async throws(StoreError) { try await applyOne(.upsertMember(member)) }

    public func members(of channel: UUID) async throws(StoreError) -> [MemberRecord] {
        try await rows("list members of channel \(channel)", """
            SELECT \(unescaped: MemberColumns.list) FROM member WHERE channel_id = \(channel) ORDER BY joined_at, user_id
            """, MemberColumns.record)
    }

    public func member(channel: UUID, user: String) async throws(StoreError) -> MemberRecord? {
        try await rows("read member '\(user)' of channel \(channel)", """
            SELECT \(unescaped: MemberColumns.list) FROM member WHERE channel_id = \(channel) AND user_id = \(user)
            """, MemberColumns.record).first
    }

    public func removeMember(channel: UUID, user: String) async throws(StoreError) {
        try await applyOne(.removeMember(channel: channel, user: user))
    }

    public func touchMember(channel: UUID, user: String, lastSeen: Date) async throws(StoreError) {
        try await applyOne(.touchMember(channel: channel, user: user, lastSeen: lastSeen))
    }

    public func setPushToken(channel: UUID, user: String, token: String, environment: PushEnvironment,
                             registeredAt: Date) async throws(StoreError) {
        try await applyOne(.setPushToken(channel: channel, user: user, token: token, environment: environment, registeredAt: registeredAt))
    }

    public func clearPushToken(channel: UUID, user: String) async throws(StoreError) {
        try await applyOne(.clearPushToken(channel: channel, user: user))
    }

    public func setSubscriptions(channel: UUID, user: String, unheard: [String]) async throws(StoreError) {
        try await applyOne(.setSubscriptions(channel: channel, user: user, unheard: unheard))
    }

    public func touchMembers(_ members: [MemberKey], lastSeen: Date) async throws(StoreError) {
        guard !members.isEmpty else { return }
        let time = lastSeen.unixMilliseconds
        let channels = members.map(\.channel), users = members.map(\.user)
        let logger = logger
        try await withConnection("update last seen of \(members.count) members") { connection in
            try await connection.execute("""
                UPDATE member SET last_seen = GREATEST(last_seen, \(time))
                FROM unnest(\(channels)::uuid[], \(users)::text[]) AS given (channel_id, user_id)
                WHERE member.channel_id = given.channel_id AND member.user_id = given.user_id
                """, logger: logger)
        }
    }

    public func recordServerAlive(at now: Date, creditingDowntime: Bool) async throws(StoreError) -> Date? {
        let time = now.unixMilliseconds
        let logger = logger
        return try await transaction("record that the server is running") { connection -> Date? in
            let alive = try await connection.rows("SELECT value FROM meta WHERE key = 'alive_at' FOR UPDATE", logger: logger) {
                try $0.decode(Int64.self)
            }.first
            if creditingDowntime, let alive {
                // Rows written after the last record (a join, a close) show the server ran until then.
                let newest = try await connection.rows("SELECT MAX(last_seen) FROM member", logger: logger) {
                    try $0.decode(Int64?.self)
                }.first ?? nil
                let downtime = time - max(alive, newest ?? alive)
                if downtime > 0 {
                    try await connection.execute("UPDATE member SET last_seen = LEAST(\(time), last_seen + \(downtime))", logger: logger)
                }
            }
            try await connection.execute("""
                INSERT INTO meta (key, value) VALUES ('alive_at', \(time))
                ON CONFLICT (key) DO UPDATE SET value = excluded.value
                """, logger: logger)
            return alive.map(Date.init(unixMilliseconds:))
        }
    }

    /// Every write in one transaction, each in a savepoint of its own: a write refused (no such
    /// member, a value refused) is undone alone and reported, the others commit together.
    public func apply(_ operations: [StoreOperation]) async throws(StoreError) -> [StoreError?] {
        guard !operations.isEmpty else { return [] }
        let action = operations.count == 1 ? operations[0].action : "save \(operations.count) changes"
        let logger = logger
        let fencing = fencing.withLock { $0 }
        return try await transaction(action) { connection in
            var outcomes: [StoreError?] = []
            outcomes.reserveCapacity(operations.count)
            for operation in operations {
                try await connection.execute("SAVEPOINT operation", logger: logger)
                do {
                    if let fencing { try await Self.checkFence(fencing, operation.channel, on: connection, logger: logger) }
                    try await Self.perform(operation, on: connection, logger: logger)
                    try await connection.execute("RELEASE SAVEPOINT operation", logger: logger)
                    outcomes.append(nil)
                } catch {
                    let refusal = self.storeError("cannot " + operation.action, error)
                    // One that may pass later (a lost connection, a deadlock) fails them all: the
                    // transaction is rolled back and the caller tries the whole batch again.
                    if refusal.isTransient { throw refusal }
                    try await connection.execute("ROLLBACK TO SAVEPOINT operation", logger: logger)
                    outcomes.append(refusal)
                }
            }
            return outcomes
        }
    }

    /// Refuses a write for a channel this node does not hold at the epoch it believes, and holds the
    /// placement row until the transaction ends.
    static func checkFence(_ fencing: Fencing, _ channel: UUID, on connection: PostgresConnection, logger: Logger) async throws {
        guard let epoch = fencing.epoch(channel) else {
            throw StoreError.fenced("node \(fencing.node) does not hold channel \(channel)")
        }
        let held = try await connection.count("""
            SELECT 1 FROM placement WHERE channel_id = \(channel) AND home = \(fencing.node.rawValue) AND epoch = \(epoch.rawValue) FOR SHARE
            """, logger: logger)
        guard held > 0 else {
            throw StoreError.fenced("channel \(channel) moved on from epoch \(epoch.rawValue) at node \(fencing.node)")
        }
    }

    /// One write on its own: `apply` of one, its refusal thrown.
    func applyOne(_ operation: StoreOperation) async throws(StoreError) {
        let logger = logger
        try await withConnection(operation.action) { connection in
            try await Self.perform(operation, on: connection, logger: logger)
        }
    }

    /// One write, each a single statement, so that it is atomic inside a transaction or not.
    static func perform(_ operation: StoreOperation, on connection: PostgresConnection, logger: Logger) async throws {
        switch operation {
        case .upsertMember(let member):
            try await upsert(member, on: connection, logger: logger)
        case .touchMember(let channel, let user, let lastSeen):
            try await updateMember(channel, user, on: connection, logger: logger, """
                UPDATE member SET last_seen = \(lastSeen.unixMilliseconds)
                WHERE channel_id = \(channel) AND user_id = \(user) RETURNING 1
                """)
        case .setPushToken(let channel, let user, let token, let environment, let registeredAt):
            try await updateMember(channel, user, on: connection, logger: logger, """
                UPDATE member SET push_token = \(token), push_environment = \(environment.rawValue),
                    push_registered_at = \(registeredAt.unixMilliseconds)
                WHERE channel_id = \(channel) AND user_id = \(user) RETURNING 1
                """)
        case .removeMember(let channel, let user):
            try await updateMember(channel, user, on: connection, logger: logger, """
                DELETE FROM member WHERE channel_id = \(channel) AND user_id = \(user) RETURNING 1
                """)
        case .clearPushToken(let channel, let user):
            try await updateMember(channel, user, on: connection, logger: logger, """
                UPDATE member SET push_token = NULL, push_environment = NULL, push_registered_at = NULL
                WHERE channel_id = \(channel) AND user_id = \(user) RETURNING 1
                """)
        case .setSubscriptions(let channel, let user, let unheard):
            let list: [String]? = unheard.isEmpty ? nil : unheard.sorted()
            try await updateMember(channel, user, on: connection, logger: logger, """
                UPDATE member SET unheard = \(list) WHERE channel_id = \(channel) AND user_id = \(user) RETURNING 1
                """)
        case .logTransmission(let record):
            try await logTransmission(record, on: connection, logger: logger)
        }
    }

    /// Inserts or updates; a write that carries no push token, or no grant, keeps the stored one.
    static func upsert(_ member: MemberRecord, on connection: PostgresConnection, logger: Logger) async throws {
        let grant = member.grant
        let unheard: [String]? = member.unheard.isEmpty ? nil : member.unheard.sorted()
        let exists = try await connection.count("SELECT 1 FROM channel WHERE id = \(member.channelID)", logger: logger)
        guard exists > 0 else { throw StoreError.channelNotFound(member.channelID) }
        do {
            try await connection.execute("""
                INSERT INTO member (\(unescaped: MemberColumns.list))
                VALUES (\(member.channelID), \(member.userID), \(member.displayName), \(member.joinedAt.unixMilliseconds),
                        \(member.lastSeen.unixMilliseconds), \(member.pushToken), \(member.pushEnvironment?.rawValue),
                        \(member.pushRegisteredAt?.unixMilliseconds), \(grant?.canTalk), \(grant?.canListen), \(grant?.role),
                        \(grant.map { Int64($0.priority) }), \(grant?.tokenID), \(grant?.tokenIssuedAt.unixMilliseconds),
                        \(grant?.tokenExpiresAt.unixMilliseconds), \(unheard))
                ON CONFLICT (channel_id, user_id) DO UPDATE SET
                    display_name = excluded.display_name, joined_at = excluded.joined_at,
                    last_seen = excluded.last_seen, unheard = excluded.unheard,
                    push_token = coalesce(excluded.push_token, member.push_token),
                    push_environment = CASE WHEN excluded.push_token IS NULL THEN member.push_environment ELSE excluded.push_environment END,
                    push_registered_at = CASE WHEN excluded.push_token IS NULL THEN member.push_registered_at ELSE excluded.push_registered_at END,
                    can_talk = CASE WHEN excluded.token_id IS NULL THEN member.can_talk ELSE excluded.can_talk END,
                    can_listen = CASE WHEN excluded.token_id IS NULL THEN member.can_listen ELSE excluded.can_listen END,
                    role = CASE WHEN excluded.token_id IS NULL THEN member.role ELSE excluded.role END,
                    priority = CASE WHEN excluded.token_id IS NULL THEN member.priority ELSE excluded.priority END,
                    token_id = coalesce(excluded.token_id, member.token_id),
                    token_issued_at = CASE WHEN excluded.token_id IS NULL THEN member.token_issued_at ELSE excluded.token_issued_at END,
                    token_expires_at = CASE WHEN excluded.token_id IS NULL THEN member.token_expires_at ELSE excluded.token_expires_at END
                """, logger: logger)
        } catch let error as PSQLError where error.serverInfo?[.sqlState] == "23503" {
            // The channel was deleted between the check and the insert.
            throw StoreError.channelNotFound(member.channelID)
        }
    }

    static func updateMember(_ channel: UUID, _ user: String, on connection: PostgresConnection, logger: Logger,
                             _ statement: PostgresQuery) async throws {
        guard try await connection.count(statement, logger: logger) > 0 else {
            throw StoreError.memberNotFound(channel: channel, user: user)
        }
    }
}
