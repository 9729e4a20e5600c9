import APNsSimulatorEmbedding
import Audio
import ChannelProtocol
import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import ImpairmentKit
import JitterBuffer
import enum NIOCore.SocketAddress
import NIOConcurrencyHelpers
import Opus
import PTTClient
import SquelchTesting
import Testing
import Wire
import WireTesting
import X509

/// Leaves the server could not hear at the time (suspended, or the network gone): delivered on a
/// connection of their own, kept on disk across a restart, withdrawn by a rejoin.
@Suite(.serialized, .timeLimit(.minutes(2))) struct OwedLeaveTests {
    func manager(_ fixture: ClientFixture, _ name: String, _ delegate: RecordingDelegate) async throws -> ChannelManager {
        try await ChannelManager.channelManager(delegate: delegate, restorationDelegate: delegate,
                                                configuration: ChannelManagerConfiguration(stateDirectory: fixture.stateDirectory(name)))
    }

    /// Ann (through `port`, a proxy's, when given) and Bob joined; then Ann suspends, and Bob sees
    /// her connection gone.
    struct Pair {
        let ann: ChannelManager, bob: ChannelManager
        let annDelegate: RecordingDelegate
        let annEvents: EventLog
        let credentials: ChannelCredentials
    }

    func suspendedAnnAndBob(_ fixture: ClientFixture, _ name: String, port: Int? = nil) async throws -> Pair {
        let id = fixture.channel.id
        let annDelegate = RecordingDelegate(), bobDelegate = RecordingDelegate()
        let ann = try await manager(fixture, name + "-ann", annDelegate)
        let bob = try await manager(fixture, name + "-bob", bobDelegate)
        let annEvents = EventLog(ann)
        var credentials = fixture.credentials(try await fixture.token("ann"))
        if let port { credentials.port = port }
        ann.requestJoinChannel(channelUUID: id, descriptor: ChannelDescriptor(name: "Ops"), credentials: credentials)
        bob.requestJoinChannel(channelUUID: id, descriptor: ChannelDescriptor(name: "Ops"), credentials: fixture.credentials(try await fixture.token("bob")))
        #expect(await annDelegate.wait(for: .didJoin(.developerRequest)))
        #expect(await bobDelegate.wait(for: .didJoin(.developerRequest)))
        ann.suspend()
        // Suspending closes the connection on purpose: offline at once, not reconnecting first.
        #expect(await eventually { bob.roster.first { $0.userID == "ann" }?.connection == .offline })
        return Pair(ann: ann, bob: bob, annDelegate: annDelegate, annEvents: annEvents, credentials: credentials)
    }

    /// Leaving while suspended (Apple's usual case: the user leaves from the system UI with the app in
    /// the background) used to send nothing: the server kept the member, in everyone's roster and
    /// woken by push, for good. The leave now goes on a connection of its own.
    @Test func aLeaveWhileSuspendedReachesTheServer() async throws {
        let fixture = try await ClientFixture(pushes: false)
        let id = fixture.channel.id
        let p = try await suspendedAnnAndBob(fixture, "owed")
        p.ann.leaveChannel(channelUUID: id)
        #expect(await p.annDelegate.wait(for: .didLeave(.developerRequest)))
        #expect(p.ann.activeChannelUUID == nil, "the app is out of the channel at once, as on iOS")
        #expect(await eventually(seconds: 10) { !p.bob.roster.contains { $0.userID == "ann" } },
                "the server heard the leave: Ann is out of Bob's roster, not an offline member")
        #expect(await eventually { p.annEvents.all.contains(.leaveSettled(id, .delivered)) && p.ann.owedLeaves.isEmpty })
        #expect(!FileManager.default.fileExists(atPath: RestorationStore(directory: p.ann.stateDirectory).owedLeavesPath))
        await p.ann.invalidate()
        await p.bob.invalidate()
        await fixture.stop()
    }

    /// Ann and Bob as `suspendedAnnAndBob` has them, Ann behind a proxy that then drops everything
    /// for `outage`, during which she leaves: the leave the server can't hear yet.
    func annLeavesCutOff(_ fixture: ClientFixture, _ name: String,
                         for outage: Duration) async throws -> (Pair, ImpairmentProxy) {
        let (proxy, port) = try await fixture.proxy()
        let p = try await suspendedAnnAndBob(fixture, name, port: port)
        await proxy.blackhole(for: outage)
        p.ann.leaveChannel(channelUUID: fixture.channel.id)
        #expect(await p.annDelegate.wait(for: .didLeave(.developerRequest)))
        return (p, proxy)
    }

    /// A leave while the server can't be reached is kept on disk and delivered at the app's next start.
    @Test func aLeaveTheServerCouldNotHearIsDeliveredAtTheNextStart() async throws {
        let fixture = try await ClientFixture(pushes: false)
        let id = fixture.channel.id
        // Ann's network is gone while she leaves, and her app stops before it comes back.
        let (p, proxy) = try await annLeavesCutOff(fixture, "later", for: .seconds(3))
        try await Task.sleep(for: .milliseconds(500))
        #expect(p.ann.owedLeaves == [id])
        await p.ann.invalidate()
        let owed = try RestorationStore(directory: fixture.stateDirectory("later-ann")).loadOwedLeaves()
        #expect(owed.map(\.channel) == [id] && owed.first?.credentials == p.credentials, "kept on disk for the next start")
        #expect(p.bob.roster.contains { $0.userID == "ann" }, "the server has not heard it")

        try await Task.sleep(for: .seconds(3))
        let again = try await manager(fixture, "later-ann", p.annDelegate)
        let againEvents = EventLog(again)
        #expect(again.activeChannelUUID == nil, "the channel itself is not restored")
        #expect(await eventually(seconds: 10) { !p.bob.roster.contains { $0.userID == "ann" } }, "delivered after the restart")
        #expect(await eventually { againEvents.all.contains(.leaveSettled(id, .delivered)) && again.owedLeaves.isEmpty })
        #expect(try RestorationStore(directory: fixture.stateDirectory("later-ann")).loadOwedLeaves().isEmpty)
        await again.invalidate()
        await p.bob.invalidate()
        await proxy.stop()
        await fixture.stop()
    }

    /// Joining the channel again before an owed leave got through withdraws the leave: delivered
    /// later, it would end the new membership.
    @Test func joiningAgainWithdrawsAnOwedLeave() async throws {
        let fixture = try await ClientFixture(pushes: false)
        let id = fixture.channel.id
        let (p, proxy) = try await annLeavesCutOff(fixture, "rejoin", for: .seconds(2))
        #expect(p.ann.owedLeaves == [id])
        // Back in the channel directly (not through the dead network) before the leave got through.
        p.ann.requestJoinChannel(channelUUID: id, descriptor: ChannelDescriptor(name: "Ops"), credentials: fixture.credentials(p.credentials.token))
        #expect(await p.annDelegate.wait(for: .didJoin(.developerRequest), count: 2))
        #expect(await eventually { p.annEvents.all.contains(.leaveSettled(id, .superseded)) })
        #expect(p.ann.owedLeaves.isEmpty)
        // Well after the network is back, Ann is still a connected member.
        try await Task.sleep(for: .seconds(3))
        #expect(p.bob.roster.first { $0.userID == "ann" }?.connection == .connected)
        #expect(p.ann.activeChannelUUID == id && p.ann.serviceStatus == .ready)
        #expect(try RestorationStore(directory: p.ann.stateDirectory).loadOwedLeaves().isEmpty)
        await p.ann.invalidate()
        await p.bob.invalidate()
        await proxy.stop()
        await fixture.stop()
    }
}
