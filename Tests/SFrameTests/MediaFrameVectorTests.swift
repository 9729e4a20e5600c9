import ChannelProtocol
import MediaFrames
import SFrame
import Testing
import Wire

/// docs/protocol.md §15.8: one media frame as a talker seals it, as the relay wraps it for a listener,
/// and as the listener opens it. The bytes were computed independently (Python's `cryptography`,
/// RFC 9605's derivation), not by this code.
@Suite struct MediaFrameVectorTests {
    static let hex = SFrameVectorTests.hex
    static let baseKey = hex("000102030405060708090a0b0c0d0e0f")
    static let sealed = hex("41000000123400071083a5d48526c1ab1181b65bd66dc2ba1b3318ddfac665a8")
    static let envelope = hex("2a010203040506070841000003123400071083a5d48526c1ab1181b65bd66dc2ba1b3318ddfac665a8")
    static let key = MediaKey(slot: 3, burst: 0x1234, keyID: 1, key: baseKey)

    @Test func aTalkerSealsTheVector() {
        var buffer = [UInt8](repeating: 0, count: 256)
        let length = buffer.withUnsafeMutableBytes { out in
            Array("Squelch".utf8).withUnsafeBytes {
                MediaSealer().seal(AudioHeader(burst: 0x1234, sequence: 7), payload: $0, key: Self.key, into: out)
            }
        }
        #expect(length.map { Array(buffer[..<$0]) } == Self.sealed)
    }

    @Test func theRelayWrapsItAndTheListenerOpensIt() throws {
        // The relay sets the talker's slot (3) and passes the sealed frame on unchanged.
        var relayed = Self.sealed
        relayed[3] = 3
        var buffer = [UInt8](repeating: 0, count: 256)
        let length = buffer.withUnsafeMutableBytes { out in
            relayed.withUnsafeBytes { MediaEnvelope.write($0, to: ConnectionID(0x0102_0304_0506_0708), into: out) }
        }
        #expect(length.map { Array(buffer[..<$0]) } == Self.envelope)
        let media = try #require(Self.envelope.withUnsafeBytes { MediaEnvelope.parse($0) })
        #expect(media.destination == ConnectionID(0x0102_0304_0506_0708) && Array(Self.envelope[media.media]) == relayed)

        let keyring = MediaKeyring()
        _ = keyring.add(Self.key)
        var opened: (AudioHeader, [UInt8])?
        _ = relayed.withUnsafeBytes { keyring.open($0, now: 0) { opened = ($0, Array($1)) } }
        #expect(opened?.0 == AudioHeader(slot: 3, burst: 0x1234, sequence: 7))
        #expect(opened?.1 == Array("Squelch".utf8))
    }

    @Test func aListenerRefusesWhatTheKeyDoesNotCover() {
        let keyring = MediaKeyring()
        _ = keyring.add(Self.key)
        // Another talker's slot, another sequence, an end-of-burst flag added, a changed byte.
        var tampered: [[UInt8]] = []
        for (index, value) in [(3, UInt8(4)), (7, UInt8(8)), (1, UInt8(1)), (20, Self.sealed[20] ^ 1)] {
            var copy = Self.sealed
            copy[3] = 3
            copy[index] = value
            tampered.append(copy)
        }
        for datagram in tampered {
            var heard = false
            _ = datagram.withUnsafeBytes { keyring.open($0, now: 0) { _, _ in heard = true } }
            #expect(!heard, "\(datagram)")
        }
        // The catch-up flag is the relay's, outside the seal: it changes nothing the talker said.
        var replayed = Self.sealed
        replayed[3] = 3
        replayed[1] = AudioHeader.Flags.catchUp.rawValue
        var heard = false
        _ = replayed.withUnsafeBytes { keyring.open($0, now: 0) { header, _ in heard = header.flags.contains(.catchUp) } }
        #expect(heard)
    }

    @Test func aFrameThatBeatsItsKeyWaitsForItButNotForever() {
        let keyring = MediaKeyring()
        var relayed = Self.sealed
        relayed[3] = 3
        var heard = 0
        _ = relayed.withUnsafeBytes { keyring.open($0, now: 0) { _, _ in heard += 1 } }
        #expect(heard == 0)
        let ready = keyring.add(Self.key)
        #expect(ready == [relayed])
        for datagram in ready { _ = datagram.withUnsafeBytes { keyring.open($0, now: 1) { _, _ in heard += 1 } } }
        #expect(heard == 1)

        // One that waits past its time is refused, not kept.
        let later = MediaKeyring()
        _ = relayed.withUnsafeBytes { later.open($0, now: 0) { _, _ in } }
        var other = relayed
        other[8] = 0x20  // key ID 2: it waits too, and its arrival expires the first
        _ = other.withUnsafeBytes { later.open($0, now: MediaKeyring.waitNanoseconds + 1) { _, _ in } }
        #expect(later.add(Self.key).isEmpty)
        #expect(later.refused >= 1)
    }

