import Foundation
import SFrame
import Testing

/// RFC 9605 Appendix C, from the RFC's own test-vector file (sframe-wg/sframe commit 025d568,
/// identical to the RFC's text): every header vector, and cipher suite 0x0004's key derivation and
/// encryption.
@Suite struct SFrameVectorTests {
    static func hex(_ text: String) -> [UInt8] {
        var bytes = [UInt8]()
        var index = text.startIndex
        while index < text.endIndex {
            let next = text.index(index, offsetBy: 2)
            bytes.append(UInt8(text[index..<next], radix: 16)!)
            index = next
        }
        return bytes
    }

    /// "kid ctr header", in hex, one per line: the RFC's 289 header vectors.
    static let headers = """
0 0 00
0 1 01
0 ff 08ff
0 100 090100
0 ffff 09ffff
0 10000 0a010000
0 ffffff 0affffff
0 1000000 0b01000000
0 ffffffff 0bffffffff
0 100000000 0c0100000000
0 ffffffffff 0cffffffffff
0 10000000000 0d010000000000
0 ffffffffffff 0dffffffffffff
0 1000000000000 0e01000000000000
0 ffffffffffffff 0effffffffffffff
0 100000000000000 0f0100000000000000
0 ffffffffffffffff 0fffffffffffffffff
1 0 10
1 1 11
1 ff 18ff
1 100 190100
1 ffff 19ffff
1 10000 1a010000
1 ffffff 1affffff
1 1000000 1b01000000
1 ffffffff 1bffffffff
1 100000000 1c0100000000
1 ffffffffff 1cffffffffff
1 10000000000 1d010000000000
1 ffffffffffff 1dffffffffffff
1 1000000000000 1e01000000000000
1 ffffffffffffff 1effffffffffffff
1 100000000000000 1f0100000000000000
1 ffffffffffffffff 1fffffffffffffffff
ff 0 80ff
ff 1 81ff
ff ff 88ffff
ff 100 89ff0100
ff ffff 89ffffff
ff 10000 8aff010000
ff ffffff 8affffffff
ff 1000000 8bff01000000
ff ffffffff 8bffffffffff
ff 100000000 8cff0100000000
ff ffffffffff 8cffffffffffff
ff 10000000000 8dff010000000000
ff ffffffffffff 8dffffffffffffff
ff 1000000000000 8eff01000000000000
ff ffffffffffffff 8effffffffffffffff
ff 100000000000000 8fff0100000000000000
ff ffffffffffffffff 8fffffffffffffffffff
100 0 900100
100 1 910100
100 ff 980100ff
100 100 9901000100
100 ffff 990100ffff
100 10000 9a0100010000
100 ffffff 9a0100ffffff
100 1000000 9b010001000000
100 ffffffff 9b0100ffffffff
100 100000000 9c01000100000000
100 ffffffffff 9c0100ffffffffff
100 10000000000 9d0100010000000000
100 ffffffffffff 9d0100ffffffffffff
100 1000000000000 9e010001000000000000
100 ffffffffffffff 9e0100ffffffffffffff
100 100000000000000 9f01000100000000000000
100 ffffffffffffffff 9f0100ffffffffffffffff
ffff 0 90ffff
ffff 1 91ffff
ffff ff 98ffffff
ffff 100 99ffff0100
ffff ffff 99ffffffff
ffff 10000 9affff010000
ffff ffffff 9affffffffff
ffff 1000000 9bffff01000000
ffff ffffffff 9bffffffffffff
ffff 100000000 9cffff0100000000
ffff ffffffffff 9cffffffffffffff
ffff 10000000000 9dffff010000000000
ffff ffffffffffff 9dffffffffffffffff
ffff 1000000000000 9effff01000000000000
ffff ffffffffffffff 9effffffffffffffffff
ffff 100000000000000 9fffff0100000000000000
ffff ffffffffffffffff 9fffffffffffffffffffff
10000 0 a0010000
10000 1 a1010000
10000 ff a8010000ff
10000 100 a90100000100
10000 ffff a9010000ffff
10000 10000 aa010000010000
10000 ffffff aa010000ffffff
10000 1000000 ab01000001000000
10000 ffffffff ab010000ffffffff
10000 100000000 ac0100000100000000
10000 ffffffffff ac010000ffffffffff
10000 10000000000 ad010000010000000000
10000 ffffffffffff ad010000ffffffffffff
10000 1000000000000 ae01000001000000000000
10000 ffffffffffffff ae010000ffffffffffffff
10000 100000000000000 af0100000100000000000000
10000 ffffffffffffffff af010000ffffffffffffffff
ffffff 0 a0ffffff
ffffff 1 a1ffffff
ffffff ff a8ffffffff
ffffff 100 a9ffffff0100
ffffff ffff a9ffffffffff
ffffff 10000 aaffffff010000
ffffff ffffff aaffffffffffff
ffffff 1000000 abffffff01000000
ffffff ffffffff abffffffffffffff
ffffff 100000000 acffffff0100000000
ffffff ffffffffff acffffffffffffffff
ffffff 10000000000 adffffff010000000000
ffffff ffffffffffff adffffffffffffffffff
ffffff 1000000000000 aeffffff01000000000000
ffffff ffffffffffffff aeffffffffffffffffffff
ffffff 100000000000000 afffffff0100000000000000
ffffff ffffffffffffffff afffffffffffffffffffffff
1000000 0 b001000000
1000000 1 b101000000
1000000 ff b801000000ff
1000000 100 b9010000000100
1000000 ffff b901000000ffff
1000000 10000 ba01000000010000
1000000 ffffff ba01000000ffffff
1000000 1000000 bb0100000001000000
1000000 ffffffff bb01000000ffffffff
1000000 100000000 bc010000000100000000
1000000 ffffffffff bc01000000ffffffffff
1000000 10000000000 bd01000000010000000000
1000000 ffffffffffff bd01000000ffffffffffff
1000000 1000000000000 be0100000001000000000000
1000000 ffffffffffffff be01000000ffffffffffffff
1000000 100000000000000 bf010000000100000000000000
1000000 ffffffffffffffff bf01000000ffffffffffffffff
ffffffff 0 b0ffffffff
ffffffff 1 b1ffffffff
ffffffff ff b8ffffffffff
ffffffff 100 b9ffffffff0100
ffffffff ffff b9ffffffffffff
ffffffff 10000 baffffffff010000
ffffffff ffffff baffffffffffffff
ffffffff 1000000 bbffffffff01000000
ffffffff ffffffff bbffffffffffffffff
ffffffff 100000000 bcffffffff0100000000
ffffffff ffffffffff bcffffffffffffffffff
ffffffff 10000000000 bdffffffff010000000000
ffffffff ffffffffffff bdffffffffffffffffffff
ffffffff 1000000000000 beffffffff01000000000000
ffffffff ffffffffffffff beffffffffffffffffffffff
ffffffff 100000000000000 bfffffffff0100000000000000
ffffffff ffffffffffffffff bfffffffffffffffffffffffff
100000000 0 c00100000000
100000000 1 c10100000000
100000000 ff c80100000000ff
100000000 100 c901000000000100
100000000 ffff c90100000000ffff
100000000 10000 ca0100000000010000
100000000 ffffff ca0100000000ffffff
100000000 1000000 cb010000000001000000
100000000 ffffffff cb0100000000ffffffff
100000000 100000000 cc01000000000100000000
100000000 ffffffffff cc0100000000ffffffffff
100000000 10000000000 cd0100000000010000000000
100000000 ffffffffffff cd0100000000ffffffffffff
100000000 1000000000000 ce010000000001000000000000
100000000 ffffffffffffff ce0100000000ffffffffffffff
100000000 100000000000000 cf01000000000100000000000000
100000000 ffffffffffffffff cf0100000000ffffffffffffffff
ffffffffff 0 c0ffffffffff
ffffffffff 1 c1ffffffffff
ffffffffff ff c8ffffffffffff
ffffffffff 100 c9ffffffffff0100
ffffffffff ffff c9ffffffffffffff
ffffffffff 10000 caffffffffff010000
ffffffffff ffffff caffffffffffffffff
ffffffffff 1000000 cbffffffffff01000000
ffffffffff ffffffff cbffffffffffffffffff
ffffffffff 100000000 ccffffffffff0100000000
ffffffffff ffffffffff ccffffffffffffffffffff
ffffffffff 10000000000 cdffffffffff010000000000
ffffffffff ffffffffffff cdffffffffffffffffffffff
ffffffffff 1000000000000 ceffffffffff01000000000000
ffffffffff ffffffffffffff ceffffffffffffffffffffffff
ffffffffff 100000000000000 cfffffffffff0100000000000000
ffffffffff ffffffffffffffff cfffffffffffffffffffffffffff
10000000000 0 d0010000000000
10000000000 1 d1010000000000
10000000000 ff d8010000000000ff
10000000000 100 d90100000000000100
10000000000 ffff d9010000000000ffff
10000000000 10000 da010000000000010000
10000000000 ffffff da010000000000ffffff
10000000000 1000000 db01000000000001000000
10000000000 ffffffff db010000000000ffffffff
10000000000 100000000 dc0100000000000100000000
10000000000 ffffffffff dc010000000000ffffffffff
10000000000 10000000000 dd010000000000010000000000
10000000000 ffffffffffff dd010000000000ffffffffffff
10000000000 1000000000000 de01000000000001000000000000
10000000000 ffffffffffffff de010000000000ffffffffffffff
10000000000 100000000000000 df0100000000000100000000000000
10000000000 ffffffffffffffff df010000000000ffffffffffffffff
ffffffffffff 0 d0ffffffffffff
ffffffffffff 1 d1ffffffffffff
ffffffffffff ff d8ffffffffffffff
ffffffffffff 100 d9ffffffffffff0100
ffffffffffff ffff d9ffffffffffffffff
ffffffffffff 10000 daffffffffffff010000
ffffffffffff ffffff daffffffffffffffffff
ffffffffffff 1000000 dbffffffffffff01000000
ffffffffffff ffffffff dbffffffffffffffffffff
ffffffffffff 100000000 dcffffffffffff0100000000
ffffffffffff ffffffffff dcffffffffffffffffffffff
ffffffffffff 10000000000 ddffffffffffff010000000000
ffffffffffff ffffffffffff ddffffffffffffffffffffffff
ffffffffffff 1000000000000 deffffffffffff01000000000000
ffffffffffff ffffffffffffff deffffffffffffffffffffffffff
ffffffffffff 100000000000000 dfffffffffffff0100000000000000
ffffffffffff ffffffffffffffff dfffffffffffffffffffffffffffff
1000000000000 0 e001000000000000
1000000000000 1 e101000000000000
1000000000000 ff e801000000000000ff
1000000000000 100 e9010000000000000100
1000000000000 ffff e901000000000000ffff
1000000000000 10000 ea01000000000000010000
1000000000000 ffffff ea01000000000000ffffff
1000000000000 1000000 eb0100000000000001000000
1000000000000 ffffffff eb01000000000000ffffffff
1000000000000 100000000 ec010000000000000100000000
1000000000000 ffffffffff ec01000000000000ffffffffff
1000000000000 10000000000 ed01000000000000010000000000
1000000000000 ffffffffffff ed01000000000000ffffffffffff
1000000000000 1000000000000 ee0100000000000001000000000000
1000000000000 ffffffffffffff ee01000000000000ffffffffffffff
1000000000000 100000000000000 ef010000000000000100000000000000
1000000000000 ffffffffffffffff ef01000000000000ffffffffffffffff
ffffffffffffff 0 e0ffffffffffffff
ffffffffffffff 1 e1ffffffffffffff
ffffffffffffff ff e8ffffffffffffffff
ffffffffffffff 100 e9ffffffffffffff0100
ffffffffffffff ffff e9ffffffffffffffffff
ffffffffffffff 10000 eaffffffffffffff010000
ffffffffffffff ffffff eaffffffffffffffffffff
ffffffffffffff 1000000 ebffffffffffffff01000000
ffffffffffffff ffffffff ebffffffffffffffffffffff
ffffffffffffff 100000000 ecffffffffffffff0100000000
ffffffffffffff ffffffffff ecffffffffffffffffffffffff
ffffffffffffff 10000000000 edffffffffffffff010000000000
ffffffffffffff ffffffffffff edffffffffffffffffffffffffff
ffffffffffffff 1000000000000 eeffffffffffffff01000000000000
ffffffffffffff ffffffffffffff eeffffffffffffffffffffffffffff
ffffffffffffff 100000000000000 efffffffffffffff0100000000000000
ffffffffffffff ffffffffffffffff efffffffffffffffffffffffffffffff
100000000000000 0 f00100000000000000
100000000000000 1 f10100000000000000
100000000000000 ff f80100000000000000ff
100000000000000 100 f901000000000000000100
100000000000000 ffff f90100000000000000ffff
100000000000000 10000 fa0100000000000000010000
100000000000000 ffffff fa0100000000000000ffffff
100000000000000 1000000 fb010000000000000001000000
100000000000000 ffffffff fb0100000000000000ffffffff
100000000000000 100000000 fc01000000000000000100000000
100000000000000 ffffffffff fc0100000000000000ffffffffff
100000000000000 10000000000 fd0100000000000000010000000000
100000000000000 ffffffffffff fd0100000000000000ffffffffffff
100000000000000 1000000000000 fe010000000000000001000000000000
100000000000000 ffffffffffffff fe0100000000000000ffffffffffffff
100000000000000 100000000000000 ff01000000000000000100000000000000
100000000000000 ffffffffffffffff ff0100000000000000ffffffffffffffff
ffffffffffffffff 0 f0ffffffffffffffff
ffffffffffffffff 1 f1ffffffffffffffff
ffffffffffffffff ff f8ffffffffffffffffff
ffffffffffffffff 100 f9ffffffffffffffff0100
ffffffffffffffff ffff f9ffffffffffffffffffff
ffffffffffffffff 10000 faffffffffffffffff010000
ffffffffffffffff ffffff faffffffffffffffffffffff
ffffffffffffffff 1000000 fbffffffffffffffff01000000
ffffffffffffffff ffffffff fbffffffffffffffffffffffff
ffffffffffffffff 100000000 fcffffffffffffffff0100000000
ffffffffffffffff ffffffffff fcffffffffffffffffffffffffff
ffffffffffffffff 10000000000 fdffffffffffffffff010000000000
ffffffffffffffff ffffffffffff fdffffffffffffffffffffffffffff
ffffffffffffffff 1000000000000 feffffffffffffffff01000000000000
ffffffffffffffff ffffffffffffff feffffffffffffffffffffffffffffff
ffffffffffffffff 100000000000000 ffffffffffffffffff0100000000000000
ffffffffffffffff ffffffffffffffff ffffffffffffffffffffffffffffffffff
"""

