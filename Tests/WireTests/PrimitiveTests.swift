import _CryptoExtras
import Crypto
import Foundation
import SeededRandom
import Testing
@testable import Wire

@Suite struct PrimitiveTests {
    /// libcrypto's in-place AEAD must agree byte for byte with swift-crypto's: two independent
    /// implementations of the same suite.
    @Test(arguments: CipherSuite.allCases)
    func inPlaceSealMatchesSwiftCrypto(suite: CipherSuite) throws {
        let secret = (0..<32).map { UInt8($0) }
        let sealer = try PacketKey(secret: secret, suite: suite, sealing: true)
        let opener = try PacketKey(secret: secret, suite: suite, sealing: false)
        let header: [UInt8] = [0x41, 1, 2, 3, 4, 5, 6, 7, 8, 0x12, 0x34]
        let payload = (0..<100).map { UInt8(truncatingIfNeeded: $0 &* 7) }
        let pn: UInt64 = 0x1234
        var packet = header + payload + [UInt8](repeating: 0, count: 16)
        try packet.withUnsafeMutableBytes { try sealer.seal($0, payloadStart: header.count, payloadEnd: header.count + payload.count, packetNumber: pn) }

        var nonce = sealer.iv
        for i in 0..<8 { nonce[4 + i] ^= UInt8(truncatingIfNeeded: pn >> UInt64(56 - 8 * i)) }
        let key = SymmetricKey(data: sealer.key)
        let expected: [UInt8]
        switch suite {
        case .aes128GCMSHA256:
            let box = try AES.GCM.seal(payload, using: key, nonce: try AES.GCM.Nonce(data: nonce), authenticating: header)
            expected = Array(box.ciphertext) + Array(box.tag)
        case .chacha20Poly1305SHA256:
            let box = try ChaChaPoly.seal(payload, using: key, nonce: try ChaChaPoly.Nonce(data: nonce), authenticating: header)
            expected = Array(box.ciphertext) + Array(box.tag)
        }
        #expect(Array(packet[header.count...]) == expected)

        let tagStart = packet.count - 16
        let opened = packet.withUnsafeMutableBytes { opener.open($0, payloadStart: header.count, tagStart: tagStart, packetNumber: pn) }
        #expect(opened)
        #expect(Array(packet[header.count..<(packet.count - 16)]) == payload)
        // The wrong packet number is the wrong nonce.
        var again = header + expected
        let wrongNonce = again.withUnsafeMutableBytes { opener.open($0, payloadStart: header.count, tagStart: tagStart, packetNumber: pn + 1) }
        #expect(!wrongNonce)
    }

    @Test func headerProtectionMasksMatchTheCipherDefinitions() throws {
        let sample = (0..<16).map { UInt8($0 * 3) }
        for suite in CipherSuite.allCases {
            let key = try PacketKey(secret: [UInt8](repeating: 9, count: 32), suite: suite, sealing: true)
            let mask = try #require(sample.withUnsafeBytes { key.headerMask($0, sampleOffset: 0) })
            let expected: [UInt8]
            switch suite {
            case .aes128GCMSHA256:
                // AES-ECB of one block = CTR with the sample as counter block, over zeros.
                var block = sample
                try AES.permute(&block, key: SymmetricKey(data: key.hpKey))
                expected = Array(block.prefix(5))
            case .chacha20Poly1305SHA256:
                let stream = try Insecure.ChaCha20CTR.encrypt([UInt8](repeating: 0, count: 5), using: SymmetricKey(data: key.hpKey),
                                                              counter: try .init(data: sample[0..<4]), nonce: try .init(data: sample[4...]))
                expected = Array(stream)
            }
            let maskBytes: [UInt8] = (0..<5).map { UInt8(truncatingIfNeeded: mask >> UInt64(56 - 8 * $0)) }
            #expect(maskBytes == expected, "\(suite)")
        }
    }

