import NIOCore
import NIOPosix
import Wire

extension PathAddress {
    /// The `Wire` form of a NIO address, or nil for a Unix domain socket, which UDP never reports.
    /// Reads the `sockaddr` out of NIO's box, so it allocates nothing.
    public init?(_ address: SocketAddress) {
        switch address {
        case .v4(let v4):
            let raw = v4.address
            self.init(ipv4: UInt32(bigEndian: raw.sin_addr.s_addr), port: UInt16(bigEndian: raw.sin_port))
        case .v6(let v6):
            let raw = v6.address
            // `in6_addr` is a union on Glibc and a struct on Darwin; its bytes are the same on both.
            let (high, low) = withUnsafeBytes(of: raw.sin6_addr) { bytes in
                (UInt64(bigEndian: bytes.loadUnaligned(fromByteOffset: 0, as: UInt64.self)),
                 UInt64(bigEndian: bytes.loadUnaligned(fromByteOffset: 8, as: UInt64.self)))
            }
            self.init(ipv6High: high, low: low, port: UInt16(bigEndian: raw.sin6_port))
        case .unixDomainSocket:
            return nil
        }
    }

    /// Whether a UDP socket may send here without an error that NIO treats as fatal for the socket.
    ///
    /// Linux refuses port 0 with EINVAL and broadcast without SO_BROADCAST with EACCES; NIO closes the
    /// whole channel on either (only EMSGSIZE and EHOSTUNREACH are survivable). A spoofed source
    /// address must not be able to make the server send there. Multicast is refused for the same
    /// reason: no legitimate peer has a multicast source address. IPv6 link-local addresses need a
    /// scope ID that `PathAddress` does not carry, so they are sendable only through
    /// `AddressCache`, which keeps the received `SocketAddress` with its scope.
    public var isUnicastSendable: Bool {
        guard port != 0 else { return false }
        if isIPv6 {
            if high >> 56 == 0xFF { return false }  // ff00::/8 multicast
            if high == 0, low == 0 { return false }  // :: unspecified
            return true
        }
        let a = UInt32(truncatingIfNeeded: low)
        if a >> 28 == 0xE { return false }  // 224.0.0.0/4 multicast
        if a == 0xFFFF_FFFF { return false }  // limited broadcast
        return true
    }

    var isIPv6LinkLocal: Bool { isIPv6 && high >> 54 == 0x3FA }  // fe80::/10
}

extension SocketAddress {
    /// The NIO form of a `Wire` address. Allocates (NIO boxes every address); the adapters avoid that
    /// per packet with `AddressCache`.
    public init(_ address: PathAddress) {
        if address.isIPv6 {
            var raw = sockaddr_in6()
            raw.sin6_family = sa_family_t(AF_INET6)
            raw.sin6_port = address.port.bigEndian
            withUnsafeMutableBytes(of: &raw.sin6_addr) { bytes in
                bytes.storeBytes(of: address.high.bigEndian, toByteOffset: 0, as: UInt64.self)
                bytes.storeBytes(of: address.low.bigEndian, toByteOffset: 8, as: UInt64.self)
            }
            self.init(raw, host: "")
        } else {
            var raw = sockaddr_in()
            raw.sin_family = sa_family_t(AF_INET)
            raw.sin_port = address.port.bigEndian
            raw.sin_addr.s_addr = UInt32(truncatingIfNeeded: address.low).bigEndian
            self.init(raw, host: "")
        }
    }
}

/// Maps `PathAddress` back to NIO's `SocketAddress` for sending, reusing the address NIO reported on
/// receive so that replies and fan-out allocate no address per packet. Also the one place that
/// decides whether a destination is safe to write to this socket: a write to the wrong address family
/// or to a broadcast address fails with an errno that closes the NIO channel.
struct AddressCache {
    /// Bounded: a flood of spoofed sources must not grow it without end. Clearing it only costs one
    /// allocation per peer on its next packet.
    static let limit = 16_384
    private var known: [PathAddress: SocketAddress] = [:]
    /// The family of the bound socket; set on bind.
    var socketIsIPv6 = false
    private(set) var refused = 0

    /// Notes where a datagram came from. Returns false for a source the socket must never answer.
    mutating func learn(_ path: PathAddress, _ address: SocketAddress) -> Bool {
        guard path.isUnicastSendable, path.isIPv6 == socketIsIPv6 else { return false }
        if known[path] == nil {
            if known.count >= Self.limit { known.removeAll(keepingCapacity: true) }
            known[path] = address
        }
        return true
    }

    /// The address to write to, or nil (counted) if writing there could close the socket.
    mutating func socketAddress(for path: PathAddress) -> SocketAddress? {
        if let address = known[path] { return address }
        guard path.isUnicastSendable, path.isIPv6 == socketIsIPv6, !path.isIPv6LinkLocal else {
            refused += 1
            return nil
        }
        let address = SocketAddress(path)
        if known.count >= Self.limit { known.removeAll(keepingCapacity: true) }
        known[path] = address
        return address
    }

    mutating func removeAll() { known.removeAll() }
}