    @Test func everyHeaderVectorEncodesAndParses() throws {
        var checked = 0
        for line in Self.headers.split(separator: "\n") {
            let fields = line.split(separator: " ")
            let kid = UInt64(fields[0], radix: 16)!, ctr = UInt64(fields[1], radix: 16)!
            let expected = Self.hex(String(fields[2]))
            let header = SFrameHeader(keyID: kid, counter: ctr)
            #expect(header.size == expected.count, "kid \(kid) ctr \(ctr)")
            var written = [UInt8](repeating: 0, count: SFrameHeader.maxSize)
            let size = written.withUnsafeMutableBytes { header.write(to: $0) }
            #expect(Array(written[..<size]) == expected, "kid \(kid) ctr \(ctr)")
            let parsed = try #require(expected.withUnsafeBytes { SFrameHeader.parse($0) })
            #expect(parsed.header == header && parsed.size == expected.count)
            checked += 1
        }
        #expect(checked == 289)
    }

    @Test func aHeaderCutShortIsRefused() {
        let full = Self.hex("ff" + "0102030405060708" + "1112131415161718")
        for length in 0..<full.count {
            #expect(Array(full[..<length]).withUnsafeBytes { SFrameHeader.parse($0) } == nil, "length \(length)")
        }
        #expect(full.withUnsafeBytes { SFrameHeader.parse($0) }?.size == 17)
    }

