import ChannelProtocol
import Foundation

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
