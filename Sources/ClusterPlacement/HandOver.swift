/// The outcome of a draining node's handing over one of its channels.
public enum HandOverDecision<Channel: Hashable & Sendable>: Hashable, Sendable {
    /// Write this row and send the channel's clients to the new home (address from its `nodes` row).
    case moved(PlacementRow<Channel>, previous: PlacementRow<Channel>)
    /// No other live serving node. The row written here gives the channel back to the draining node
    /// under a new epoch with a full lease; it may serve again (`LeaseKeeper.acquired` with the time
    /// it began this transaction) or leave it to lapse.
    case noNodeAvailable(kept: PlacementRow<Channel>)
    /// The row no longer names the node at that epoch (or is gone): nothing to write or hand over.
    case notHeld(PlacementRow<Channel>?)
}

extension PlacementPolicy {
    /// Hands `channel` from `from` (draining, holding it under `epoch`) to another live serving node,
    /// chosen like a new home, under the next epoch.
    ///
    /// `from` must have stopped serving the channel before it began the transaction
    /// (`LeaseKeeper.release`): the new home starts as soon as a client reaches it, which may be
    /// before `from` hears the outcome. The lease needn't be live: a lapsed row still naming `from`
    /// at its epoch has not been taken by anyone.
    public func handOver<Channel, R: RandomNumberGenerator>(
        _ channel: Channel, current: PlacementRow<Channel>?, nodes: [NodeRow], from: NodeID, epoch: Epoch,
        dbNow: DatabaseInstant, random: inout R
    ) -> HandOverDecision<Channel> {
        precondition(current.map { $0.channel == channel } ?? true, "placement row of another channel")
        guard let row = current, row.home == from, row.epoch == epoch else { return .notHeld(current) }
        guard let home = chooseHome(among: nodes, at: dbNow, excluding: from, random: &random) else {
            return .noNodeAvailable(kept: placement(channel, on: from, after: row, dbNow: dbNow))
        }
        return .moved(placement(channel, on: home.id, after: row, dbNow: dbNow), previous: row)
    }

    /// Ends `node`'s lease on a channel it has stopped serving (emptied, or given up while draining)
    /// so the next join may place it at once. Returns the row to write, or nil if the row no longer
    /// names `node` at `epoch` (nothing to do). The row stays, epoch and all: see `PlacementRow`.
    public func release<Channel>(
        _ channel: Channel, current: PlacementRow<Channel>?, node: NodeID, epoch: Epoch, dbNow: DatabaseInstant
    ) -> PlacementRow<Channel>? {
        guard var row = current, row.channel == channel, row.home == node, row.epoch == epoch else { return nil }
        row.leaseExpiry = min(row.leaseExpiry, dbNow)
        return row
    }
}