    static let baseKey = hex("000102030405060708090a0b0c0d0e0f")
    static let metadata = hex("4945544620534672616d65205747")
    static let plaintext = hex("64726166742d696574662d736672616d652d656e63")
    static let ciphertext = hex("9901234567b7412c2513a1b66dbb48841bbaf17f598751176ad847681a69c6d0b091c07018ce4adb34eb")

    @Test func keyDerivationMatchesSuite4() throws {
        let key = try SFrameKey(baseKey: Self.baseKey, keyID: 0x123, sealing: true)
        #expect(key.key == Self.hex("d34f547f4ca4f9a7447006fe7fcbf768"))
        #expect(key.salt == Self.hex("75234edefe07819026751816"))
    }

    @Test func sealingMatchesSuite4sCiphertext() throws {
        let key = try SFrameKey(baseKey: Self.baseKey, keyID: 0x123, sealing: true)
        let headerSize = SFrameHeader(keyID: 0x123, counter: 0x4567).size
        var frame = [UInt8](repeating: 0, count: headerSize) + Self.plaintext + [UInt8](repeating: 0, count: SFrameKey.tagLength)
        let sealed = frame.withUnsafeMutableBytes { bytes in
            Self.metadata.withUnsafeBytes { key.seal(bytes, counter: 0x4567, metadata: $0) }
        }
        #expect(sealed)
        #expect(frame == Self.ciphertext)
    }

