import ChannelProtocol
import Foundation

/// A storage failure, worded for whoever has to fix it.
public enum StoreError: Error, Sendable, Equatable, CustomStringConvertible {
    /// A value the caller supplied is not acceptable.
    case invalid(String)
    case channelNotFound(UUID)
    case memberNotFound(channel: UUID, user: String)
    /// The database could not be opened or migrated, or a statement failed.
    case database(String)
    /// The database could not take the statement just now, for a reason that passes or that freeing
    /// space mends: another process held its lock too long, the disk is full, an I/O error (other than
    /// data that reads back damaged). The same statement can succeed later, so the server's store
    /// writer keeps such writes and tries them again.
    case unavailable(String)
    /// A write a cluster node made for a channel it no longer holds (another node is its home now,
    /// under a later epoch): refused, so that a node paused past its lease cannot write over the new
    /// home's records. Not retried.
    case fenced(String)

    public var description: String {
        switch self {
        case .invalid(let why): return why
        case .channelNotFound(let id): return "no channel \(id); 'squelchd channel list' shows the channels"
        case .memberNotFound(let channel, let user): return "user '\(user)' is not a member of channel \(channel)"
        case .database(let why): return "database error: \(why)"
        case .unavailable(let why): return "database unavailable: \(why)"
        case .fenced(let why): return "write refused: \(why); this node no longer holds the channel, and its new home keeps the records now"
        }
    }

    /// Whether the same operation can succeed later without anything about it changing.
    public var isTransient: Bool {
        if case .unavailable = self { true } else { false }
    }
}
