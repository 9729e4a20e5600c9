import APNsSimulator
import Foundation
import NIOConcurrencyHelpers
import SquelchTesting
import Testing
@testable import APNs

/// The provider JWT shared by a cluster's nodes. Here the share is kept in memory, standing in for
/// PostgreSQL (whose swap is tested against a real server in ChannelStoreTests); the APNs clients, the
/// simulator and the wire are real.
final class MemoryTokenShare: ProviderTokenShare {
    private struct Stored { var jwt: String; var issuedAt: Date }
    private let state = NIOLockedValueBox<(stored: [String: Stored], swaps: Int, failing: Bool)>(([:], 0, false))
    let clock: ManualDate

    init(clock: ManualDate) { self.clock = clock }

    /// JWTs stored over the share's life: what Apple sees as the team's refreshes.
    var swaps: Int { state.withLockedValue { $0.swaps } }
    func fail(_ failing: Bool) { state.withLockedValue { $0.failing = failing } }

    func current(key: String) async throws -> SharedProviderToken? {
        try state.withLockedValue { state in
            if state.failing { throw ShareDown() }
            return state.stored[key].map { SharedProviderToken(jwt: $0.jwt, age: .seconds(clock.now.timeIntervalSince($0.issuedAt))) }
        }
    }

    func replace(key: String, replacing: String?, with new: String) async throws -> SharedProviderToken {
        try state.withLockedValue { state in
            if state.failing { throw ShareDown() }
            if state.stored[key]?.jwt == replacing {
                state.stored[key] = Stored(jwt: new, issuedAt: clock.now)
                state.swaps += 1
            }
            let stored = state.stored[key]!
            return SharedProviderToken(jwt: stored.jwt, age: .seconds(clock.now.timeIntervalSince(stored.issuedAt)))
        }
    }

    struct ShareDown: Error {}
}

