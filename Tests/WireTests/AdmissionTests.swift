import Foundation
import SeededRandom
import Testing
@testable import Wire

/// Connections that never join can't keep members out (issue 42, item 1; docs/protocol.md §8.7).
@Suite struct AdmissionTests {
    /// 12 sources handshake at the rate each is allowed (20 a second), complete the handshake, then
    /// never say a word nor acknowledge anything. The server is scaled down (200 connections) so that
    /// without a budget for unjoined connections it would be full within a second. A 13th client
    /// still connects and joins, and stays; the flood's connections are closed oldest first.
    @Test func sourcesThatHandshakeAndNeverJoinCannotKeepAMemberOut() async throws {
        let pki = try TestPKI()
        var configuration = EndpointConfiguration()
        configuration.maxConnections = 200
        configuration.maxUnadmittedPerAddress = 8
        configuration.maxUnadmitted = 64
        let sim = Simulation(seed: 31, pki: pki, secrets: try pki.secrets(), configuration: configuration)
        // The application admits a connection whose first message is a join.
        sim.onServerEvent = { [unowned sim] handle, event in
            if case .control(let message) = event, message == Array("join".utf8) { sim.endpoint.admit(handle) }
        }
        var flood: [Int] = []
        var port: UInt16 = 10_000
        func attack(seconds: Int) async {
            for _ in 0..<(seconds * 20) {
                for source in 1...12 {
                    port &+= 1
                    flood.append(sim.addClient(address: .v4(10, 9, 0, UInt8(source), port: port)))
                }
                await sim.run(for: ms(50))
                // Handshaken: from now on it acknowledges nothing.
                for index in flood where sim.connected(index) { sim.network.blackhole.insert(sim.clientAddresses[index]) }
            }
        }
        await attack(seconds: 3)
        #expect(sim.endpoint.stats.evicted > 0)
        #expect(sim.endpoint.unadmittedCount <= configuration.maxUnadmitted)
        #expect(sim.endpoint.stats.refused == 0, "the server was full: \(sim.endpoint.stats)")

        let member = sim.addClient(address: .v4(192, 168, 7, 7, port: 40_000))
        #expect(await sim.run(for: seconds(2)) { sim.connected(member) })
        try sim.clients[member].sendControl(Array("join".utf8))
        let handle = try #require(sim.serverHandle(of: member))
        #expect(await sim.run(for: seconds(1)) { sim.endpoint.isAdmitted(handle) })
        await attack(seconds: 2)
        #expect(sim.connected(member) && sim.endpoint.connection(handle)?.state == .established, "the member was evicted")
        // Only the newest few of the flood are left: each source keeps at most its budget, and
        // what was closed is gone at once (no closing period for an evicted connection).
        #expect(sim.endpoint.connectionCount <= configuration.maxUnadmitted + 1 + 12, "\(sim.endpoint.connectionCount) connections")
    }

    /// A peer that holds its ACKs back inflates its RTT without bound, and with it the closing
    /// period that keeps the connection's state: both are clamped.
    @Test func aDelayedAckCannotStretchTheClosingPeriod() async throws {
        var rtt = RTTEstimator()
        for _ in 0..<20 { rtt.update(sample: seconds(60), ackDelay: 0) }
        #expect(rtt.smoothed == RTTEstimator.maximumSample)
        #expect(rtt.latest == RTTEstimator.maximumSample)
        // Even samples within the clamp, swinging between 50 ms and 2 s, make a PTO whose three
        // times is far past the closing period's cap; the close still ends within it.
        let pki = try TestPKI()
        let sim = Simulation(seed: 41, pki: pki, secrets: try pki.secrets())
        sim.addClient()
        _ = try await sim.connect(0)
        let client = sim.clients[0].connection
        for sample in 0..<20 { client.rtt.update(sample: sample % 2 == 0 ? ms(50) : ms(2_000), ackDelay: 0) }
        #expect(3 * client.currentPTO > client.config.maxClosingPeriod)
        let now = sim.network.now
        client.close(code: 0, reason: "bye", now: now)
        #expect(client.state == .closing)
        #expect(client.closeDeadline == now + client.config.maxClosingPeriod)
    }

    /// An IPv6 party holds many /64s: its /56 and /48 are limited too, at 4 and 16 times the rate.
    @Test func handshakesAreLimitedPerWideIPv6PrefixToo() throws {
        let pki = try TestPKI()
        let endpoint = Endpoint(secrets: try pki.secrets())
        let now = WireInstant(nanoseconds: seconds(100))
        let site: UInt64 = 0x2001_0db8_1234_5600
        // 20 a second from each of 16 /64s in one /56: 80 pass.
        var allowed = 0
        for net in 0..<16 {
            for _ in 0..<20 where endpoint.allowHandshake(from: PathAddress(ipv6High: site | UInt64(net), low: 1, port: 9), now: now) { allowed += 1 }
        }
        #expect(allowed == 80)
        // Another /56 of the same /48 has its own 80, and the /48 as a whole 320.
        var other = 0
        for block in 1...8 {
            for net in 0..<16 {
                let address = PathAddress(ipv6High: site & ~0xFFFF | UInt64(block) << 8 | UInt64(net), low: 1, port: 9)
                for _ in 0..<20 where endpoint.allowHandshake(from: address, now: now) { other += 1 }
            }
        }
        #expect(other == 320 - 80)
        // IPv4 sources are not grouped.
        #expect(PathAddress.v4(10, 0, 0, 1, port: 1).wideSources.isEmpty)
    }
}
