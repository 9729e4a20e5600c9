import ChannelProtocol
import Foundation

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

    /// A revocation as it is stored (`member` and `token` make new ones).
    public init(sequence: Int64, channelID: UUID, userID: String?, tokenID: String?, revokedAt: Date, expiresAt: Date?,
                reason: String) {
        self.sequence = sequence
        self.channelID = channelID
        self.userID = userID
        self.tokenID = tokenID
        self.revokedAt = revokedAt
        self.expiresAt = expiresAt
        self.reason = reason
    }

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
