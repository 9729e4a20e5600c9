import Audio
import ChannelProtocol
import ChannelStore
import ChannelStorePostgres
import ClusterPlacement
import DevicePush
import Foundation
import ParticipantClaims
import ParticipantTokens
import PostgresTesting
import PTTClient
import PTTServer
import ServerTesting
import SquelchTesting
import Testing
import WireTesting

/// Three squelchd nodes in this process on one private PostgreSQL: each channel has one home, and
/// PTTClient reaches it from whichever node it was given.
final class ClusterFixture: Sendable {
    let pki: TestPKI
    let directory: String
    let caPath: String
    let channel = ChannelRecord(name: "Ops", maxBurstSeconds: 60)
    let store: PostgresChannelStore
    let nodes: [(task: Task<Void, any Error>, listening: SquelchServer.Listening, id: String)]

    init(nodes count: Int = 3, lease: Double = 5) async throws {
        pki = try TestPKI()
        directory = FileManager.default.temporaryDirectory.appendingPathComponent("cluster-test-\(UUID())").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        caPath = directory + "/ca.pem"
        try pki.ca.serializeAsPEM().pemString.write(toFile: caPath, atomically: true, encoding: .utf8)
        let location = try await PostgresTestServer.shared.makeDatabase()
        store = try await PostgresChannelStore.open(location)
        try await store.createChannel(channel)
        var started: [(task: Task<Void, any Error>, listening: SquelchServer.Listening, id: String)] = []
        for index in 0 ..< count {
            var configuration = TestServer.configuration(dataDirectory: directory + "/node-\(index)")
            configuration.database = location.url
            configuration.nodeID = "node-\(index)"
            configuration.leaseSeconds = lease
            // As a real node serves it, so a device finds it at the node its voice connection is on.
            configuration.devicePushPort = "voice"
            let (task, listening) = try await TestServer.start(configuration, identity: try pki.identity())
            started.append((task, listening, "node-\(index)"))
        }
        nodes = started
    }

    func stop() async {
        for node in nodes { node.task.cancel() }
        for node in nodes { _ = await node.task.result }
        try? await store.close()
        try? FileManager.default.removeItem(atPath: directory)
    }

    func token(_ user: String) async throws -> String {
        let authority = try #require(try await SharedSecrets.storedTokenAuthority(store: store))
        return try await authority.issue(ParticipantClaims(userID: user, name: user.capitalized, channel: channel.id,
                                                           capabilities: [.talk, .listen], expiresAt: Date().addingTimeInterval(3600)))
    }

    func credentials(_ token: String, node: Int) -> ChannelCredentials {
        ChannelCredentials(host: "127.0.0.1", port: nodes[node].listening.voicePort, serverName: "localhost", caPath: caPath, token: token)
    }

    /// The node index the channel's placement names now, if any.
    func home() async throws -> Int? {
        let view = try await store.clusterView()
        guard let row = view.placements.first(where: { $0.channel == channel.id }) else { return nil }
        return nodes.firstIndex { $0.id == row.home.rawValue }
    }

    func manager(_ name: String, _ delegate: RecordingDelegate, audio: AudioConfiguration = .none,
                 push: (any PushTransport)? = nil) async throws -> ChannelManager {
        try await ChannelManager.channelManager(
            delegate: delegate, restorationDelegate: delegate,
            configuration: ChannelManagerConfiguration(stateDirectory: directory + "/state-\(name)", pushTransport: push, audio: audio))
    }
}

