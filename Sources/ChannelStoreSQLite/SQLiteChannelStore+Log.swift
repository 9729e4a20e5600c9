import ChannelProtocol
import ChannelStore
import Foundation
import GRDB

extension SQLiteChannelStore {

    public func logTransmission(_ record: TransmissionRecord) async throws(StoreError) {
        let operation = StoreOperation.logTransmission(record)
        try await write(operation.action) { db in try Self.perform(operation, in: db) }
    }

    static func logTransmission(_ row: TransmissionRow, in db: Database) throws {
        // A burst's start inserts its row; its progress (in progress, with the length so far) and
        // its end update that row. A start is never an update: two bursts of a user starting in
        // the same millisecond (two connections, full duplex) each get a row.
        if row.endReason != TransmissionRecord.inProgress || row.durationMilliseconds > 0 {
            // One row: two bursts of a user starting in the same millisecond each end their own.
            try db.execute(sql: """
                UPDATE transmission SET duration_ms = ?, end_reason = ?
                WHERE id = (SELECT id FROM transmission
                            WHERE channel_id = ? AND user_id = ? AND started_at = ? AND end_reason = ?
                            ORDER BY id LIMIT 1)
                """, arguments: [row.durationMilliseconds, row.endReason, row.channelID, row.userID, row.startedAt,
                                 TransmissionRecord.inProgress])
            if db.changesCount > 0 { return }
        }
        try row.insert(db)
    }

    public func closeInterruptedTransmissions() async throws(StoreError) -> Int {
        try await write("close the transmissions a stopped server left in progress") { db in
            try db.execute(sql: "UPDATE transmission SET end_reason = ? WHERE end_reason = ?",
                           arguments: [TransmissionRecord.interrupted, TransmissionRecord.inProgress])
            return db.changesCount
        }
    }

    public func transmissions(of channel: UUID, limit: Int) async throws(StoreError) -> [TransmissionRecord] {
        try await read("read transmissions of channel \(channel)") { db in
            try TransmissionRow.filter(TransmissionRow.Columns.channelID == channel.uuidString)
                .order(TransmissionRow.Columns.startedAt.desc, TransmissionRow.Columns.id.desc)
                .limit(max(0, limit))
                .fetchAll(db).map { row throws(StoreError) in try row.record() }
        }
    }

    public func pruneTransmissions(startedBefore cutoff: Date, limit: Int) async throws(StoreError) -> Int {
        let before = cutoff.unixMilliseconds
        return try await write("prune the transmission log") { db in
            try db.execute(sql: """
                DELETE FROM transmission WHERE id IN
                    (SELECT id FROM transmission WHERE started_at < ? ORDER BY started_at LIMIT ?)
                """, arguments: [before, max(0, limit)])
            return db.changesCount
        }
    }


    public func recordAudit(_ record: AuditRecord) async throws(StoreError) {
        let row = try AuditRow(record)
        try await write("record '\(record.action)' in the audit trail") { db in try row.insert(db) }
    }

    public func auditRecords(channel: UUID?, limit: Int) async throws(StoreError) -> [AuditRecord] {
        try await read("read the audit trail") { db in
            var request = AuditRow.order(AuditRow.Columns.id.desc)
            if let channel { request = request.filter(AuditRow.Columns.channelID == channel.uuidString) }
            return try request.limit(max(0, limit)).fetchAll(db).map { row throws(StoreError) in try row.record() }
        }
    }

    public func pruneAudit(before cutoff: Date, limit: Int) async throws(StoreError) -> Int {
        let before = cutoff.unixMilliseconds
        return try await write("prune the audit trail") { db in
            try db.execute(sql: """
                DELETE FROM audit WHERE id IN (SELECT id FROM audit WHERE at < ? ORDER BY at LIMIT ?)
                """, arguments: [before, max(0, limit)])
            return db.changesCount
        }
    }
}
