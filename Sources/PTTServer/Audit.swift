import ChannelStore
import Foundation
import ParticipantClaims
import ParticipantTokens

extension AuditRecord {
    /// What the audit trail keeps of an issued token: its id and terms, never the token itself.
    public static func tokenDetails(_ claims: ParticipantClaims) -> [String: String] {
        var details = ["token_id": claims.tokenID,
                       "capabilities": claims.capabilities.map(\.rawValue).sorted().joined(separator: ","),
                       "priority": "\(claims.priority)", "expires_at": claims.expiresAt.formatted(.iso8601)]
        if let role = claims.role { details["role"] = role }
        return details
    }

    /// What the audit trail keeps of a revocation: the token's id and the reason that stands. A
    /// repeated one keeps the first revocation's reason, so the reason this request gave is kept
    /// beside it when it differs: the trail says what each administrator asked for.
    public static func revocationDetails(_ stored: RevocationRecord, requestedReason: String) -> [String: String] {
        var details = ["token_id": stored.tokenID ?? "-", "reason": stored.reason]
        if requestedReason != stored.reason { details["requested_reason"] = requestedReason }
        return details
    }

    /// Who runs this process, for the records of `squelchd` commands: `user@host`. The login name
    /// from the password database (not `$USER`, which `sudo` and scripts leave stale); the numeric
    /// id when the user has no entry (a container's arbitrary uid).
    public static var localActor: String {
        let uid = geteuid()
        var name = "uid \(uid)"
        var entry = passwd()
        var result: UnsafeMutablePointer<passwd>?
        var buffer = [CChar](repeating: 0, count: 4_096)
        // `pw_name` points into `buffer`: it is read while the buffer's pointer is still valid.
        buffer.withUnsafeMutableBufferPointer { storage in
            if let base = storage.baseAddress, getpwuid_r(uid, &entry, base, storage.count, &result) == 0,
               let found = result?.pointee.pw_name {
                name = String(cString: found)
            }
        }
        return "\(name)@\(ProcessInfo.processInfo.hostName)"
    }
}
