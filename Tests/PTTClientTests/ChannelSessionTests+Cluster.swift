import ChannelProtocol
import Foundation
import Testing
@testable import PTTClient

/// A cluster of squelchd nodes: the session follows the channel's home without telling the app of
/// anything but the node (no failure, no second `didJoin`), within `ClusterRoute.maxHops`.
extension ChannelSessionTests {
    static let nodeB = NodeAddress(node: "b", host: "10.0.0.2", port: 7702, epoch: 4)
    static let nodeC = NodeAddress(node: "c", host: "10.0.0.3", port: 7703, epoch: 5)

    func connections(_ outputs: [SessionOutput]) -> [(ChannelCredentials, Bool)] {
        outputs.compactMap { if case .connect(let c, let cluster, _) = $0 { return (c, cluster) } else { return nil } }
    }

    func passes(_ outputs: [SessionOutput]) -> [HomePass?] {
        outputs.compactMap { if case .connect(_, _, let pass) = $0 { return pass } else { return nil } }
    }

    @Test func aRedirectsEntryPassGoesToTheHomeOnceAndItsJoinIsNotSentAgain() {
        let pass = HomePass(ticket: Data([1, 2, 3]), key: Data(repeating: 7, count: 32))
        var s = ChannelSession()
        s.requestJoin(channelID, descriptor: descriptor, credentials: credentials, reason: .developerRequest)
        s.transportConnected()
        _ = s.takeOutputs()
        s.received(.redirect(home: Self.nodeB, pass: pass))
        #expect(passes(s.takeOutputs()) == [pass])
        // The home took it: it answers the join the pass carries, so none is sent.
        s.transportConnected(entered: true)
        #expect(!sent(s.takeOutputs()).contains { if case .join = $0 { true } else { false } })
        joined(&s)
        #expect(delegateCalls(s.takeOutputs()) == [.didJoin(channelID, .developerRequest)])
        // A later connection (the home lost) brings no pass: a pass enters once.
        s.transportFailed("gone")
        s.reconnectDue()
        #expect(passes(s.takeOutputs()) == [nil])
    }

    @Test func aHomeThatIgnoresThePassGetsTheJoinSent() {
        var s = ChannelSession()
        s.requestJoin(channelID, descriptor: descriptor, credentials: credentials, reason: .developerRequest)
        s.transportConnected()
        _ = s.takeOutputs()
        s.received(.redirect(home: Self.nodeB, pass: HomePass(ticket: Data([1]), key: Data(repeating: 7, count: 32))))
        _ = s.takeOutputs()
        s.transportConnected(entered: false)
        #expect(sent(s.takeOutputs()).contains { if case .join = $0 { true } else { false } })
    }

    func joined(_ s: inout ChannelSession, features: [ProtocolFeature] = []) {
        s.received(.joined(channel: ChannelInfo(id: channelID, name: "Ops", image: nil, mode: .halfDuplex, maxBurstSeconds: 60), you: 1,
                           roster: [participant(1, "Ann")], talkers: [], features: features))
    }

    @Test func aJoinFollowsARedirectToTheHomeWithoutTheAppHearingOfIt() {
        var s = ChannelSession()
        s.requestJoin(channelID, descriptor: descriptor, credentials: credentials, reason: .developerRequest)
        s.transportConnected()
        _ = s.takeOutputs()
        s.received(.redirect(home: Self.nodeB))
        let out = s.takeOutputs()
        let next = connections(out)
        #expect(next.count == 1 && next[0].0.host == "10.0.0.2" && next[0].0.port == 7702 && next[0].1, "\(out)")
        #expect(next.first?.0.token == credentials.token)
        #expect(delegateCalls(out).isEmpty, "no failure and no join yet")
        #expect(out.contains(.event(.homeNode(Self.nodeB))))
        s.transportConnected()
        #expect(sent(s.takeOutputs()).contains { if case .join = $0 { true } else { false } })
        joined(&s)
        #expect(delegateCalls(s.takeOutputs()) == [.didJoin(channelID, .developerRequest)])
        // The record the app restores from keeps the entry point: the home may have moved by then.
        #expect(s.credentials == credentials)
    }

