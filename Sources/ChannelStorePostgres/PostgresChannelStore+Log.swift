import ChannelStore
import Foundation
import Logging
import PostgresNIO

extension PostgresChannelStore {

    public func logTransmission(_ record: TransmissionRecord) async throws(StoreError) {
        try await applyOne(.logTransmission(record))
    }

    /// A burst's start inserts its row; its progress and its end update that row (the oldest, if a
    /// user started two in the same millisecond), or insert one if the start was never written.
    /// One statement either way, so that it is atomic inside `apply`'s savepoint or on its own.
    static func logTransmission(_ r: TransmissionRecord, on connection: PostgresConnection, logger: Logger) async throws {
        let started = r.startedAt.unixMilliseconds, duration = Int64(r.durationMilliseconds)
        if r.endReason == TransmissionRecord.inProgress && r.durationMilliseconds == 0 {
            try await connection.execute("""
                INSERT INTO transmission (channel_id, user_id, started_at, duration_ms, end_reason)
                VALUES (\(r.channelID), \(r.userID), \(started), \(duration), \(r.endReason))
                """, logger: logger)
            return
        }
        try await connection.execute("""
            WITH updated AS (
                UPDATE transmission SET duration_ms = \(duration), end_reason = \(r.endReason)
                WHERE id = (SELECT id FROM transmission
                            WHERE channel_id = \(r.channelID) AND user_id = \(r.userID) AND started_at = \(started)
                              AND end_reason = \(TransmissionRecord.inProgress)
                            ORDER BY id LIMIT 1)
                RETURNING id)
            INSERT INTO transmission (channel_id, user_id, started_at, duration_ms, end_reason)
            SELECT \(r.channelID), \(r.userID), \(started), \(duration), \(r.endReason)
            WHERE NOT EXISTS (SELECT 1 FROM updated)
            """, logger: logger)
    }

    public func closeInterruptedTransmissions() async throws(StoreError) -> Int {
        let logger = logger
        return try await withConnection("close the transmissions a stopped server left in progress") { connection in
            try await connection.count("""
                UPDATE transmission SET end_reason = \(TransmissionRecord.interrupted)
                WHERE end_reason = \(TransmissionRecord.inProgress) RETURNING 1
                """, logger: logger)
        }
    }

    public func transmissions(of channel: UUID, limit: Int) async throws(StoreError) -> [TransmissionRecord] {
        try await rows("read transmissions of channel \(channel)", """
            SELECT \(unescaped: TransmissionColumns.list) FROM transmission WHERE channel_id = \(channel)
            ORDER BY started_at DESC, id DESC LIMIT \(Int64(max(0, limit)))
            """, TransmissionColumns.record)
    }

    public func pruneTransmissions(startedBefore cutoff: Date, limit: Int) async throws(StoreError) -> Int {
        let logger = logger
        return try await withConnection("prune the transmission log") { connection in
            try await connection.count("""
                DELETE FROM transmission WHERE id IN
                    (SELECT id FROM transmission WHERE started_at < \(cutoff.unixMilliseconds) ORDER BY started_at LIMIT \(Int64(max(0, limit))))
                RETURNING 1
                """, logger: logger)
        }
    }

    public func recordAudit(_ record: AuditRecord) async throws(StoreError) {
        let details = try AuditColumns.details(record)
        let logger = logger
        try await withConnection("record '\(record.action)' in the audit trail") { connection in
            try await connection.execute("""
                INSERT INTO audit (at, source, actor, action, channel_id, user_id, details)
                VALUES (\(record.at.unixMilliseconds), \(record.source), \(record.actor), \(record.action), \(record.channelID),
                        \(record.userID), \(details)::jsonb)
                """, logger: logger)
        }
    }

    public func auditRecords(channel: UUID?, limit: Int) async throws(StoreError) -> [AuditRecord] {
        let limit = Int64(max(0, limit))
        if let channel {
            return try await rows("read the audit trail", """
                SELECT \(unescaped: AuditColumns.list) FROM audit WHERE channel_id = \(channel) ORDER BY id DESC LIMIT \(limit)
                """, AuditColumns.record)
        }
        return try await rows("read the audit trail", """
            SELECT \(unescaped: AuditColumns.list) FROM audit ORDER BY id DESC LIMIT \(limit)
            """, AuditColumns.record)
    }

    public func pruneAudit(before cutoff: Date, limit: Int) async throws(StoreError) -> Int {
        let logger = logger
        return try await withConnection("prune the audit trail") { connection in
            try await connection.count("""
                DELETE FROM audit WHERE id IN (SELECT id FROM audit WHERE at < \(cutoff.unixMilliseconds) ORDER BY at LIMIT \(Int64(max(0, limit))))
                RETURNING 1
                """, logger: logger)
        }
    }
}
