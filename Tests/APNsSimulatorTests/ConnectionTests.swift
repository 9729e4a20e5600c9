import Foundation
import JWTKit
import NIOCore
import NIOHTTP2
import NIOPosix
import NIOSSL
import Testing
@testable import APNsSimulator

@Suite struct ConnectionTests {
    @Test func aValidPushToTalkPushIsAcceptedAndLoggedWithAllItsFields() async throws {
        try await SimulatorFixture.with { fixture in
            let client = try await fixture.connect()
            let apnsID = UUID().uuidString.lowercased()
            var headers = fixture.validHeaders(apnsID: apnsID)
            headers.append(("apns-collapse-id", "channel-7"))
            let body = #"{"activeSpeaker":"Alice","channel":"7"}"#
            let response = try await client.send(path: "/3/device/\(deviceToken.uppercased())", headers: headers, body: body)

            #expect(response.status == 200)
            #expect(response.body.isEmpty)
            #expect(response.header("apns-id") == apnsID)
            let uniqueID = try #require(response.header("apns-unique-id"))
            #expect(APNsRequestValidator.isCanonicalUUID(uniqueID))
            #expect(fixture.simulator.acceptedPushes() == [APNsAcceptedPush(
                apnsID: apnsID, token: deviceToken, topic: ptTopic, pushType: "pushtotalk", priority: 10, expiration: 0,
                collapseID: "channel-7", body: body, keyID: fixture.key.keyID, teamID: fixture.key.teamID, connection: 1,
                streamID: 1, receivedAt: fixture.clock.now)])
            #expect(fixture.simulator.rejections().isEmpty)

            // Without an apns-id the simulator makes one up, and the log has the same one.
            let second = try await fixture.push(on: client)
            #expect(second.status == 200)
            let generated = try #require(second.header("apns-id"))
            #expect(APNsRequestValidator.isCanonicalUUID(generated))
            #expect(fixture.simulator.acceptedPushes().last?.apnsID == generated)
            #expect(fixture.simulator.acceptedPushes().last?.streamID == 3)

            let stats = fixture.simulator.stats()
            #expect(stats.accepted == 2 && stats.rejected == 0 && stats.connectionsOpened == 1 && stats.malformedBodies == 0)
            await client.close()
        }
    }

    @Test func aJWTFromJWTKitAndTheDevP8KeyIsAccepted() async throws {
        let p8 = try DevCertificates.path("AuthKey_DEVKEY0001.p8")
        let key = try APNsProviderKey.load(p8Path: p8, keyID: "DEVKEY0001", teamID: "DEVTEAM001")
        var configuration = APNsSimulatorConfiguration(
            certificateChainPath: try DevCertificates.path("apns-sim.pem"), privateKeyPath: try DevCertificates.path("apns-sim.key"),
            providerKeys: [key])
        configuration.logger.logLevel = .critical
        let simulator = try APNsSimulator(configuration: configuration)
        let endpoints = try await simulator.start()

        struct Claims: JWTPayload {
            var iss: IssuerClaim
            var iat: IssuedAtClaim
            func verify(using algorithm: some JWTAlgorithm) throws {}
        }
        let keys = JWTKeyCollection()
        await keys.add(ecdsa: try ES256PrivateKey(pem: String(contentsOfFile: p8, encoding: .utf8)), kid: "DEVKEY0001")
        let now = Date(timeIntervalSince1970: Date().timeIntervalSince1970.rounded(.down))
        let jwt = try await keys.sign(Claims(iss: "DEVTEAM001", iat: IssuedAtClaim(value: now)), kid: "DEVKEY0001")

        let client = try await H2TestClient.connect(port: endpoints.port)
        let response = try await client.send(path: "/3/device/\(deviceToken)", headers: [
            ("authorization", "bearer \(jwt)"), ("apns-push-type", "pushtotalk"), ("apns-topic", ptTopic),
        ], body: "{}")
        #expect(response.status == 200, "\(response.body)")
        #expect(simulator.acceptedPushes().first?.keyID == "DEVKEY0001")
        await client.close()
        try await simulator.stop()
    }

    @Test func oneStreamUntilTheFirstValidJWTThenTheConfiguredMaximum() async throws {
        try await SimulatorFixture.with(maxConcurrentStreams: 250) { fixture in
            let client = try await fixture.connect()
            #expect(try await client.waitFor { !$0.isEmpty })
            #expect(client.settings.first?[.maxConcurrentStreams] == 1)

            // Requests without a valid JWT don't lift the limit, and the client's extra streams queue.
            var badHeaders = fixture.validHeaders()
            badHeaders.set("authorization", "bearer x.y.z")
            let headers = badHeaders
            try await withThrowingTaskGroup(of: Int.self) { group in
                for _ in 0..<4 {
                    group.addTask { try await client.send(path: "/3/device/\(deviceToken)", headers: headers, body: "{}").status }
                }
                for try await status in group { #expect(status == 403) }
            }
            #expect(client.settings.count == 1)
            #expect(fixture.simulator.stats().maxStreamsInFlight == 1)

            #expect(try await fixture.push(on: client).status == 200)
            #expect(try await client.waitFor { events in
                events.contains { if case .settings(let values) = $0 { values[.maxConcurrentStreams] == 250 } else { false } }
            })
            #expect(client.settings.count == 2, "one SETTINGS at the start, one after the first valid JWT")

            // Now streams run side by side: the delay keeps them open together.
            fixture.simulator.setFaults(APNsFaultPlan(delayMilliseconds: 200))
            try await withThrowingTaskGroup(of: Int.self) { group in
                for _ in 0..<8 { group.addTask { try await fixture.push(on: client).status } }
                for try await status in group { #expect(status == 200) }
            }
            #expect(fixture.simulator.stats().maxStreamsInFlight >= 4)
            #expect(client.settings.count == 2, "the limit is raised once per connection")
            await client.close()
        }
    }

    @Test func theOneHourAndTwentyMinuteJWTRules() async throws {
        try await SimulatorFixture.with { fixture in
            let start = fixture.clock.now
            let first = fixture.key.jwt(issuedAt: start)
            let client = try await fixture.connect()
            #expect(try await fixture.push(on: client, jwt: first).status == 200)

            // A different JWT 10 minutes after the first one's first use: too soon.
            fixture.clock.advance(10 * 60)
            let early = fixture.key.jwt(issuedAt: fixture.clock.now)
            let refused = try await fixture.push(on: client, jwt: early)
            #expect(refused.status == 429 && refused.reason == "TooManyProviderTokenUpdates")
            #expect(try await fixture.push(on: client, jwt: first).status == 200, "the JWT in use still works")

            // The first JWT on a connection is free, whatever other connections did.
            let other = try await fixture.connect()
            #expect(try await fixture.push(on: other, jwt: early).status == 200)

            // 59 minutes in, the first JWT is still good; at 61 it has expired.
            fixture.clock.advance(49 * 60)
            #expect(try await fixture.push(on: client, jwt: first).status == 200)
            fixture.clock.advance(2 * 60)
            let expired = try await fixture.push(on: client, jwt: first)
            #expect(expired.status == 403 && expired.reason == "ExpiredProviderToken")

            // More than 20 minutes after its first use, a new JWT is welcome.
            let fresh = fixture.key.jwt(issuedAt: fixture.clock.now)
            #expect(try await fixture.push(on: client, jwt: fresh).status == 200)

            // A key of another team on this connection: unrelated, even much later.
            fixture.clock.advance(30 * 60)
            let unrelated = try await fixture.push(on: client, jwt: fixture.otherTeamKey.jwt(issuedAt: fixture.clock.now))
            #expect(unrelated.status == 403 && unrelated.reason == "UnrelatedKeyIdInToken")
            // … while on a new connection that key is fine.
            let third = try await fixture.connect()
            #expect(try await fixture.push(on: third, jwt: fixture.otherTeamKey.jwt(issuedAt: fixture.clock.now)).status == 200)

            #expect(fixture.simulator.stats().rejectedByReason == [
                "TooManyProviderTokenUpdates": 1, "ExpiredProviderToken": 1, "UnrelatedKeyIdInToken": 1,
            ])
            #expect(fixture.simulator.acceptedPushes().map(\.connection) == [1, 1, 2, 1, 1, 3])
            for connection in [client, other, third] { await connection.close() }
        }
    }

    @Test func pingIsAnswered() async throws {
        try await SimulatorFixture.with { fixture in
            let client = try await fixture.connect()
            let ping = HTTP2Frame(streamID: .rootStream, payload: .ping(HTTP2PingData(withInteger: 0x5157_454c_4348), ack: false))
            try await client.channel.writeAndFlush(ping)
            #expect(try await client.waitFor { $0.contains(.pingAck(0x5157_454c_4348)) })
            await client.close()
        }
    }

    @Test func aClientWithoutH2InALPNIsHungUpOn() async throws {
        try await SimulatorFixture.with { fixture in
            let tls = try H2TestClient.tlsContext(alpn: ["http/1.1"])
            let channel = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
                .channelInitializer { channel in
                    channel.eventLoop.makeCompletedFuture {
                        try channel.pipeline.syncOperations.addHandler(NIOSSLClientHandler(context: tls, serverHostname: "localhost"))
                    }
                }
                .connect(host: "127.0.0.1", port: fixture.endpoints.port).get()
            let closed = try await withThrowingTaskGroup(of: Bool.self) { group in
                group.addTask { try? await channel.closeFuture.get(); return true }
                group.addTask { try await Task.sleep(for: .seconds(3)); return false }
                defer { group.cancelAll() }
                return try await group.next() ?? false
            }
            #expect(closed, "the simulator should close a connection that didn't negotiate h2")
            try? await channel.close()
        }
    }

    @Test func stopClosesOpenConnections() async throws {
        try await SimulatorFixture.with { fixture in
            let client = try await fixture.connect()
            #expect(try await fixture.push(on: client).status == 200)
            #expect(fixture.simulator.stats().connectionsOpen == 1)
            try await fixture.simulator.stop()
            try await client.channel.closeFuture.get()
            #expect(!client.channel.isActive)
        }
    }

    @Test func theLogKeepsTheNewestPushesUpToItsCapacity() async throws {
        try await SimulatorFixture.with(logCapacity: 3) { fixture in
            let client = try await fixture.connect()
            var ids: [String] = []
            for index in 0..<5 {
                let response = try await fixture.push(on: client, body: #"{"n":\#(index)}"#)
                ids.append(try #require(response.header("apns-id")))
            }
            #expect(fixture.simulator.acceptedPushes().map(\.apnsID) == Array(ids.suffix(3)))
            #expect(fixture.simulator.stats().accepted == 5)
            await client.close()
        }
    }

    @Test func unreadableCertificatesGiveAnActionableError() throws {
        let configuration = APNsSimulatorConfiguration(certificateChainPath: "/nonexistent/apns-sim.pem", privateKeyPath: "/nonexistent/apns-sim.key",
                                                       providerKeys: [TestProviderKey(keyID: "K", teamID: "T").simulatorKey])
        let error = #expect(throws: APNsSimulatorError.self) { try APNsSimulator(configuration: configuration) }
        #expect(error?.description.contains("/nonexistent/apns-sim.pem") == true)
        #expect(error?.description.contains("make certs") == true)
        #expect(throws: APNsSimulatorError.self) { try APNsProviderKey.load(p8Path: "/nonexistent/key.p8", keyID: "K", teamID: "T") }
    }
}
