import ArgumentParser
import ChannelStore
import Foundation
import PTTServer

/// `squelchd audit`: the audit trail, newest first: every change made through the admin API or the
/// `squelchd channel` and `token` commands (`AuditRecord`), as `GET /v1/audit` shows it.
struct Audit: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Show who changed channels and tokens, and when (newest first).",
        discussion: """
            Lists the changes made through the admin API (source api) and the squelchd channel and token commands \
            (source cli, with the user and host that ran them), as GET /v1/audit does. squelchd serve deletes records \
            older than --audit-days (default 365).
            """)

    @Option(help: "Only this channel's records (a channel UUID; a deleted channel's records are kept).") var channel: String?
    @Option(parsing: .unconditional, help: "How many records, newest first (1-\(AdminAPI.maxTransmissionLimit)).") var limit = AdminAPI.defaultTransmissionLimit
    @Flag(help: "Print JSON instead of a table.") var json = false
    @OptionGroup var store: Channel.StoreOptions

    func run() async throws {
        guard (1...AdminAPI.maxTransmissionLimit).contains(limit) else {
            throw ValidationError("--limit must be 1-\(AdminAPI.maxTransmissionLimit), not \(limit)")
        }
        let channelID = try channel.map(parseChannelID)
        let count = limit
        let trail = try await store.withStore { db throws(StoreError) in try await db.auditRecords(channel: channelID, limit: count) }
        if json { return try printJSON(trail) }
        guard !trail.isEmpty else {
            print(channelID == nil ? "no changes recorded yet" : "no changes recorded for channel \(channelID!.uuidString)")
            return
        }
        print(table(["TIME", "SOURCE", "BY", "ACTION", "CHANNEL", "USER", "DETAILS"], trail.map { record in
            [record.at.formatted(.iso8601), record.source, record.actor ?? "-", record.action,
             record.channelID?.uuidString ?? "-", record.userID ?? "-",
             record.details.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: " ")]
        }))
    }
}