@Suite(.serialized, .timeLimit(.minutes(2))) struct SharedProviderTokenTests {
    /// A simulator on the test's clock, and `nodes` APNs clients (one per node) sharing `share`.
    private func cluster(nodes: Int, poolSize: Int = 2, share: MemoryTokenShare) async throws -> (APNsSimulator, [APNsClient]) {
        let key = try APNsProviderKey.load(p8Path: DevCertificates.p8, keyID: "DEVKEY0001", teamID: "DEVTEAM001")
        var configuration = APNsSimulatorConfiguration(
            certificateChainPath: DevCertificates.simulatorCertificate, privateKeyPath: DevCertificates.simulatorKey,
            providerKeys: [key], allowedTopics: [SimulatorFixture.topic])
        let clock = share.clock
        configuration.now = { clock.now }
        let simulator = try APNsSimulator(configuration: configuration)
        let endpoints = try await simulator.start()
        let identity = try APNsProviderIdentity.load(p8Path: DevCertificates.p8, keyID: "DEVKEY0001", teamID: "DEVTEAM001")
        var clients: [APNsClient] = []
        for _ in 0..<nodes {
            clients.append(try await APNsClient(configuration: APNsConfiguration(
                environment: .custom(host: "127.0.0.1", port: endpoints.port, caPath: DevCertificates.ca), identity: identity,
                topic: SimulatorFixture.topic, poolSize: poolSize, providerTokenShare: share, now: { clock.now })))
        }
        return (simulator, clients)
    }

    private func pushFromEach(_ clients: [APNsClient], count: Int = 6) async {
        for client in clients {
            for index in 0..<count {
                let result = await client.send(notification(String(format: "0b%02x", index)))
                #expect(result.success != nil, "\(String(describing: result.failure))")
            }
        }
    }

    /// Three nodes mint one JWT between them, and one more when it is 50 minutes old: Apple sees one
    /// refresh per 50 minutes for the team, never one per node or per connection.
    @Test func threeNodesMintOneJWTPerFiftyMinutesBetweenThem() async throws {
        let share = MemoryTokenShare(clock: ManualDate())
        let (simulator, clients) = try await cluster(nodes: 3, share: share)
        await pushFromEach(clients)
        #expect(share.swaps == 1)
        share.clock.advance(30 * 60)
        await pushFromEach(clients)
        #expect(share.swaps == 1, "not due at 30 minutes")
        share.clock.advance(21 * 60)
        await pushFromEach(clients)
        #expect(share.swaps == 2, "due at 50 minutes, minted once for all three nodes")
        #expect(simulator.stats().rejected == 0, "\(simulator.rejections())")
        for client in clients { await client.shutdown() }
        try? await simulator.stop()
    }

    /// APNs lets a connection change its JWT only 20 minutes after it first sent the previous one. A
    /// connection opened 45 minutes into the shared JWT's life keeps it past the cluster's refresh, and
    /// when it would be too old to send it gives way to a new connection, which may start with any.
    @Test func aConnectionTooYoungToChangeItsJWTGivesWayToANewOne() async throws {
        let share = MemoryTokenShare(clock: ManualDate())
        let (simulator, clients) = try await cluster(nodes: 1, poolSize: 1, share: share)
        let client = clients[0]
        #expect(await client.send(notification("0c01")).success != nil)
        share.clock.advance(45 * 60)
        simulator.setFaults(APNsFaultPlan(goAwayAfterRequests: 1))
        #expect(await client.send(notification("0c02")).success != nil)
        simulator.setFaults(APNsFaultPlan())
        #expect(await client.send(notification("0c03")).success != nil)
        let opened = await client.connectionsOpened
        share.clock.advance(6 * 60)  // 51: the cluster's JWT is replaced; this connection keeps its own
        #expect(await client.send(notification("0c04")).success != nil)
        #expect(share.swaps == 2)
        share.clock.advance(5 * 60)  // 56: too old to send, too soon to change on this connection
        let late = await client.send(notification("0c05"))
        #expect(late.success != nil, "\(String(describing: late.failure))")
        #expect(await client.connectionsOpened > opened, "a new connection took over")
        #expect(simulator.stats().rejectedByReason["TooManyProviderTokenUpdates"] == nil, "\(simulator.rejections())")
        #expect(simulator.stats().rejectedByReason["ExpiredProviderToken"] == nil)
        await client.shutdown()
        try? await simulator.stop()
    }

    /// A database that does not answer does not stop wake-ups: the node keeps a JWT still fit to send,
    /// and mints its own once none is.
    @Test func pushesGoOnWhileTheShareIsDown() async throws {
        let share = MemoryTokenShare(clock: ManualDate())
        let (simulator, clients) = try await cluster(nodes: 1, share: share)
        await pushFromEach(clients, count: 2)
        share.fail(true)
        share.clock.advance(52 * 60)
        await pushFromEach(clients, count: 2)
        share.clock.advance(10 * 60)
        await pushFromEach(clients, count: 2)
        #expect(simulator.stats().rejected == 0, "\(simulator.rejections())")
        share.fail(false)
        share.clock.advance(51 * 60)
        await pushFromEach(clients, count: 2)
        #expect(share.swaps == 2, "back to the share once it answers")
        await clients[0].shutdown()
        try? await simulator.stop()
    }

    @Test func aConnectionChangesItsJWTOnlyTwentyMinutesAfterFirstSendingTheLast() {
        let start = Date(timeIntervalSince1970: 1_800_000_000)
        let first = SharedTokenUse(jwt: "a", generation: 1, issuedAt: start, firstUse: start)
        let second = SharedTokenUse(jwt: "b", generation: 2, issuedAt: start + 50 * 60, firstUse: start + 50 * 60)
        #expect(SharedTokenUse.decide(nil, current: first, now: start + 60) == .send(first.firstUsed(at: start + 60)))
        let early = first.firstUsed(at: start + 10 * 60)
        #expect(SharedTokenUse.decide(early, current: second, now: start + 51 * 60) == .send(second.firstUsed(at: start + 51 * 60)))
        let late = first.firstUsed(at: start + 45 * 60)
        #expect(SharedTokenUse.decide(late, current: second, now: start + 51 * 60) == .send(late))
        #expect(SharedTokenUse.decide(late, current: second, now: start + 56 * 60) == .retire)
        #expect(SharedTokenUse.decide(late, current: second, now: start + 65 * 60) == .send(second.firstUsed(at: start + 65 * 60)))
    }
}
