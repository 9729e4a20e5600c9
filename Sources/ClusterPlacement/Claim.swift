/// What a join arriving at a node leads to.
public enum ClaimDecision<Channel: Hashable & Sendable>: Hashable, Sendable {
    /// Another live node holds the channel: redirect the client to its address, with this epoch.
    /// Nothing to write. Its home is never the requester.
    case existing(PlacementRow<Channel>)
    /// Write this row (insert, or update `previous`). If its home is the requester, the requester now
    /// holds the channel (`LeaseKeeper.acquired` with the time it began the transaction); otherwise
    /// redirect the client to the new home, which takes it up when the client arrives.
    case moved(PlacementRow<Channel>, previous: PlacementRow<Channel>?)
    /// The home stopped heartbeating (or is the requester itself, draining or silent) but its lease
    /// runs until `leaseExpiry`: it may be serving, so nobody may take the channel before then.
    /// Nothing to write; tell the client to try again after `leaseExpiry - dbNow`.
    case awaitingExpiry(PlacementRow<Channel>)
    /// No live serving node could take the channel. Nothing to write.
    case noNodeAvailable
}

extension PlacementPolicy {
    /// Decides a join for `channel` arriving at `requester`, given its placement row read `FOR UPDATE`
    /// (nil: none yet) and the `nodes` rows.
    ///
    /// A live home whose lease runs keeps the channel, even while draining: it hands its channels
    /// over itself (`handOver`) once it has stopped serving them, and nothing done here could stop it
    /// first. A home gone silent keeps it too until its lease expires: it may only be paused, and
    /// would resume believing its lease.
    ///
    /// A row that names the requester itself is one it doesn't know it holds (another node chose it,
    /// it restarted, it fenced itself), or one it took back since it asked: it takes it up under a new
    /// epoch with a full lease, so that no earlier incarnation's writes pass and the lease it counts
    /// from its own send time is the database's. A draining or silent requester cannot take it up,
    /// and cannot give it away either (it may hold it by now): it waits for the expiry like anyone.
    public func claim<Channel, R: RandomNumberGenerator>(
        _ channel: Channel, current: PlacementRow<Channel>?, nodes: [NodeRow], requester: NodeID,
        dbNow: DatabaseInstant, random: inout R
    ) -> ClaimDecision<Channel> {
        precondition(current.map { $0.channel == channel } ?? true, "placement row of another channel")
        if let row = current, !row.isExpired(at: dbNow) {
            if row.home != requester {
                let homeIsLive = nodes.contains { $0.id == row.home && isLive($0, at: dbNow) }
                return homeIsLive ? .existing(row) : .awaitingExpiry(row)
            }
            let requesterMayServe = nodes.contains { $0.id == requester && $0.state == .serving && isLive($0, at: dbNow) }
            guard requesterMayServe else { return .awaitingExpiry(row) }
            return .moved(placement(channel, on: requester, after: row, dbNow: dbNow), previous: row)
        }
        // Free: no row, or its lease expired (its home stopped believing it before then).
        guard let home = chooseHome(among: nodes, at: dbNow, random: &random) else { return .noNodeAvailable }
        return .moved(placement(channel, on: home.id, after: current, dbNow: dbNow), previous: current)
    }
}
