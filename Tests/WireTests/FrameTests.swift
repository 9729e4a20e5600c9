import Testing
@testable import Wire

/// Writes with a `WireWriter` into a fresh buffer and returns the bytes written.
func written(capacity: Int = 1_500, _ body: (inout WireWriter) -> Void) -> [UInt8] {
    var buffer = [UInt8](repeating: 0xEE, count: capacity)
    let count = buffer.withUnsafeMutableBytes { raw -> Int in
        var w = WireWriter(raw)
        body(&w)
        precondition(!w.overflowed)
        return w.offset
    }
    return Array(buffer[0..<count])
}

func parseAll(_ bytes: [UInt8]) throws(WireParseError) -> [Frame] {
    try bytes.withUnsafeBytes { raw in
        Result { () throws(WireParseError) -> [Frame] in
            var parser = FrameParser(payload: raw)
            var frames: [Frame] = []
            while let f = try parser.next() { frames.append(f) }
            return frames
        }
    }.get()
}

@Suite struct VarintTests {
    /// The examples of RFC 9000 Appendix A.1.
    static let rfcExamples: [([UInt8], UInt64)] = [
        ([0xC2, 0x19, 0x7C, 0x5E, 0xFF, 0x14, 0xE8, 0x8C], 151_288_809_941_952_652),
        ([0x9D, 0x7F, 0x3E, 0x7D], 494_878_333),
        ([0x7B, 0xBD], 15_293),
        ([0x25], 37),
    ]

    @Test(arguments: rfcExamples)
    func rfcExamplesDecodeAndEncode(bytes: [UInt8], value: UInt64) throws {
        let decoded = try bytes.withUnsafeBytes { raw in
            Result { () throws(WireParseError) in var r = WireReader(raw); return try r.varint("v") }
        }.get()
        #expect(decoded == value)
        #expect(written { $0.varint(value) } == bytes)
    }

    @Test func nonMinimalEncodingsAreAccepted() throws {
        // RFC 9000 A.1: 0x4025 is also 37.
        let v = try [UInt8]([0x40, 0x25]).withUnsafeBytes { raw in
            Result { () throws(WireParseError) in var r = WireReader(raw); return try r.varint("v") }
        }.get()
        #expect(v == 37)
    }

    @Test func boundariesUseTheShortestEncoding() {
        let cases: [(UInt64, Int)] = [(0, 1), (63, 1), (64, 2), (16_383, 2), (16_384, 4), ((1 << 30) - 1, 4), (1 << 30, 8), ((1 << 62) - 1, 8)]
        for (value, length) in cases {
            #expect(written { $0.varint(value) }.count == length, "\(value)")
            #expect(WireWriter.varintLength(value) == length)
        }
    }

    @Test func truncatedVarintThrows() {
        #expect(throws: WireParseError.truncated(field: "v")) {
            try [UInt8]([0xC2, 0x19]).withUnsafeBytes { raw in
                Result { () throws(WireParseError) in var r = WireReader(raw); return try r.varint("v") }
            }.get()
        }
    }

    @Test func writerReportsOverflowInsteadOfTrapping() {
        var buffer = [UInt8](repeating: 0, count: 3)
        buffer.withUnsafeMutableBytes { raw in
            var w = WireWriter(raw)
            w.varint(1 << 20)  // needs 4 bytes
            #expect(w.overflowed)
            #expect(w.offset == 0)
        }
    }
}