@Suite struct ClusterTests {
    @Test(.timeLimit(.minutes(1))) func aJoinOnAnotherNodeIsRedirectedAndHearsTheHome() async throws {
        let cluster = try await ClusterFixture()
        let annDelegate = RecordingDelegate(), bobDelegate = RecordingDelegate()
        let samples = TestSignal.speechLike(seconds: 1.0)
        var speech = AudioConfiguration(makeInput: { WAVFileSource(pipelineSamples: samples, pacer: RealTimePacer()) })
        speech.endTransmissionWhenInputEnds = true
        let ann = try await cluster.manager("ann", annDelegate, audio: speech)
        let heard = cluster.directory + "/bob.wav"
        let bob = try await cluster.manager("bob", bobDelegate, audio: AudioConfiguration(makeOutput: { try WAVFileSink(path: heard, pacer: RealTimePacer()) }))
        let bobEvents = EventLog(bob)
        let id = cluster.channel.id
        ann.requestJoinChannel(channelUUID: id, descriptor: ChannelDescriptor(name: "Ops"), credentials: cluster.credentials(try await cluster.token("ann"), node: 0))
        #expect(await annDelegate.wait(for: .didJoin(.developerRequest)))
        let home = try #require(try await cluster.home())
        // Bob is given a node that is not the channel's home.
        let entry = (home + 1) % cluster.nodes.count
        bob.requestJoinChannel(channelUUID: id, descriptor: ChannelDescriptor(name: "Ops"), credentials: cluster.credentials(try await cluster.token("bob"), node: entry))
        #expect(await bobDelegate.wait(for: .didJoin(.developerRequest)))
        #expect(bobDelegate.all.filter { if case .failedToJoin = $0 { true } else { false } }.isEmpty, "no failure reached the app")
        let homes = bobEvents.all.compactMap { if case .homeNode(let node?) = $0 { node } else { nil } }
        #expect(homes.map(\.node) == [cluster.nodes[home].id], "\(bobEvents.all)")
        #expect(await eventually { bob.roster.map(\.userID).sorted() == ["ann", "bob"] }, "one roster, at the home")

        ann.requestBeginTransmitting(channelUUID: id)
        #expect(await annDelegate.wait(for: .didEnd(.developerRequest)), "the 1 s input ended the burst")
        #expect(await eventually { !bobEvents.finishedBursts.isEmpty }, "bob heard the burst through the home: \(bobEvents.all.suffix(8))")
        let burst = try #require(bobEvents.finishedBursts.first)
        #expect(burst.played > 25, "\(burst)")
        await ann.invalidate()
        await bob.invalidate()
        await cluster.stop()
    }

    /// A Linux device given a node that is not the channel's home takes its pushes from the home,
    /// where its voice connection was redirected and where the wakes go out from.
    @Test(.timeLimit(.minutes(1))) func aDeviceRedirectedToTheHomeIsWokenFromIt() async throws {
        try await asleepDeviceIsWoken(transport: { _, _, _ in DevicePushTransport() }, joinAt: { _, other in other })
    }

    /// A device whose stream is on a node that is not the channel's home (here pinned there; in the
    /// field, a home that moved while it slept) is woken all the same: the home passes the push on
    /// through the cluster's database.
    @Test(.timeLimit(.minutes(1))) func aPushFindsADeviceWhoseStreamIsOnAnotherNode() async throws {
        try await asleepDeviceIsWoken(transport: { cluster, _, other in
            let port: Int = try #require(cluster.nodes[other].listening.devicePushPort)
            return DevicePushTransport(port: port)
        }, joinAt: { home, _ in home })
    }

    /// Two nodes; Ann joins at the first and talks once Bob, a device with `transport` (made knowing
    /// the home and the other node) joined at `joinAt`, is asleep: Bob must be woken by push.
    func asleepDeviceIsWoken(transport: (ClusterFixture, _ home: Int, _ other: Int) throws -> DevicePushTransport,
                             joinAt: (_ home: Int, _ other: Int) -> Int) async throws {
        let cluster = try await ClusterFixture(nodes: 2)
        let annDelegate = RecordingDelegate(), bobDelegate = RecordingDelegate()
        let samples = TestSignal.speechLike(seconds: 1.0)
        var speech = AudioConfiguration(makeInput: { WAVFileSource(pipelineSamples: samples, pacer: RealTimePacer()) })
        speech.endTransmissionWhenInputEnds = true
        let ann = try await cluster.manager("ann", annDelegate, audio: speech)
        let id = cluster.channel.id
        ann.requestJoinChannel(channelUUID: id, descriptor: ChannelDescriptor(name: "Ops"), credentials: cluster.credentials(try await cluster.token("ann"), node: 0))
        #expect(await annDelegate.wait(for: .didJoin(.developerRequest)))
        let home = try #require(try await cluster.home())
        let other = (home + 1) % cluster.nodes.count
        let bob = try await cluster.manager("bob", bobDelegate, push: try transport(cluster, home, other))
        bob.requestJoinChannel(channelUUID: id, descriptor: ChannelDescriptor(name: "Ops"),
                               credentials: cluster.credentials(try await cluster.token("bob"), node: joinAt(home, other)))
        #expect(await bobDelegate.wait(for: .pushToken(32)), "\(bobDelegate.all)")
        try await Task.sleep(for: .milliseconds(300))
        bob.suspend()
        #expect(await eventually { ann.roster.first { $0.userID == "bob" }?.connection != .connected })

        ann.requestBeginTransmitting(channelUUID: id)
        #expect(await bobDelegate.wait(for: .push("Ann")), "woken by push: \(bobDelegate.all)")
        await ann.invalidate()
        await bob.invalidate()
        await cluster.stop()
    }
}
