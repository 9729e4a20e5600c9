import ChannelProtocol

/// Where the session connects when its server is a cluster: the channel's home node, learned from a
/// `redirect` (at join) or a `move` (during a session), or the entry point the app gave (the
/// credentials' address) when no home is known. A plain value the session consults.
///
/// A join follows at most `maxHops` redirects before it gives up: nodes that keep sending it on
/// disagree about the channel's home (two databases, a node with a stale view), and following them
/// for ever would hide that. A redirect older than the home already known (a lower epoch) is not
/// followed back.
struct ClusterRoute: Sendable, Equatable {
    static let maxHops = 2

    /// The home to connect to; nil: the entry point.
    private(set) var home: NodeAddress?
    /// The home's entry pass from the redirect, for the next connection only (`takePass`).
    private(set) var pass: HomePass?
    /// Redirects followed since the last `joined`.
    private(set) var hops = 0
    /// The server said it is a cluster (a redirect, a move, or the feature in `joined`): a connection
    /// that stalls is taken for a dead home, and the session rejoins through the entry point.
    private(set) var inCluster = false

    enum Verdict: Equatable {
        case follow(NodeAddress)
        /// Past `maxHops`, or older than the home already known.
        case refuse(String)
    }

    /// A `redirect` arrived in answer to `join`.
    mutating func redirected(to next: NodeAddress, pass: HomePass? = nil) -> Verdict {
        inCluster = true
        self.pass = nil
        if let home, next.epoch < home.epoch {
            return .refuse("squelchd sent the join back to \(next), an older home of the channel (epoch \(next.epoch), after \(home.epoch)); its nodes disagree about where the channel is: check that they share one database")
        }
        guard hops < Self.maxHops else {
            return .refuse("squelchd redirected the join \(hops + 1) times (last to \(next)); its nodes disagree about where the channel is: check that they share one database")
        }
        hops += 1
        home = next
        self.pass = pass
        return .follow(next)
    }

    /// A `move` arrived during a session: the channel's home changed (a drain, or a lost lease).
    mutating func moved(to next: NodeAddress) -> Verdict {
        inCluster = true
        if let home, next.epoch < home.epoch { return .refuse("squelchd moved the channel back to an older home (\(next)); ignored") }
        home = next
        hops = 0
        pass = nil
        return .follow(next)
    }

    mutating func joined(features: [ProtocolFeature]) {
        hops = 0
        if features.contains(.cluster) { inCluster = true }
    }

    /// The home stopped answering or the connection failed: the next connection goes to the entry
    /// point, which knows (or decides) the channel's home now.
    mutating func homeLost() {
        home = nil
        pass = nil
    }

    /// The entry pass for the connection about to open; a pass enters once.
    mutating func takePass() -> HomePass? {
        defer { pass = nil }
        return pass
    }

    /// Where to connect: the entry point's credentials, at the home's address if one is known. The
    /// certificate is checked for the address connected to, unless the app named the server's
    /// certificate name itself.
    func credentials(for entry: ChannelCredentials) -> ChannelCredentials {
        guard let home else { return entry }
        var credentials = entry
        credentials.host = home.host
        credentials.port = Int(home.port)
        return credentials
    }
}