    @Test func openingRecoversSuite4sPlaintextAndRefusesAnyChange() throws {
        let key = try SFrameKey(baseKey: Self.baseKey, keyID: 0x123, sealing: false)
        var frame = Self.ciphertext
        let opened = frame.withUnsafeMutableBytes { bytes in Self.metadata.withUnsafeBytes { key.open(bytes, metadata: $0) } }
        let (header, headerSize) = try #require(opened)
        #expect(header == SFrameHeader(keyID: 0x123, counter: 0x4567))
        #expect(Array(frame[headerSize ..< frame.count - SFrameKey.tagLength]) == Self.plaintext)

        // A flipped bit anywhere (header, ciphertext, tag) or in the metadata fails.
        for index in Self.ciphertext.indices {
            var forged = Self.ciphertext
            forged[index] ^= 0x01
            let result = forged.withUnsafeMutableBytes { bytes in Self.metadata.withUnsafeBytes { key.open(bytes, metadata: $0) } }
            #expect(result == nil, "byte \(index)")
        }
        var other = Self.metadata
        other[0] ^= 0x01
        var copy = Self.ciphertext
        #expect(copy.withUnsafeMutableBytes { bytes in other.withUnsafeBytes { key.open(bytes, metadata: $0) } } == nil)
    }

    @Test func aKeyOpensOnlyItsOwnKeyID() throws {
        let other = try SFrameKey(baseKey: Self.baseKey, keyID: 0x124, sealing: false)
        var frame = Self.ciphertext
        #expect(frame.withUnsafeMutableBytes { bytes in Self.metadata.withUnsafeBytes { other.open(bytes, metadata: $0) } } == nil)
        #expect(throws: SFrameKey.KeyError.badBaseKey) { try SFrameKey(baseKey: [1, 2, 3], keyID: 1, sealing: true) }
    }
}
