import Foundation
import Testing
@testable import Wire

/// Media envelopes (protocol §3.6): the relay's per-listener copy of a sealed frame, sent without
/// sealing; what a client takes and what it drops.
@Suite struct MediaEnvelopeTests {
    @Test func anEnvelopeReachesTheListenerAsItsMediaWithoutAnyAnswer() async throws {
        let (sim, handle, server) = try await AckFrequencyTests.connectedOverASteadyLink(seed: 5)
        let client = sim.clients[0].connection
        let clientSentBefore = client.stats.packetsSent
        let serverPacketsBefore = server.stats.packetsSent
        for i in 0..<20 {
            #expect(sim.sendDatagram(server: handle, [0x41, UInt8(i), 7, 7], enveloped: true))
            await sim.run(for: ms(20))
        }
        await sim.run(for: ms(500))
        #expect(sim.clientDatagrams[0] == (0..<20).map { [0x41, UInt8($0), 7, 7] })
        #expect(client.stats.envelopesReceived == 20)
        #expect(client.stats.packetsSent == clientSentBefore, "the listener answered an envelope")
        #expect(server.stats.packetsSent == serverPacketsBefore, "an envelope is no packet")
        #expect(server.stats.datagramsSent >= 20)
    }

    @Test func aClientDropsEnvelopesForAnotherIDOrFromAnotherAddress() async throws {
        let (sim, _, server) = try await AckFrequencyTests.connectedOverASteadyLink(seed: 6)
        let client = sim.clients[0].connection
        let media: [UInt8] = [0x41, 0, 0, 1, 0, 1, 0, 0]
        func envelope(to id: ConnectionID) -> [UInt8] {
            var bytes = [UInt8](repeating: 0, count: 64)
            let length = bytes.withUnsafeMutableBytes { out in media.withUnsafeBytes { MediaEnvelope.write($0, to: id, into: out)! } }
            return Array(bytes[..<length])
        }
        let malformedBefore = client.stats.droppedMalformed
        // Right ID, wrong source; wrong ID, right source; cut to its header.
        sim.network.send(envelope(to: server.peerID), from: PathAddress.v4(10, 0, 0, 9, port: 9), to: sim.clientAddresses[0])
        sim.network.send(envelope(to: ConnectionID(server.peerID.value ^ 1)), from: sim.serverAddress, to: sim.clientAddresses[0])
        sim.network.send(Array(envelope(to: server.peerID)[..<MediaEnvelope.headerSize]), from: sim.serverAddress, to: sim.clientAddresses[0])
        await sim.run(for: ms(100))
        #expect(sim.clientDatagrams[0].isEmpty)
        #expect(client.stats.envelopesReceived == 0)
        #expect(client.stats.droppedMalformed == malformedBefore + 3)
        // The right one from the server's address goes through.
        sim.network.send(envelope(to: server.peerID), from: sim.serverAddress, to: sim.clientAddresses[0])
        await sim.run(for: ms(100))
        #expect(sim.clientDatagrams[0] == [media])
    }

    @Test func aServerNeverTakesAnEnvelope() async throws {
        let (sim, handle, server) = try await AckFrequencyTests.connectedOverASteadyLink(seed: 7)
        var bytes = [UInt8](repeating: 0, count: 64)
        let length = bytes.withUnsafeMutableBytes { out in ([0x41, 1, 2, 3] as [UInt8]).withUnsafeBytes { MediaEnvelope.write($0, to: server.localID, into: out)! } }
        let before = sim.serverDatagrams.count
        sim.network.send(Array(bytes[..<length]), from: sim.clientAddresses[0], to: sim.serverAddress)
        await sim.run(for: ms(100))
        #expect(sim.serverDatagrams.count == before)
        #expect(sim.endpoint.connection(handle)?.stats.envelopesReceived == 0)
    }

    @Test func envelopesRoundTripAndRefuseWhatIsNotOne() {
        var out = [UInt8](repeating: 0, count: 32)
        let length = out.withUnsafeMutableBytes { buffer in ([1, 2, 3] as [UInt8]).withUnsafeBytes { MediaEnvelope.write($0, to: ConnectionID(0xA1B2_C3D4_E5F6_0718), into: buffer) } }
        #expect(length == 12)
        #expect(Array(out[..<12]) == [0x2A, 0xA1, 0xB2, 0xC3, 0xD4, 0xE5, 0xF6, 0x07, 0x18, 1, 2, 3])
        let parsed = Array(out[..<12]).withUnsafeBytes { MediaEnvelope.parse($0) }
        #expect(parsed?.destination == ConnectionID(0xA1B2_C3D4_E5F6_0718) && parsed?.media == 9..<12)
        // Nothing inside, another first byte, too short: not envelopes. Too small a buffer: not written.
        for bytes in [Array(out[..<9]), [0x40] + Array(out[1..<12]), Array(out[..<5]), []] {
            #expect(bytes.withUnsafeBytes { MediaEnvelope.parse($0) } == nil)
        }
        var small = [UInt8](repeating: 0, count: 11)
        #expect(small.withUnsafeMutableBytes { buffer in ([1, 2, 3] as [UInt8]).withUnsafeBytes { MediaEnvelope.write($0, to: ConnectionID(1), into: buffer) } } == nil)
    }
}
