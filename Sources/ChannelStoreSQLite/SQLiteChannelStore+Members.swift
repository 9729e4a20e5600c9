import ChannelProtocol
import ChannelStore
import Foundation
import GRDB

extension SQLiteChannelStore {

    public func upsertMember(_ member: MemberRecord) async throws(StoreError) {
        let operation = StoreOperation.upsertMember(member)
        try await write(operation.action) { db in try Self.perform(operation, in: db) }
    }

    public func members(of channel: UUID) async throws(StoreError) -> [MemberRecord] {
        try await read("list members of channel \(channel)") { db in
            try MemberRow.filter(MemberRow.Columns.channelID == channel.uuidString)
                .order(MemberRow.Columns.joinedAt, MemberRow.Columns.userID)
                .fetchAll(db).map { row throws(StoreError) in try row.record() }
        }
    }

    public func member(channel: UUID, user: String) async throws(StoreError) -> MemberRecord? {
        try await read("read member '\(user)' of channel \(channel)") { db in
            try MemberRow.fetchOne(db, key: MemberRow.key(channel, user))?.record()
        }
    }

    public func removeMember(channel: UUID, user: String) async throws(StoreError) {
        let operation = StoreOperation.removeMember(channel: channel, user: user)
        try await write(operation.action) { db in try Self.perform(operation, in: db) }
    }

    public func touchMember(channel: UUID, user: String, lastSeen: Date) async throws(StoreError) {
        let operation = StoreOperation.touchMember(channel: channel, user: user, lastSeen: lastSeen)
        try await write(operation.action) { db in try Self.perform(operation, in: db) }
    }

    public func touchMembers(_ members: [MemberKey], lastSeen: Date) async throws(StoreError) {
        guard !members.isEmpty else { return }
        let time = lastSeen.unixMilliseconds
        try await write("update last seen of \(members.count) members") { db in
            let statement = try db.makeStatement(sql: "UPDATE member SET last_seen = MAX(last_seen, ?) WHERE channel_id = ? AND user_id = ?")
            for member in members { try statement.execute(arguments: [time, member.channel.uuidString, member.user]) }
        }
    }

    public func recordServerAlive(at now: Date, creditingDowntime: Bool) async throws(StoreError) -> Date? {
        let time = now.unixMilliseconds
        return try await write("record that the server is running") { db -> Date? in
            let alive = try Int64.fetchOne(db, sql: "SELECT value FROM meta WHERE key = 'alive_at'")
            if creditingDowntime, let alive {
                // Rows written after the last record (a join, a close) show the server ran until then.
                let newest = try Int64.fetchOne(db, sql: "SELECT MAX(last_seen) FROM member") ?? alive
                let downtime = time - max(alive, newest)
                if downtime > 0 {
                    try db.execute(sql: "UPDATE member SET last_seen = MIN(?, last_seen + ?)", arguments: [time, downtime])
                }
            }
            try db.execute(sql: """
                INSERT INTO meta (key, value) VALUES ('alive_at', ?)
                ON CONFLICT(key) DO UPDATE SET value = excluded.value
                """, arguments: [time])
            return alive.map { Date(unixMilliseconds: $0) }
        }
    }

    public func setPushToken(channel: UUID, user: String, token: String, environment: PushEnvironment,
                             registeredAt: Date) async throws(StoreError) {
        let operation = StoreOperation.setPushToken(channel: channel, user: user, token: token, environment: environment, registeredAt: registeredAt)
        try await write(operation.action) { db in try Self.perform(operation, in: db) }
    }

    public func clearPushToken(channel: UUID, user: String) async throws(StoreError) {
        let operation = StoreOperation.clearPushToken(channel: channel, user: user)
        try await write(operation.action) { db in try Self.perform(operation, in: db) }
    }

