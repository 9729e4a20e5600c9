import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// An HTTP client that sends a request's headers and a tenth of the body it announced, then stalls
/// with the connection open: what a hung or hostile admin client does to a server that is stopping.
/// The connection closes when this is released.
public final class StalledRequest: Sendable {
    private let descriptor: Int32

    /// Nil if the connection or the send failed.
    public init?(port: Int, authorization: String) {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { return nil }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        let request = "POST /v1/channels HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: \(authorization)\r\n"
            + "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"name\": \"x"
        guard connected == 0,
              Array(request.utf8).withUnsafeBytes({ send(fd, $0.baseAddress, $0.count, 0) }) == request.utf8.count else {
            close(fd)
            return nil
        }
        descriptor = fd
    }

    deinit { close(descriptor) }
}
