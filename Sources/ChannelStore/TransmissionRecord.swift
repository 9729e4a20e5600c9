import ChannelProtocol
import Foundation

/// One talk burst, for the transmission log.
public struct TransmissionRecord: Codable, Sendable, Equatable {
    public var channelID: UUID
    public var userID: String
    public var startedAt: Date
    public var durationMilliseconds: Int
    /// Why it ended: "released", "preempted", "maxBurst", "disconnected", "silent", "channelDeleted", …;
    /// `inProgress` while it goes on, and `interrupted` for one the server never ended (it was killed).
    public var endReason: String

    /// The end reason of a burst still going: written at its start, so that a crash does not erase it
    /// from the log; its end replaces it.
    public static let inProgress = "inProgress"
    /// The end reason a server starting gives the bursts its predecessor left `inProgress`: it died
    /// during them (kill -9, power), and how long they went on is not known (duration 0).
    public static let interrupted = "interrupted"

    public init(channelID: UUID, userID: String, startedAt: Date, durationMilliseconds: Int, endReason: String) {
        self.channelID = channelID
        self.userID = userID
        self.startedAt = startedAt
        self.durationMilliseconds = durationMilliseconds
        self.endReason = endReason
    }
}