    public func setSubscriptions(channel: UUID, user: String, unheard: [String]) async throws(StoreError) {
        let operation = StoreOperation.setSubscriptions(channel: channel, user: user, unheard: unheard)
        try await write(operation.action) { db in try Self.perform(operation, in: db) }
    }

    /// Every write in one transaction, each in a savepoint of its own: a write refused (no such
    /// member, a value refused) is undone alone and reported, the others commit together, with one
    /// disk flush for all of them.
    public func apply(_ operations: [StoreOperation]) async throws(StoreError) -> [StoreError?] {
        guard !operations.isEmpty else { return [] }
        let action = operations.count == 1 ? operations[0].action : "save \(operations.count) changes"
        return try await write(action) { db in
            var outcomes: [StoreError?] = []
            outcomes.reserveCapacity(operations.count)
            for operation in operations {
                do {
                    try db.inSavepoint {
                        try Self.perform(operation, in: db)
                        return .commit
                    }
                    outcomes.append(nil)
                } catch {
                    let refusal = Self.storeError("cannot " + operation.action, error)
                    // One that may pass later (the disk full, an I/O error) fails them all: the
                    // transaction is rolled back and the caller tries the whole batch again. So does
                    // one after which SQLite rolled the whole transaction back itself (out of memory,
                    // a damaged page): the caller learns its own words, not the next statement's
                    // "transaction was aborted".
                    if refusal.isTransient || !db.isInsideTransaction { throw error }
                    outcomes.append(refusal)
                }
            }
            return outcomes
        }
    }

    /// One write, inside the caller's transaction.
    static func perform(_ operation: StoreOperation, in db: Database) throws {
        switch operation {
        case .upsertMember(let member):
            var row = MemberRow(member)
            guard try ChannelRow.exists(db, key: row.channelID) else { throw StoreError.channelNotFound(member.channelID) }
            if row.pushToken == nil || row.tokenID == nil, let existing = try MemberRow.fetchOne(db, key: row.key) {
                if row.pushToken == nil {
                    row.pushToken = existing.pushToken
                    row.pushEnvironment = existing.pushEnvironment
                    row.pushRegisteredAt = existing.pushRegisteredAt
                }
                if row.tokenID == nil { row.grant = existing.grant }
            }
            try row.save(db)
        case .touchMember(let channel, let user, let lastSeen):
            try updateMember(channel, user, in: db, [MemberRow.Columns.lastSeen.set(to: lastSeen.unixMilliseconds)])
        case .setPushToken(let channel, let user, let token, let environment, let registeredAt):
            try updateMember(channel, user, in: db,
                             [MemberRow.Columns.pushToken.set(to: token),
                              MemberRow.Columns.pushEnvironment.set(to: environment.rawValue),
                              MemberRow.Columns.pushRegisteredAt.set(to: registeredAt.unixMilliseconds)])
        case .removeMember(let channel, let user):
            guard try MemberRow.deleteOne(db, key: MemberRow.key(channel, user)) else {
                throw StoreError.memberNotFound(channel: channel, user: user)
            }
        case .clearPushToken(let channel, let user):
            try updateMember(channel, user, in: db,
                             [MemberRow.Columns.pushToken.set(to: nil),
                              MemberRow.Columns.pushEnvironment.set(to: nil),
                              MemberRow.Columns.pushRegisteredAt.set(to: nil)])
        case .setSubscriptions(let channel, let user, let unheard):
            try updateMember(channel, user, in: db, [MemberRow.Columns.unheard.set(to: MemberRow.unheardColumn(unheard))])
        case .logTransmission(let record):
            try logTransmission(TransmissionRow(record), in: db)
        }
    }

    static func updateMember(_ channel: UUID, _ user: String, in db: Database, _ assignments: [ColumnAssignment]) throws {
        let changed = try MemberRow.filter(key: MemberRow.key(channel, user)).updateAll(db, assignments)
        guard changed > 0 else { throw StoreError.memberNotFound(channel: channel, user: user) }
    }
}
