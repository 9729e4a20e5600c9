#if canImport(Glibc)
import Glibc
#endif

/// A socket bound to a free port on 127.0.0.1 and held until this is released: the port "another
/// process" has, for tests of what happens when a server can't have it (UDP), or of a peer that
/// completes TCP and then says nothing (TCP, listening, never accepting: the kernel finishes the
/// handshakes into the backlog).
public final class HeldPort: Sendable {
    public let port: Int
    private let descriptor: Int32

    /// Nil if the socket could not be made or bound.
    public init?(tcpListening: Bool) {
        let fd = socket(AF_INET, Int32(tcpListening ? SOCK_STREAM.rawValue : SOCK_DGRAM.rawValue), 0)
        guard fd >= 0 else { return nil }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(fd, $0, length) == 0 && (!tcpListening || listen(fd, 8) == 0) && getsockname(fd, $0, &length) == 0
            }
        }
        guard bound else { close(fd); return nil }
        descriptor = fd
        port = Int(UInt16(bigEndian: address.sin_port))
    }

    deinit { close(descriptor) }
}