    @Test func aThirdRedirectInARowFailsTheJoinSayingWhy() {
        var s = ChannelSession()
        s.requestJoin(channelID, descriptor: descriptor, credentials: credentials, reason: .developerRequest)
        _ = s.takeOutputs()
        for home in [Self.nodeB, Self.nodeC] {
            s.transportConnected()
            s.received(.redirect(home: home))
            #expect(connections(s.takeOutputs()).count == 1)
        }
        s.transportConnected()
        s.received(.redirect(home: NodeAddress(node: "d", host: "10.0.0.4", port: 7704, epoch: 6)))
        let out = s.takeOutputs()
        #expect(connections(out).isEmpty)
        let failed = delegateCalls(out).compactMap { if case .failedToJoin(_, let e) = $0 { e.message } else { nil } }
        #expect(failed.count == 1 && failed[0].contains("redirected the join 3 times") && failed[0].contains("one database"), "\(failed)")
    }

    @Test func aRedirectBackToAnOlderHomeIsNotFollowed() {
        var s = ChannelSession()
        s.requestJoin(channelID, descriptor: descriptor, credentials: credentials, reason: .developerRequest)
        s.transportConnected()
        s.received(.redirect(home: Self.nodeC))
        s.transportConnected()
        _ = s.takeOutputs()
        s.received(.redirect(home: Self.nodeB))  // epoch 4, after 5
        let out = s.takeOutputs()
        #expect(connections(out).isEmpty)
        #expect(delegateCalls(out).contains { if case .failedToJoin(_, let e) = $0 { e.message.contains("older home") } else { false } })
    }

    @Test func aMoveDuringASessionRejoinsAtTheNewHomeAtOnce() {
        var s = joinedSession()
        _ = s.takeOutputs()
        s.received(.move(home: Self.nodeC))
        var out = s.takeOutputs()
        #expect(connections(out).map(\.0.host) == ["10.0.0.3"])
        #expect(s.serviceStatus == .connecting && delegateCalls(out).isEmpty)
        s.transportConnected()
        joined(&s)
        out = s.takeOutputs()
        #expect(delegateCalls(out).isEmpty, "the app joined once; a move is not a new join")
        #expect(s.serviceStatus == .ready)
    }

    @Test func aSilentHomeInAClusterSendsTheSessionBackToTheEntryPoint() {
        var s = ChannelSession()
        s.requestJoin(channelID, descriptor: descriptor, credentials: credentials, reason: .developerRequest)
        s.transportConnected()
        s.received(.redirect(home: Self.nodeB))
        s.transportConnected()
        joined(&s)
        _ = s.takeOutputs()
        s.transportStalled(true)
        var out = s.takeOutputs()
        #expect(connections(out).map(\.0.host) == [credentials.host], "\(out)")
        #expect(out.contains(.event(.homeNode(nil))))
        // The transport's own retry (a stateless reset, an idle timeout) would also go back to the
        // same node; in a cluster it goes to the entry point too.
        s.transportConnected()
        s.received(.redirect(home: Self.nodeC))
        s.transportConnected()
        joined(&s)
        _ = s.takeOutputs()
        s.transportReconnecting()
        out = s.takeOutputs()
        #expect(connections(out).map(\.0.host) == [credentials.host])
    }

    @Test func aSingleServerStallStaysOnItsConnection() {
        var s = joinedSession()
        _ = s.takeOutputs()
        s.transportStalled(true)
        let out = s.takeOutputs()
        #expect(connections(out).isEmpty && s.serviceStatus == .connecting, "no cluster: wait for the server")
    }

    @Test func aJoinedAnnouncingAClusterMakesAStallGoToTheEntryPoint() {
        var s = ChannelSession()
        s.requestJoin(channelID, descriptor: descriptor, credentials: credentials, reason: .developerRequest)
        s.transportConnected()
        joined(&s, features: [.cluster])
        _ = s.takeOutputs()
        s.transportStalled(true)
        let out = s.takeOutputs()
        #expect(connections(out).map { $0.1 } == [true], "with the cluster's liveness")
    }

    /// A home named by a redirect that does not answer (it died since): back to the entry point, not
    /// a failed join.
    @Test func aRedirectToAHomeThatDoesNotAnswerGoesBackToTheEntryPoint() {
        var s = ChannelSession()
        s.requestJoin(channelID, descriptor: descriptor, credentials: credentials, reason: .developerRequest)
        s.transportConnected()
        s.received(.redirect(home: Self.nodeB))
        _ = s.takeOutputs()
        s.transportFailed("no answer from squelchd at 10.0.0.2:7702")
        let out = s.takeOutputs()
        #expect(connections(out).map(\.0.host) == [credentials.host], "\(out)")
        #expect(delegateCalls(out).isEmpty, "no failure: the entry point decides again")
    }
}