    @Test func expandLabelUsesTheTLS13LayoutWithOurPrefix() {
        let secret = [UInt8](repeating: 1, count: 32)
        let info: [UInt8] = [0, 16, UInt8("squelch1 key".utf8.count)] + Array("squelch1 key".utf8) + [0]
        let expected = HKDF<SHA256>.expand(pseudoRandomKey: SymmetricKey(data: secret), info: info, outputByteCount: 16)
        #expect(KeySchedule.expandLabel(secret, "key", length: 16) == expected.withUnsafeBytes { Array($0) })
        #expect(KeySchedule.nextGeneration(secret) != secret)
    }

    @Test func packetNumbersRoundTripThroughTruncation() {
        // RFC 9000 appendix A.3's example: largest 0xa82f30ea, truncated 0x9b32 (2 bytes) → 0xa82f9b32.
        #expect(PacketNumber.decode(truncated: 0x9B32, length: 2, largest: 0xA82F_30EA) == 0xA82F_9B32)
        var rng = SplitMix64(seed: 5)
        for _ in 0..<10_000 {
            let largest = rng.next() % (1 << 40)
            let full = largest + 1 + rng.next() % 1000
            let length = PacketNumber.encodedLength(full, largestAcked: largest)
            let truncated = full & ((1 << UInt64(8 * length)) - 1)
            #expect(PacketNumber.decode(truncated: truncated, length: length, largest: largest) == full)
        }
    }

    @Test func replayWindowAcceptsEachNumberOnceAndForgetsOnlyTheVeryOld() {
        var window = ReplayWindow()
        #expect(ReplayWindow.size >= 2048)
        var rng = SplitMix64(seed: 6)
        var seen = Set<UInt64>()
        var largest: UInt64 = 0
        for _ in 0..<20_000 {
            let pn = largest + 10 > 3000 ? largest + 10 - rng.next() % 3000 : rng.next() % (largest + 10)
            let fresh = window.isFresh(pn)
            #expect(fresh == !seen.contains(pn), "pn \(pn) largest \(largest)")
            if fresh { window.record(pn); seen.insert(pn); largest = max(largest, pn) }
        }
        window.record(largest + 10_000)
        #expect(!window.isFresh(largest), "older than the window")
        #expect(window.isFresh(largest + 10_000 - 100))
    }

    @Test func receivedRangesMergeAndStayBounded() {
        var ranges = ReceivedRanges()
        for pn: UInt64 in [1, 2, 3, 7, 5, 6, 10] { ranges.insert(pn) }
        #expect(ranges.ranges == [10...10, 5...7, 1...3])
        ranges.insert(4)
        #expect(ranges.ranges == [10...10, 1...7])
        for pn in stride(from: UInt64(100), to: 300, by: 2) { ranges.insert(pn) }
        #expect(ranges.ranges.count == ReceivedRanges.maximumRanges)
        #expect(ranges.largest == 298)
        // A lossy connection lives at the limit: the insert past it must not double the array's
        // memory for good.
        #expect(ranges.ranges.capacity < 2 * ReceivedRanges.maximumRanges)
    }

