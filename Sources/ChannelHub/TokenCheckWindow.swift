import ChannelStore
import ParticipantClaims

/// Token checks (joins, renewals) under way, by connection, and the revocations applied while any
/// was. A check reads the store's revocations off the event loop, so a revocation the hub applies
/// before the check's outcome arrives may have been stored after that read: the outcome is checked
/// again against the revocations applied since the check began (`ended`).
///
/// Revocations are numbered in the order the hub applies them. Each check keeps the number reached
/// when the first check on its connection began; the window keeps only the revocations some check
/// under way began before, so it holds the last few seconds' at most, and none once no check is.
struct TokenCheckWindow {
    private struct Check {
        var count: Int
        /// How many revocations the hub had applied when the first check on the connection began.
        let mark: Int
    }

    private var checks: [Link: Check] = [:]
    /// Revocations applied while a check was under way, oldest first.
    private(set) var revocations: [RevocationRecord] = []
    /// How many revocations were applied before the first in `revocations`.
    private var before = 0

    /// No check is under way (so no revocation is held).
    var isEmpty: Bool { checks.isEmpty }

    /// The hub applied `revocation`: held while a check is under way.
    mutating func note(_ revocation: RevocationRecord) {
        if checks.isEmpty {
            before += 1
        } else {
            revocations.append(revocation)
        }
    }

    mutating func started(_ link: Link) {
        let mark = before + revocations.count
        checks[link] = Check(count: (checks[link]?.count ?? 0) + 1, mark: checks[link]?.mark ?? mark)
    }

    /// A check on `link` is over. Returns a revocation applied since it began that voids `claims`.
    mutating func ended(_ link: Link, claims: ParticipantClaims?) -> RevocationRecord? {
        guard let check = checks[link] else { return nil }
        let since = revocations.dropFirst(max(0, check.mark - before))
        let revoked = claims.flatMap { claims in
            since.first { $0.voids(channel: claims.channel, user: claims.userID, tokenID: claims.tokenID, issuedAt: claims.issuedAt) }
        }
        checks[link] = check.count > 1 ? Check(count: check.count - 1, mark: check.mark) : nil
        prune()
        return revoked
    }

    /// The connection closed: its checks' outcomes no longer matter.
    mutating func closed(_ link: Link) {
        if checks.removeValue(forKey: link) != nil { prune() }
    }

    /// Drops the revocations that no check under way began before: all of them once none is.
    private mutating func prune() {
        guard !revocations.isEmpty else { return }
        let oldest = checks.values.lazy.map(\.mark).min() ?? (before + revocations.count)
        let done = min(revocations.count, oldest - before)
        guard done > 0 else { return }
        revocations.removeFirst(done)
        before += done
    }
}