    /// Seals `payload` as a talker of slot 3 would for `sequence`, under `key`, with `counter`.
    static func relayed(_ key: MediaKey, sequence: UInt16, counter: UInt64, flags: AudioHeader.Flags = []) -> [UInt8] {
        var buffer = [UInt8](repeating: 0, count: 256)
        let length = buffer.withUnsafeMutableBytes { out in
            Array("Squelch".utf8).withUnsafeBytes {
                MediaSealer(counter: counter).seal(AudioHeader(flags: flags, burst: key.burst, sequence: sequence), payload: $0, key: key, into: out)
            }
        }!
        buffer[3] = UInt8(key.slot)
        return Array(buffer[..<length])
    }

    static func opens(_ keyring: MediaKeyring, _ datagram: [UInt8], now: UInt64 = 0) -> Bool {
        datagram.withUnsafeBytes { keyring.open($0, now: now) { _, _ in } }
    }

    @Test func aFrameOpensOnceNotAgain() {
        let keyring = MediaKeyring()
        _ = keyring.add(Self.key)
        let frame = Self.relayed(Self.key, sequence: 1, counter: 9)
        #expect(Self.opens(keyring, frame))
        #expect(!Self.opens(keyring, frame), "a replay, by anyone on the path")
        #expect(Self.opens(keyring, Self.relayed(Self.key, sequence: 2, counter: 10)))
    }

    @Test func anOlderKeyOfTheBurstTakesNothingSaidAfterTheNewerOneBegan() {
        // A member removed mid-burst keeps the first key; what the talker says under the second
        // can't be forged with it.
        let keyring = MediaKeyring()
        let newer = MediaKey(slot: 3, burst: 0x1234, keyID: 2, key: [UInt8](repeating: 9, count: 16))
        _ = keyring.add(Self.key)
        _ = keyring.add(newer)
        #expect(Self.opens(keyring, Self.relayed(Self.key, sequence: 10, counter: 1)))
        #expect(Self.opens(keyring, Self.relayed(newer, sequence: 12, counter: 2)))
        #expect(Self.opens(keyring, Self.relayed(Self.key, sequence: 11, counter: 3)), "said before the switch, arriving late")
        #expect(!Self.opens(keyring, Self.relayed(Self.key, sequence: 12, counter: 4)))
        #expect(!Self.opens(keyring, Self.relayed(Self.key, sequence: 40, counter: 5)))
        #expect(Self.opens(keyring, Self.relayed(newer, sequence: 13, counter: 6)))
    }

    @Test func aBurstsKeysGoAWhileAfterItsEnd() {
        let keyring = MediaKeyring()
        _ = keyring.add(Self.key)
        #expect(Self.opens(keyring, Self.relayed(Self.key, sequence: 1, counter: 1, flags: .endOfBurst), now: 0))
        #expect(Self.opens(keyring, Self.relayed(Self.key, sequence: 0, counter: 0), now: 1_000_000_000), "a straggler soon after")
        #expect(!Self.opens(keyring, Self.relayed(Self.key, sequence: 2, counter: 2), now: MediaKeyring.endedKeyLife + 1))
    }

    @Test func aKeyTravelsAsADatagramAndNothingElseReadsAsOne() {
        let datagram = Self.key.datagram
        #expect(datagram.count == MediaKey.datagramSize && datagram[0] == MediaKey.datagramKind)
        #expect(datagram.withUnsafeBytes { MediaKey(datagram: $0) } == Self.key)
        // One byte short or long, audio, a key ID above 2^53: not a key.
        #expect(Array(datagram.dropLast()).withUnsafeBytes { MediaKey(datagram: $0) } == nil)
        #expect((datagram + [0]).withUnsafeBytes { MediaKey(datagram: $0) } == nil)
        #expect(Self.sealed.withUnsafeBytes { MediaKey(datagram: $0) } == nil)
        var huge = datagram
        huge[5] = 0xFF
        #expect(huge.withUnsafeBytes { MediaKey(datagram: $0) } == nil)
    }
}
