import APNs
import APNsSimulator
import ChannelStorePostgres
import Foundation
import PostgresTesting
import SquelchTesting
import Testing
@testable import PTTServer

/// The nodes' provider JWT kept in a real PostgreSQL: two nodes' APNs clients, each with its own store
/// connection, against the APNs simulator.
@Suite(.timeLimit(.minutes(2))) struct SharedProviderTokensTests {
    @Test func twoNodesPushWithTheJWTTheFirstStored() async throws {
        let location = try await PostgresTestServer.shared.makeDatabase()
        let stores = [try await PostgresChannelStore.open(location), try await PostgresChannelStore.open(location)]
        let topic = "org.squelch.test.voip-ptt"
        let key = try APNsProviderKey.load(p8Path: DevCertificates.p8, keyID: "DEVKEY0001", teamID: "DEVTEAM001")
        let simulator = try APNsSimulator(configuration: APNsSimulatorConfiguration(
            certificateChainPath: DevCertificates.simulatorCertificate, privateKeyPath: DevCertificates.simulatorKey,
            providerKeys: [key], allowedTopics: [topic]))
        let endpoints = try await simulator.start()
        let identity = try APNsProviderIdentity.load(p8Path: DevCertificates.p8, keyID: "DEVKEY0001", teamID: "DEVTEAM001")
        var clients: [APNsClient] = []
        for store in stores {
            clients.append(try await APNsClient(configuration: APNsConfiguration(
                environment: .custom(host: "127.0.0.1", port: endpoints.port, caPath: DevCertificates.ca), identity: identity,
                topic: topic, poolSize: 1, providerTokenShare: SharedProviderTokens(store: store))))
        }
        let push = PushToTalkNotification(deviceToken: "0d01", activeSpeaker: "Ann", channel: UUID())
        let first = await clients[0].send(push)
        #expect((try? first.get()) != nil, "\(first)")
        let stored = try #require(try await stores[1].providerToken(key: "DEVTEAM001.DEVKEY0001"), "the first push stored the cluster's JWT")
        #expect((0..<10_000_000).contains(stored.ageMicroseconds))
        let second = await clients[1].send(push)
        #expect((try? second.get()) != nil, "\(second)")
        #expect(try await stores[0].providerToken(key: "DEVTEAM001.DEVKEY0001")?.jwt == stored.jwt, "the second node took it up")
        #expect(simulator.stats().accepted == 2)
        for client in clients { await client.shutdown() }
        try? await simulator.stop()
        for store in stores { try await store.close() }
    }
}
