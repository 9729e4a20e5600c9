import ChannelProtocol

/// A member as an operator sees it (`GET /v1/channels/:id/roster`): its roster entry, flattened into
/// the same JSON object, and what only the server knows of it.
public struct LiveMember: Codable, Sendable, Equatable {
    public var participant: RosterMember
    /// The share of the audio (percent) the member last reported missing on its way in, this session:
    /// a dispatcher's lead to a bad radio link. Nil while it is not connected or may not listen; 0 as
    /// well when it has reported nothing (clients report a move of 2 points, older ones never).
    public var receptionLoss: Int?
    /// Its place in the floor queue (1 is next), while it waits to talk: who is kept waiting, and
    /// behind whom, is a dispatcher's question too.
    public var queuePosition: Int?

    public init(participant: RosterMember, receptionLoss: Int? = nil, queuePosition: Int? = nil) {
        self.participant = participant
        self.receptionLoss = receptionLoss
        self.queuePosition = queuePosition
    }

    private enum Keys: String, CodingKey { case receptionLoss, queuePosition }

    public init(from decoder: any Decoder) throws {
        participant = try RosterMember(from: decoder)
        let container = try decoder.container(keyedBy: Keys.self)
        receptionLoss = try container.decodeIfPresent(Int.self, forKey: .receptionLoss)
        queuePosition = try container.decodeIfPresent(Int.self, forKey: .queuePosition)
    }

    public func encode(to encoder: any Encoder) throws {
        try participant.encode(to: encoder)
        var container = encoder.container(keyedBy: Keys.self)
        try container.encodeIfPresent(receptionLoss, forKey: .receptionLoss)
        try container.encodeIfPresent(queuePosition, forKey: .queuePosition)
    }
}
