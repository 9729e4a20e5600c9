/// Where each channel lives in a cluster of squelchd nodes sharing one PostgreSQL database, as pure
/// decisions: the database adapter runs each one inside a single transaction (the placement row read
/// `FOR UPDATE`, the `nodes` rows and `now()` read in it), writes what comes back, and commits. The
/// row lock serialises deciders, so two concurrent first joins cannot pick two homes.
///
/// The rules that keep one home per channel:
/// - a channel changes hands only once its lease has expired by the database's clock, or when its
///   home itself gives it up (`handOver`, `release`), having stopped serving first;
/// - every change of hands, and every time a node takes a channel afresh, bumps the epoch;
/// - a lease expiry never moves earlier, except when its home releases it.
/// The node side of the bargain, stopping before the database could give the channel away, is
/// `LeaseKeeper`'s.
public struct PlacementPolicy: Sendable, Equatable {
    /// How long a placement lasts without renewal (database clock). Homes renew every second or so;
    /// after a home dies its channels wait this long before another node may take them.
    public var lease: Duration
    /// A node whose heartbeat is older than this (database clock) is not live: it is not chosen as a
    /// home, and joins for its channels are not redirected to it.
    public var heartbeatStaleness: Duration

    public init(lease: Duration = .seconds(5), heartbeatStaleness: Duration = .seconds(3)) {
        precondition(lease > .zero && heartbeatStaleness > .zero, "lease and staleness must be positive")
        self.lease = lease
        self.heartbeatStaleness = heartbeatStaleness
    }

    /// Live by the database's clock only. A heartbeat "in the future" (an earlier transaction's
    /// `now()` is later than this one's when transactions overlap) counts as live.
    public func isLive(_ node: NodeRow, at dbNow: DatabaseInstant) -> Bool {
        dbNow - node.heartbeat < heartbeatStaleness
    }

    /// The nodes that may become a home: live and serving, minus `excluded`, sorted by id so that the
    /// choice depends on the generator only, not on the order the database returned the rows in.
    public func candidates(_ nodes: [NodeRow], at dbNow: DatabaseInstant, excluding excluded: NodeID? = nil) -> [NodeRow] {
        nodes.filter { $0.state == .serving && $0.id != excluded && isLive($0, at: dbNow) }
            .sorted { $0.id < $1.id }
    }

    /// "Power of two choices": two distinct candidates at random, the less loaded wins (the first
    /// drawn on a tie). Near the balance of always taking the least loaded, without every concurrent
    /// decider piling onto the same node between two heartbeats.
    public func chooseHome<R: RandomNumberGenerator>(
        among nodes: [NodeRow], at dbNow: DatabaseInstant, excluding excluded: NodeID? = nil, random: inout R
    ) -> NodeRow? {
        let pool = candidates(nodes, at: dbNow, excluding: excluded)
        switch pool.count {
        case 0: return nil
        case 1: return pool[0]
        default:
            let first = Int.random(in: 0..<pool.count, using: &random)
            var second = Int.random(in: 0..<(pool.count - 1), using: &random)
            if second >= first { second += 1 }
            return pool[second].load < pool[first].load ? pool[second] : pool[first]
        }
    }

    /// A fresh placement of `channel` on `home`: the next epoch, a full lease from now, and never an
    /// expiry earlier than the row already had (transactions' `now()` can run backwards relative to
    /// the order they take the row lock in).
    func placement<Channel>(_ channel: Channel, on home: NodeID, after previous: PlacementRow<Channel>?, dbNow: DatabaseInstant) -> PlacementRow<Channel> {
        PlacementRow(channel: channel, home: home, epoch: previous?.epoch.next ?? .first,
                     leaseExpiry: extendedExpiry(previous, dbNow: dbNow))
    }

    func extendedExpiry<Channel>(_ row: PlacementRow<Channel>?, dbNow: DatabaseInstant) -> DatabaseInstant {
        max(dbNow + lease, row?.leaseExpiry ?? dbNow)
    }
}
