/// A point on a monotonic clock, in nanoseconds from an arbitrary origin. The sans-I/O core never
/// reads a clock: every call that depends on time takes one of these, so tests can drive time.
public struct WireInstant: Comparable, Hashable, Sendable, CustomStringConvertible {
    public var nanoseconds: UInt64
    public init(nanoseconds: UInt64) { self.nanoseconds = nanoseconds }
    public static func < (a: Self, b: Self) -> Bool { a.nanoseconds < b.nanoseconds }
    public static func + (a: Self, ns: UInt64) -> Self { Self(nanoseconds: a.nanoseconds &+ ns) }
    /// Nanoseconds from `earlier` to self, or 0 if `earlier` is later.
    public func since(_ earlier: Self) -> UInt64 { nanoseconds > earlier.nanoseconds ? nanoseconds - earlier.nanoseconds : 0 }
    public var description: String { "\(Double(nanoseconds) / 1e6) ms" }
}

/// Nanosecond helpers, so durations read as what they are.
@inline(__always) func ms(_ value: UInt64) -> UInt64 { value * 1_000_000 }
@inline(__always) func seconds(_ value: UInt64) -> UInt64 { value * 1_000_000_000 }

/// A UDP peer address, independent of any socket library: the adapter converts to and from its own.
public struct PathAddress: Hashable, Sendable, CustomStringConvertible {
    /// IPv4 addresses use the low 32 bits of `low`.
    public var high: UInt64
    public var low: UInt64
    public var port: UInt16
    public var isIPv6: Bool

    public init(ipv4: UInt32, port: UInt16) {
        high = 0; low = UInt64(ipv4); self.port = port; isIPv6 = false
    }

    public init(ipv6High: UInt64, low: UInt64, port: UInt16) {
        high = ipv6High; self.low = low; self.port = port; isIPv6 = true
    }

    /// Who sent it, for per-source limits: the IPv4 address, or the IPv6 /64. One host, or one
    /// subscriber's network, holds a whole /64, so a limit per IPv6 address would limit nothing.
    /// Addresses that carry an IPv4 client in their low bits count by the whole address: IPv4-mapped
    /// (`::ffff:a.b.c.d`, every IPv4 client of a dual-stack `::` socket, all in `::/64`) and Teredo
    /// (`2001:0::/32`, whose clients share their relay's /64).
    public var source: PathAddress {
        guard isIPv6 else { return PathAddress(ipv4: UInt32(truncatingIfNeeded: low), port: 0) }
        let mapped = high == 0 && low >> 32 == 0xFFFF
        let teredo = high >> 32 == 0x2001_0000
        return PathAddress(ipv6High: high, low: mapped || teredo ? low : 0, port: 0)
    }

    /// The wider IPv6 networks a source belongs to, for rate limits that hold when one party spreads
    /// over many /64s: its /56 (a home or small site) and /48 (a site), each a key that differs from
    /// every `source` and from each other (the prefix length rides in the port). None for IPv4 and
    /// for addresses that carry an IPv4 client.
    public var wideSources: [PathAddress] {
        let source = self.source
        guard source.isIPv6, source.low == 0 else { return [] }
        return [PathAddress(ipv6High: high & ~0xFF, low: 0, port: 56), PathAddress(ipv6High: high & ~0xFFFF, low: 0, port: 48)]
    }

    /// Same host, maybe another port: NAT rebinding, which keeps RTT state (RFC 9000 §9.4).
    public func sameHost(as other: Self) -> Bool { high == other.high && low == other.low && isIPv6 == other.isIPv6 }

    public var description: String {
        if !isIPv6 {
            let a = UInt32(truncatingIfNeeded: low)
            return "\(a >> 24).\(a >> 16 & 0xFF).\(a >> 8 & 0xFF).\(a & 0xFF):\(port)"
        }
        let words = (0..<8).map { i -> String in
            let source = i < 4 ? high : low
            return String(UInt16(truncatingIfNeeded: source >> UInt64(48 - 16 * (i % 4))), radix: 16)
        }
        return "[\(words.joined(separator: ":"))]:\(port)"
    }
}