    /// `oldest` is where ACK processing and loss detection start their walks; if it ever passed a
    /// live packet, that packet would never be acknowledged or declared lost.
    @Test func sentPacketsOldestIsTheLowestLiveNumber() {
        var sent = SentPackets()
        var live = Set<UInt64>()
        var generator = SystemRandomNumberGenerator()
        var number: UInt64 = 0
        for _ in 0..<5000 {
            number += UInt64.random(in: 1...3, using: &generator)  // non-eliciting packets are never recorded
            var packet = SentPacket.empty
            packet.number = number
            packet.live = true
            if let displaced = sent.record(packet) { live.remove(displaced.number) }
            live.insert(number)
            // Take a random live packet most of the time, so some stay behind for a while.
            if Int.random(in: 0..<10, using: &generator) < 9, let victim = live.randomElement(using: &generator) {
                #expect(sent.take(victim)?.number == victim)
                live.remove(victim)
            }
            live = live.filter { number - $0 < UInt64(SentPackets.capacity) }
            #expect(sent.oldest <= (live.min() ?? number + 1))
            if let lowest = live.min() { #expect(sent.oldest == lowest) }
        }
        #expect(sent.take(number + 1) == nil)
        #expect(sent.allocated == SentPackets.capacity, "up to 1,023 packets in flight grew the ring to its limit")
    }

    /// A peer names packet numbers in ACK ranges, and only ACK-eliciting packets are recorded, so a
    /// range can span a million numbers with nothing live in it. The walks over it are clipped to
    /// the numbers recorded and not yet settled: at most the ring's capacity, whatever the peer says.
    @Test func peerNamedRangesAreClippedToTheLiveNumbers() {
        var sent = SentPackets()
        #expect(sent.clipped(0...UInt64.max) == nil, "nothing recorded")
        var packet = SentPacket.empty
        packet.live = true
        for number: UInt64 in [10, 11, 15] {
            packet.number = number
            _ = sent.record(packet)
        }
        #expect(sent.clipped(0...1_000_000) == 10...15)
        #expect(sent.clipped(12...13) == 12...13)
        #expect(sent.clipped(16...1_000_000) == nil, "numbers above the highest recorded (ACK-only packets since)")
        #expect(sent.clipped(0...9) == nil)
        for number: UInt64 in [10, 11, 15] { _ = sent.take(number) }
        #expect(sent.clipped(0...UInt64.max) == nil, "everything settled: a hostile ACK visits nothing")
    }

    @Test func sentRingGrowsOnlyWithThePacketsInFlight() {
        var sent = SentPackets()
        func packet(_ number: UInt64) -> SentPacket {
            var packet = SentPacket.empty
            packet.number = number
            packet.live = true
            return packet
        }
        // A listener acknowledging every tenth packet: never more than 20 in flight.
        for number: UInt64 in 0..<5_000 {
            #expect(sent.record(packet(number)) == nil)
            if number % 10 == 9 { for acked in number - 9...number { #expect(sent.take(acked)?.number == acked) } }
        }
        // Ten in flight between acknowledgements fit 16 slots: the ring grew once, and no further.
        #expect(sent.allocated == 16)
        // 100 unacknowledged packets: the ring doubles to 128, keeping every one of them.
        for number: UInt64 in 5_000..<5_100 { #expect(sent.record(packet(number)) == nil) }
        #expect(sent.allocated == 128)
        for number: UInt64 in 5_000..<5_100 { #expect(sent.peek(number)?.number == number) }
        #expect(sent.oldest == 5_000)
        // Past the limit, the oldest is displaced (and reported lost by the caller).
        for number: UInt64 in 5_100..<(5_000 + UInt64(SentPackets.capacity)) { #expect(sent.record(packet(number)) == nil) }
        #expect(sent.record(packet(5_000 + UInt64(SentPackets.capacity)))?.number == 5_000)
        #expect(sent.oldest == 5_001)
        // Once all of them are acknowledged (out of order, the oldest last), the peak is given back.
        let last = 5_000 + UInt64(SentPackets.capacity)
        for number in (5_002...last).reversed() { #expect(sent.take(number)?.number == number) }
        #expect(sent.allocated == SentPackets.capacity)
        #expect(sent.take(5_001)?.number == 5_001)
        #expect(sent.allocated == SentPackets.initialCapacity)
        #expect(sent.record(packet(last + 1)) == nil && sent.peek(last + 1)?.number == last + 1)
        // A listener's steady state never shrinks it (the audio path does not reallocate).
        for number in (last + 2)..<(last + 1_000) {
            _ = sent.record(packet(number))
            if number % 10 == 0 { for acked in sent.oldest...number { _ = sent.take(acked) } }
        }
        #expect(sent.allocated == 16)
    }

    @Test func sendStreamRetransmitsOnlyWhatIsLostAndUnacknowledged() throws {
        var stream = SendStream(limit: 1000)
        try stream.append(Array(repeating: 1, count: 100))
        var chunks: [Range<UInt64>] = []
        while let chunk = stream.nextChunk(maximum: 40) { chunks.append(chunk) }
        #expect(chunks == [0..<40, 40..<80, 80..<100])
        stream.markAcknowledged(chunks[1])
        stream.markLost(0..<100)
        var resent: [Range<UInt64>] = []
        while let chunk = stream.nextChunk(maximum: 100) { resent.append(chunk) }
        #expect(resent == [0..<40, 80..<100], "the acknowledged middle is not sent again")
        let (a, c) = (chunks[0], chunks[2])
        stream.markAcknowledged(a); stream.markAcknowledged(c)
        #expect(stream.unacknowledged == 0)
        #expect(throws: SendStream.Failure.full) { try stream.append(Array(repeating: 0, count: 1001)) }
    }

    /// A joiner's roster can queue 100 KB on its control stream once; an idle connection must not
    /// keep that much memory for the rest of its life (1,000 of them did: 166 KB each).
    @Test func anAcknowledgedSendStreamGivesBackItsPeakCapacity() throws {
        var stream = SendStream(limit: 1 << 20)
        try stream.append([UInt8](repeating: 7, count: 100_000))
        while let chunk = stream.nextChunk(maximum: 1_200) { stream.markAcknowledged(chunk) }
        #expect(stream.unacknowledged == 0)
        #expect(stream.retainedCapacity <= SendStream.keptCapacity)
        try stream.append([1, 2, 3])
        #expect(stream.nextChunk(maximum: 1_200) == 100_000..<100_003)
        stream.withBytes(100_000..<100_003) { #expect(Array($0) == [1, 2, 3]) }
    }

    @Test func reassemblyDeliversInOrderOnceAndRefusesFlooding() throws {
        var buffer = ReassemblyBuffer(limit: 100)
        var out: [UInt8] = []
        let data: [UInt8] = Array(0..<30)
        try data[20..<30].withUnsafeBytes { try buffer.receive(offset: 20, data: $0, into: &out) }
        try data[10..<20].withUnsafeBytes { try buffer.receive(offset: 10, data: $0, into: &out) }
        #expect(out.isEmpty)
        try data[0..<15].withUnsafeBytes { try buffer.receive(offset: 0, data: $0, into: &out) }
        #expect(out == data)
        try data[0..<30].withUnsafeBytes { try buffer.receive(offset: 0, data: $0, into: &out) }
        #expect(out == data, "duplicates are not delivered twice")
        #expect(throws: ReassemblyBuffer.Failure.overflow) {
            try [UInt8](repeating: 0, count: 10).withUnsafeBytes { try buffer.receive(offset: 500, data: $0, into: &out) }
        }
    }

    @Test func addressTokensBindTheAddressAndExpire() throws {
        let pki = try TestPKI()
        let secrets = try pki.secrets()
        let address = PathAddress.v4(10, 1, 2, 3, port: 5000)
        let now = WireInstant(nanoseconds: seconds(100))
        let retry = AddressToken.seal(address: address, original: ConnectionID(7), retrySource: ConnectionID(8), secrets: secrets, now: now)
        #expect(AddressToken.validate(retry, address: address, secrets: secrets, now: now + seconds(1))?.original == ConnectionID(7))
        var otherPort = address; otherPort.port = 5001
        #expect(AddressToken.validate(retry, address: otherPort, secrets: secrets, now: now) == nil)
        #expect(AddressToken.validate(retry, address: address, secrets: secrets, now: now + seconds(11)) == nil)
        let newToken = AddressToken.seal(address: address, original: nil, secrets: secrets, now: now)
        #expect(AddressToken.validate(newToken, address: otherPort, secrets: secrets, now: now + seconds(60)) != nil, "NEW_TOKEN binds the host only")
        var tampered = newToken; tampered[20] ^= 1
        #expect(AddressToken.validate(tampered, address: address, secrets: secrets, now: now) == nil)
    }
}
