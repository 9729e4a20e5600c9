import Crypto
import Foundation
import SeededRandom
import Testing
@testable import Wire

func hex(_ bytes: some Sequence<UInt8>) -> String { bytes.map { String(format: "%02x", $0) }.joined() }

/// The test vectors of docs/protocol.md §15, checked against the implementation. The inputs are
/// fixed (seeded generators for connection IDs, randoms and X25519 keys); ECDSA signatures are
/// randomized, so the vectors stop at what the signature does not touch, plus a 1-RTT packet
/// protected under a given secret and its key update.
@Suite struct TestVectorTests {
    static let clientSeed: UInt64 = 0x5351_0001_C11E_0001
    static let serverSeed: UInt64 = 0x5351_0001_5E4F_0001
    static let suiteVectors: [CipherSuite: [String: String]] = [
        .aes128GCMSHA256: [
            "key": "8fff669779d8e4130a6458c9adf9ed69",
            "iv": "60f24d1b47477c6dac5c1b06",
            "hp": "ca8fdb4e41ae00e7102bd289febf02a4",
            "protected packet": "580102030405060708999e310937f8cf9a612487d2b4d9cce2603c23a191026cce0a",
            "next secret (key update)": "6b5cee60c8dd1e810ba1bbde3fe251f7495192af5cd8d414299b83b12ec75b05",
        ],
        .chacha20Poly1305SHA256: [
            "key": "fb0f25e72ef2d7fe057cbc69e74ad61ab375c2226c7d3c447c119a8d638cf057",
            "iv": "60f24d1b47477c6dac5c1b06",
            "hp": "c9daffef3b07756035f5f9442dfdd8d88bbcb7d0a9e1623551524686252f3a3d",
            "protected packet": "4a01020304050607085400ebf2a4ffcf4faa2d371eaae999c707b8fab5d8382cae7f",
            "next secret (key update)": "6b5cee60c8dd1e810ba1bbde3fe251f7495192af5cd8d414299b83b12ec75b05",
        ],
    ]

    /// Records `actual` against `expected`, printing the value so the document can be updated.
    func check(_ name: String, _ actual: String, _ expected: String, sourceLocation: SourceLocation = #_sourceLocation) {
        if actual != expected { print("VECTOR \(name) = \(actual)") }
        #expect(actual == expected, "\(name)", sourceLocation: sourceLocation)
    }

