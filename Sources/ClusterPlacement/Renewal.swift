/// A channel a node thought it held but no longer does, and the row as it stands (nil: no row).
public struct LostLease<Channel: Hashable & Sendable>: Hashable, Sendable {
    public var channel: Channel
    /// The epoch the node held it under.
    public var epoch: Epoch
    public var current: PlacementRow<Channel>?

    public init(channel: Channel, epoch: Epoch, current: PlacementRow<Channel>?) {
        self.channel = channel
        self.epoch = epoch
        self.current = current
    }
}

/// The outcome of one node's renewal round.
public struct RenewalDecision<Channel: Hashable & Sendable>: Hashable, Sendable {
    /// Rows to write back (only their expiry changed). After commit: `LeaseKeeper.renewalSucceeded`.
    public var renewed: [PlacementRow<Channel>]
    /// After commit: `LeaseKeeper.lost` for each.
    public var lost: [LostLease<Channel>]

    public init(renewed: [PlacementRow<Channel>] = [], lost: [LostLease<Channel>] = []) {
        self.renewed = renewed
        self.lost = lost
    }
}

extension PlacementPolicy {
    /// Renews the leases `node` believes it holds, given their rows read `FOR UPDATE` (missing rows
    /// simply absent).
    ///
    /// A lease is renewed only if the row still names `node` at the same epoch and has not expired.
    /// An expired lease is lost even if nobody took it yet: the node has (or will have, by its own
    /// clock) stopped serving it, and the next join takes it up through `claim`, under a new epoch.
    /// Reviving it here would make "expired" mean two things.
    public func renew<Channel>(
        _ held: [HeldLease<Channel>], current rows: [PlacementRow<Channel>], node: NodeID, dbNow: DatabaseInstant
    ) -> RenewalDecision<Channel> {
        var byChannel: [Channel: PlacementRow<Channel>] = [:]
        for row in rows { byChannel[row.channel] = row }
        var decision = RenewalDecision<Channel>()
        for lease in held {
            let row = byChannel[lease.channel]
            if var row, row.home == node, row.epoch == lease.epoch, !row.isExpired(at: dbNow) {
                row.leaseExpiry = extendedExpiry(row, dbNow: dbNow)
                decision.renewed.append(row)
            } else {
                decision.lost.append(LostLease(channel: lease.channel, epoch: lease.epoch, current: row))
            }
        }
        return decision
    }
}
