import ChannelProtocol
import Foundation

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