@Suite struct FrameTests {
    @Test func everyFrameRoundTrips() throws {
        let token: [UInt8] = Array(0..<16)
        let payload: [UInt8] = Array("floor request".utf8)
        let audio: [UInt8] = [0xFC, 0x01, 0x02, 0x03]
        let bytes = written { w in
            w.writePing()
            payload.withUnsafeBytes { w.writeCrypto(offset: 7, data: $0) }
            payload.withUnsafeBytes { w.writeControl(offset: 1_000_000, data: $0) }
            token.withUnsafeBytes { w.writeNewToken($0) }
            token.withUnsafeBytes { w.writeNewConnectionID(sequence: 3, retirePriorTo: 1, id: ConnectionID(0x0102_0304_0506_0708), resetToken: $0) }
            w.writeRetireConnectionID(sequence: 2)
            w.writePathChallenge(0xDEAD_BEEF_0000_0001)
            w.writePathResponse(0xDEAD_BEEF_0000_0002)
            w.writeHandshakeDone()
            audio.withUnsafeBytes { w.writeDatagram($0, last: false) }
            w.writeConnectionClose(code: 0x0A, reason: "going away")
            w.writePadding(5)
            audio.withUnsafeBytes { w.writeDatagram($0, last: true) }
        }
        let frames = try parseAll(bytes)
        func slice(_ r: Range<Int>) -> [UInt8] { Array(bytes[r]) }
        #expect(frames.count == 13)
        #expect(frames[0] == .ping)
        guard case .crypto(7, let c) = frames[1], slice(c) == payload else { Issue.record("crypto \(frames[1])"); return }
        guard case .control(1_000_000, let d) = frames[2], slice(d) == payload else { Issue.record("control"); return }
        guard case .newToken(let t) = frames[3], slice(t) == token else { Issue.record("token"); return }
        guard case .newConnectionID(3, 1, ConnectionID(0x0102_0304_0506_0708), let r) = frames[4], slice(r) == token else {
            Issue.record("new cid"); return
        }
        #expect(frames[5] == .retireConnectionID(sequence: 2))
        #expect(frames[6] == .pathChallenge(0xDEAD_BEEF_0000_0001))
        #expect(frames[7] == .pathResponse(0xDEAD_BEEF_0000_0002))
        #expect(frames[8] == .handshakeDone)
        guard case .datagram(let a) = frames[9], slice(a) == audio else { Issue.record("datagram"); return }
        guard case .connectionClose(0x0A, let why) = frames[10], String(decoding: slice(why), as: UTF8.self) == "going away" else {
            Issue.record("close"); return
        }
        #expect(frames[11] == .padding(count: 5))
        guard case .datagram(let last) = frames[12], slice(last) == audio else { Issue.record("last datagram"); return }
        // Our DATAGRAM frames, unlike RFC 9221's, ask for no acknowledgement (audio; protocol §11.2).
        #expect(!frames[11].isAckEliciting && !frames[12].isAckEliciting && frames[8].isAckEliciting)
    }

    @Test func ackRangesRoundTrip() throws {
        let ranges: [ClosedRange<UInt64>] = [90...100, 70...80, 50...50, 0...10]
        let bytes = written { $0.writeAck(ranges: ranges, delay: 25) }
        let frames = try parseAll(bytes)
        guard case .ack(let ack) = frames.first else { Issue.record("no ack"); return }
        #expect(ack.largest == 100 && ack.delay == 25)
        let back = bytes.withUnsafeBytes { Array(ack.ranges(in: $0)) }
        #expect(back == ranges)
    }

    @Test func malformedAcksAreRejected() {
        // First range larger than the largest acknowledged: would reach below packet number 0.
        #expect(throws: WireParseError.invalid(field: "first ACK range", value: 6)) { try parseAll([0x02, 5, 0, 0, 6]) }
        // A gap that goes below zero.
        #expect(throws: WireParseError.invalid(field: "ACK gap", value: 9)) { try parseAll([0x02, 10, 0, 1, 0, 9, 0]) }
        // Too many ranges claimed.
        #expect(throws: WireParseError.self) { try parseAll([0x02, 10, 0, 0x43, 0xFF, 0]) }
    }

    @Test func everyTruncationThrowsAndNeverTraps() {
        let full = written { w in
            w.writeAck(ranges: [5...9, 1...2], delay: 3)
            [UInt8](repeating: 7, count: 30).withUnsafeBytes { w.writeControl(offset: 9, data: $0); w.writeDatagram($0, last: false) }
            [UInt8](repeating: 1, count: 16).withUnsafeBytes { w.writeNewConnectionID(sequence: 1, retirePriorTo: 0, id: ConnectionID(9), resetToken: $0) }
            w.writeConnectionClose(code: 1, reason: "bye")
        }
        #expect((try? parseAll(full))?.count == 5)
        var truncated = 0
        for cut in 1..<full.count {
            do { _ = try parseAll(Array(full[0..<cut])) } catch .truncated { truncated += 1 } catch {
                Issue.record("cut at \(cut): \(error)")
            }
        }
        #expect(truncated > 0)
    }

    @Test func unknownFrameTypesAreRejected() {
        #expect(throws: WireParseError.unknownFrameType(0x40)) { try parseAll([0x40, 0x40]) }
        #expect(throws: WireParseError.unknownFrameType(0x03)) { try parseAll([0x03]) }
    }

    @Test func aConnectionIDOfTheWrongLengthIsRejected() {
        #expect(throws: WireParseError.invalid(field: "connection ID length", value: 4)) {
            try parseAll([0x18, 1, 0, 4, 1, 2, 3, 4] + [UInt8](repeating: 0, count: 16))
        }
    }
}
