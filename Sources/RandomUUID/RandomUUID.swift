import Foundation

// Random UUIDs and their lowercase text, cheaply: Foundation's own, here, open /dev/urandom per UUID
// and format with sprintf. Used per push by the APNs client (apns-id) and the simulator (its ids).

extension UUID {
    /// A random (version 4) UUID from one `arc4random_buf` (glibc's: one getrandom(2)). Foundation's
    /// `UUID()` opens and reads /dev/urandom each time here, which was a tenth of an APNs push's CPU.
    public static func randomVersion4() -> UUID {
        var bytes: uuid_t = (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
        withUnsafeMutableBytes(of: &bytes) { raw in arc4random_buf(raw.baseAddress!, raw.count) }
        return version4(bytes)
    }

    /// `count` random (version 4) UUIDs from one `arc4random_buf`: here glibc's makes a getrandom(2)
    /// call each time, which for a burst's wakes was a fiftieth of the APNs client's CPU per push.
    public static func randomVersion4(count: Int) -> [UUID] {
        var random = [uuid_t](repeating: (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), count: max(count, 0))
        random.withUnsafeMutableBytes { raw in if raw.count > 0 { arc4random_buf(raw.baseAddress!, raw.count) } }
        return random.map(version4)
    }

    /// 16 random bytes as a version 4 UUID: its version and variant bits set.
    static func version4(_ random: uuid_t) -> UUID {
        var bytes = random
        bytes.6 = bytes.6 & 0x0F | 0x40  // version 4
        bytes.8 = bytes.8 & 0x3F | 0x80  // RFC 9562 variant
        return UUID(uuid: bytes)
    }

    /// `uuidString.lowercased()` without either: Foundation formats `uuidString` with sprintf here,
    /// and two per APNs push were a twentieth of its CPU.
    public var lowercaseString: String {
        let hex: StaticString = "0123456789abcdef"
        return withUnsafeBytes(of: uuid) { raw in
            String(unsafeUninitializedCapacity: 36) { out in
                hex.withUTF8Buffer { digits in
                    var at = 0
                    for (index, byte) in raw.enumerated() {
                        if index == 4 || index == 6 || index == 8 || index == 10 {
                            out[at] = UInt8(ascii: "-")
                            at += 1
                        }
                        out[at] = digits[Int(byte >> 4)]
                        out[at + 1] = digits[Int(byte & 0x0F)]
                        at += 2
                    }
                }
                return 36
            }
        }
    }
}
