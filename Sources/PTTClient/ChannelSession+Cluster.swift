import ChannelProtocol

/// A squelchd cluster: following the channel's home (`redirect`, `move`), and giving up on a home that
/// stopped answering. None of it reaches the app as a failure: the channel shows `connecting` while
/// the session goes to the home, and the app hears which node serves it (`homeNode`).
extension ChannelSession {
    /// The join reached a node that is not the channel's home.
    mutating func redirected(to home: NodeAddress, pass: HomePass?) {
        guard channel != nil, link == .joining else { return }
        switch route.redirected(to: home, pass: pass) {
        case .follow(let next):
            goToHome(next)
        case .refuse(let why):
            // Nodes that keep sending the join on cannot be joined through; as a refusal would.
            route.homeLost()
            refused(.serverBusy, why)
        }
    }

    /// The channel's home moved while the session was on (its node drains, or lost the channel).
    mutating func moved(to home: NodeAddress) {
        guard channel != nil, link == .joined || link == .joining else { return }
        switch route.moved(to: home) {
        case .follow(let next):
            lostConnection()
            goToHome(next)
        case .refuse(let why):
            outputs.append(.event(.notice(why)))
        }
    }

    private mutating func goToHome(_ home: NodeAddress) {
        outputs.append(.event(.homeNode(home)))
        link = .down
        connect()
    }

    /// The home stopped answering: in a cluster its channels go to another node once its lease runs
    /// out, and the entry point knows which. Waiting for this connection's liveness verdict (20 s)
    /// would miss every burst until then. True when the session went to the entry point.
    mutating func leaveSilentHome() -> Bool {
        guard route.inCluster, link == .joined || link == .joining else { return false }
        route.homeLost()
        lostConnection()
        outputs.append(.event(.homeNode(nil)))
        outputs.append(.event(.notice("the node serving this channel stopped answering; rejoining through the cluster's entry point")))
        link = .down
        connect()
        return true
    }
}
