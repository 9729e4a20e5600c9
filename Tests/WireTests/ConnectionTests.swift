import Crypto
import Foundation
import Testing
@testable import Wire

@Suite struct HandshakeTests {
    @Test func handshakeControlAndDatagramsOnAPerfectNetwork() async throws {
        let pki = try TestPKI()
        let sim = Simulation(seed: 1, pki: pki, secrets: try pki.secrets())
        sim.addClient()
        #expect(await sim.run(for: seconds(5)) { sim.connected(0) && sim.endpoint.connection(sim.serverHandle(of: 0)!)?.state == .established })
        let handle = try #require(sim.serverHandle(of: 0))
        try sim.clients[0].sendControl(Array("join dispatch".utf8))
        try sim.endpoint.sendControl(Array("welcome".utf8), to: handle, now: sim.network.now)
        sim.sendDatagram(client: 0, [1, 2, 3])
        #expect(sim.sendDatagram(server: handle, [9, 8, 7, 6]))
        await sim.run(for: seconds(1))
        #expect(sim.serverControlMessages(handle) == [Array("join dispatch".utf8)])
        #expect(sim.controlMessages(client: 0) == [Array("welcome".utf8)])
        #expect(sim.serverDatagrams.map(\.1) == [[1, 2, 3]])
        #expect(sim.clientDatagrams[0] == [[9, 8, 7, 6]])
        // One round trip: the client was connected one RTT (2 × 20 ms) after it started.
        #expect(sim.clientEvents[0].first == .connection(.connected))
    }
}
