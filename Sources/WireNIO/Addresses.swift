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

extension PathAddress {
    var sockaddrIPv4: sockaddr_in {
        var raw = sockaddr_in()
        raw.sin_family = sa_family_t(AF_INET)
        raw.sin_port = port.bigEndian
        raw.sin_addr.s_addr = UInt32(truncatingIfNeeded: low).bigEndian
        return raw
    }

    var sockaddrIPv6: sockaddr_in6 {
        var raw = sockaddr_in6()
        raw.sin6_family = sa_family_t(AF_INET6)
        raw.sin6_port = port.bigEndian
        withUnsafeMutableBytes(of: &raw.sin6_addr) { bytes in
            bytes.storeBytes(of: high.bigEndian, toByteOffset: 0, as: UInt64.self)
            bytes.storeBytes(of: low.bigEndian, toByteOffset: 8, as: UInt64.self)
        }
        return raw
    }
}

extension SocketAddress {
    /// The NIO form of a `Wire` address. Allocates (NIO boxes every address); the adapters avoid that
    /// per packet with `AddressCache`.
    public init(_ address: PathAddress) {
        if address.isIPv6 {
            self.init(address.sockaddrIPv6, host: "")
        } else {
            self.init(address.sockaddrIPv4, host: "")
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

    /// Writes the `sockaddr` to send to into `target` (at least 28 bytes, 4-aligned) and returns its
    /// length, or nil (counted) if writing there could close the socket or fail. Builds it from the
    /// `PathAddress` without a lookup, except for IPv6 link-local peers, whose scope only the received
    /// address carries.
    mutating func writeSockaddr(for path: PathAddress, into target: UnsafeMutableRawPointer) -> Int? {
        guard path.isUnicastSendable, path.isIPv6 == socketIsIPv6 else {
            refused += 1
            return nil
        }
        if path.isIPv6LinkLocal {
            guard let address = known[path] else {
                refused += 1
                return nil
            }
            return address.withSockAddr { raw, length in
                guard length <= MemoryLayout<sockaddr_in6>.size else { return nil }
                target.copyMemory(from: raw, byteCount: length)
                return length
            }
        }
        if path.isIPv6 {
            target.storeBytes(of: path.sockaddrIPv6, as: sockaddr_in6.self)
            return MemoryLayout<sockaddr_in6>.size
        }
        target.storeBytes(of: path.sockaddrIPv4, as: sockaddr_in.self)
        return MemoryLayout<sockaddr_in>.size
    }

    mutating func removeAll() { known.removeAll() }
}
