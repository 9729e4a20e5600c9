import Foundation

// Random UUIDs and their lowercase text, cheaply: Foundation's own, here, open /dev/urandom per UUID
// and format with sprintf. Used per push by the APNs client (apns-id) and the simulator (its ids).

extension UUID {
    /// A random (version 4) UUID from one `arc4random_buf` (glibc's: one getrandom(2)). Foundation's
    /// `UUID()` opens and reads /dev/urandom each time here, which was a tenth of an APNs push's CPU.
    public static func randomVersion4() -> UUID {
        var bytes: uuid_t = (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
        withUnsafeMutableBytes(of: &bytes) { raw in arc4random_buf(raw.baseAddress!, raw.count) }
        bytes.6 = bytes.6 & 0x0F | 0x40  // version 4
        bytes.8 = bytes.8 & 0x3F | 0x80  // RFC 9562 variant
        return UUID(uuid: bytes)
    }

    /// `count` random (version 4) UUIDs from one `arc4random_buf`: here glibc's makes a getrandom(2)
    /// call each time, which for a burst's wakes was a fiftieth of the APNs client's CPU per push.
    public static func randomVersion4(count: Int) -> [UUID] {
        guard count > 0 else { return [] }
        var bytes = [UInt8](repeating: 0, count: 16 * count)
        bytes.withUnsafeMutableBytes { arc4random_buf($0.baseAddress!, $0.count) }
        return (0 ..< count).map { index in
            let at = 16 * index
            return UUID(uuid: (bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3], bytes[at + 4], bytes[at + 5],
                               bytes[at + 6] & 0x0F | 0x40, bytes[at + 7], bytes[at + 8] & 0x3F | 0x80, bytes[at + 9],
                               bytes[at + 10], bytes[at + 11], bytes[at + 12], bytes[at + 13], bytes[at + 14], bytes[at + 15]))
        }
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
