import ChannelProtocol
import Foundation

/// What `ChannelStore.revokeToken` did.
public enum TokenRevocation: Sendable, Equatable {
    /// Stored (`isNew`), or already revoked and its first revocation returned. `holder`: the member of
    /// the channel that last joined with the token, if any.
    case revoked(RevocationRecord, isNew: Bool, holder: String?)
    /// Nothing stored: by id alone, the token is the one `holder` of that channel last joined with.
    case otherChannel(UUID, holder: String)
}