    @Test func handshakeVectors() async throws {
        let pki = try TestPKI()
        let now = WireInstant(nanoseconds: seconds(1))
        let client = Connection(client: ClientConfiguration(serverName: "localhost", validator: pki.validator),
                                remote: .v4(127, 0, 0, 1, port: 4433), now: now, random: SplitMix64(seed: Self.clientSeed))
        check("client source connection ID", hex(client.localID.bytes), "bda0c16558edebd0")
        check("client original destination ID", hex(client.originalDestination.bytes), "67ef8babb67f174e")
        check("client X25519 private key", hex(client.ephemeral!.rawRepresentation), "a7b9966fedb07d4df71f4d98d226414583e23ba87d905ccaa733e2a5151ae352")
        check("ClientHello", hex(client.clientHello), "0100007853510001015351000102d1e478fe6857e14f8967e95cc850ad90a8ec8e74c98c0d376233fefb4eb031021301130342816351c2bb8532ba99a03dbf4728e7fb206e334e89d49a4f1ad35f3c0fae1a096c6f63616c686f7374001e0104800493e0030244b00b01190e0104200244b00f08bda0c16558edebd0")

        let (clientInitial, serverInitial) = KeySchedule.initialSecrets(clientDestination: client.originalDestination)
        check("client initial secret", hex(clientInitial), "cf76296848a55bd9a7a83402cbde2ea3a56a37c5c597dc2393c5c370bc79a249")
        check("server initial secret", hex(serverInitial), "12ba1c0a194fbcd61626d3e08b1a849f86bb471ec15a15d31ff4bc1fe45d9266")
        let initialKey = try PacketKey(secret: clientInitial, suite: .aes128GCMSHA256, sealing: true)
        check("client initial key", hex(initialKey.key), "c8a3b15ac8619eb59d9dae1479951bdd")
        check("client initial iv", hex(initialKey.iv), "bd5ea1e30dbab4145e56ded6")
        check("client initial hp", hex(initialKey.hpKey), "49cd51b326b3d1e167812e568a0b3203")

        var datagram = [UInt8](repeating: 0, count: 1500)
        let first = try #require(datagram.withUnsafeMutableBytes { client.poll(into: $0, now: now) })
        #expect(first.count == 1200)
        check("client Initial datagram, first 48 bytes", hex(datagram[..<48]), "cd535100010867ef8babb67f174e08bda0c16558edebd0004496c138a04dce12c5fbf3a55a02e239bad761fe6094b01f")
        check("client Initial datagram, SHA-256 of all 1200 bytes", hex(SHA256.hash(data: datagram[..<first.count])), "469c77d68eea6cdd45ebc873879f2c8c58ddfbeb67211962cf7b979490dbd031")

        // The server, with its own seeded generator, answers; its Initial packet (ServerHello) is the
        // first packet of its first datagram.
        let endpoint = Endpoint(secrets: try pki.secrets(), random: SplitMix64(seed: Self.serverSeed),
                                forkRandom: { SplitMix64(seed: $0.next()) })
        datagram.withUnsafeMutableBytes {
            endpoint.receive(UnsafeMutableRawBufferPointer(rebasing: $0[..<first.count]), from: .v4(127, 0, 0, 1, port: 50_000), now: now)
        }
        let handle = try #require(endpoint.handles.first)
        let server = try #require(endpoint.connection(handle))
        check("server source connection ID", hex(server.localID.bytes), "83edf74baa2b1b36")
        check("ServerHello", hex(server.initialSpace.flight), "02000046535100019afd0396e02e0a8e2d82911b071058d6d73ca0c05a140b31e390f68de3a120491301a582e99753937d938dbedb81310f0ad9d9a872fded19f7ad83009afea6ffa47b")
        var reply = [UInt8](repeating: 0, count: 1500)
        let answer = try #require(reply.withUnsafeMutableBytes { endpoint.poll(into: $0, now: now) })
        let initialEnd = try reply.withUnsafeBytes { raw -> Int in
            guard case .long(.initial, _, _, _, _, _, let end) = try PacketHeader.parse(UnsafeRawBufferPointer(rebasing: raw[..<answer.count])) else { return 0 }
            return end
        }
        check("server Initial packet", hex(reply[..<initialEnd]), "c95351000108bda0c16558edebd00883edf74baa2b1b360040625185503ac040e010de3a161a7bfc3d7dc332b00439c460b230b1ba19ad1a73de125e2fbbcfb637fb75cf02168f2e0224c1fa1c0eb72f6d990fa601274ba5553500809bee3494b11dd5c9a8ec05fc7d1f28f7fdef9e415db5e8d1a03682feea019089")

        let secrets = try #require(server.secrets)
        check("handshake secret", hex(secrets.handshake), "d828140da74be952f42b752d091c4b79f51b48ebacfa39447fe275fa870d4673")
        check("client handshake traffic secret", hex(secrets.clientHandshake), "b65e35e996b67afb15214acedaf8e0623d02960bc9c6ee3d2527bc6a186e0154")
        check("server handshake traffic secret", hex(secrets.serverHandshake), "76990a4cc0fc35cee4b3391499d4b0bd1d17ef485b43719bd2200140e2d76243")

        // The client derives the same secrets from the server's packet.
        reply.withUnsafeMutableBytes { client.receive(UnsafeMutableRawBufferPointer(rebasing: $0[..<answer.count]), from: .v4(127, 0, 0, 1, port: 4433), now: now) }
        #expect(client.secrets?.serverHandshake == secrets.serverHandshake)
    }

    @Test func oneRTTPacketAndKeyUpdateVectors() throws {
        let secret = (0..<32).map { UInt8($0) }
        for suite in CipherSuite.allCases {
            let key = try PacketKey(secret: secret, suite: suite, sealing: true)
            check("\(suite) key", hex(key.key), Self.suiteVectors[suite]!["key"]!)
            check("\(suite) iv", hex(key.iv), Self.suiteVectors[suite]!["iv"]!)
            check("\(suite) hp", hex(key.hpKey), Self.suiteVectors[suite]!["hp"]!)
            // A short header to destination 0x0102030405060708, packet number 0x1234 in 2 bytes,
            // key phase 0, carrying PING and a DATAGRAM "hello".
            var packet = [UInt8](repeating: 0, count: 64)
            let length = try packet.withUnsafeMutableBytes { raw throws -> Int in
                var w = WireWriter(raw)
                let pnOffset = w.writeShortHeader(destination: ConnectionID(0x0102_0304_0506_0708), keyPhase: false, packetNumber: 0x1234, pnLength: 2)
                let payloadStart = w.offset
                w.writePing()
                Array("hello".utf8).withUnsafeBytes { w.writeDatagram($0, last: true) }
                try key.seal(raw, payloadStart: payloadStart, payloadEnd: w.offset, packetNumber: 0x1234)
                let mask = try #require(key.headerMask(UnsafeRawBufferPointer(raw), sampleOffset: pnOffset + 4))
                raw[0] ^= UInt8(truncatingIfNeeded: mask >> 56) & 0x1F
                for i in 0..<2 { raw[pnOffset + i] ^= UInt8(truncatingIfNeeded: mask >> UInt64(48 - 8 * i)) }
                return w.offset + 16
            }
            check("\(suite) protected packet", hex(packet[..<length]), Self.suiteVectors[suite]!["protected packet"]!)
            check("\(suite) next secret (key update)", hex(KeySchedule.nextGeneration(secret)), Self.suiteVectors[suite]!["next secret (key update)"]!)
        }
    }
}
