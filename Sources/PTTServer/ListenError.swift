import Foundation
import NIOCore

/// A listener that could not open its socket at start: the UDP voice port or the admin API's TCP port.
/// Its description is one line that names the address, the reason and the setting to change, which
/// `squelchd serve` prints before exiting 78 (EX_CONFIG), instead of NIO's
/// "bind(descriptor:ptr:bytes:): Address already in use".
public struct ListenError: Error, CustomStringConvertible {
    /// The listener, as the message names it: "the voice transport (UDP)".
    public var listener: String
    /// The address it was to listen on, as configured.
    public var host: String
    public var port: Int
    /// What NIO reported (an `IOError` with its errno, or an unresolvable host name).
    public var underlying: any Error
    /// Settings keys (`ServerConfiguration.settings`) for the host and the port.
    var hostKey: String
    var portKey: String

    /// Whether `error` is one of a socket that could not be opened (NIO's `IOError`, or a host name
    /// that does not resolve), rather than something else going wrong at start.
    static func isBindFailure(_ error: any Error) -> Bool {
        error is IOError || error is SocketAddressError || error is SocketAddressError.UnknownHost
    }

    static func voice(host: String, port: Int, _ error: any Error) -> ListenError {
        ListenError(listener: "the voice transport (UDP)", host: host, port: port, underlying: error, hostKey: "host", portKey: "port")
    }

    static func admin(host: String, port: Int, _ error: any Error) -> ListenError {
        ListenError(listener: "the admin API (TCP)", host: host, port: port, underlying: error, hostKey: "adminHost", portKey: "adminPort")
    }

    static func devicePush(host: String, port: Int, _ error: any Error) -> ListenError {
        ListenError(listener: "the device push service (TCP)", host: host, port: port, underlying: error, hostKey: "host", portKey: "devicePushPort")
    }

    public var description: String {
        let at = "\(listener) can't listen on \(host.contains(":") ? "[\(host)]" : host):\(port)"
        let portHow = ServerConfiguration.setting(portKey).howToSet
        let hostHow = ServerConfiguration.setting(hostKey).howToSet
        if underlying is SocketAddressError.UnknownHost {
            return "\(at): the host name does not resolve; set an address or a name this machine knows with \(hostHow)"
        }
        switch (underlying as? IOError)?.errnoCode {
        case EADDRINUSE?:
            return "\(at): the port is in use (another squelchd?); stop that process or choose another port with \(portHow)"
        case EACCES?:
            return "\(at): permission denied (ports below 1024 need root or CAP_NET_BIND_SERVICE; a security policy may forbid others); choose another port with \(portHow)"
        case EADDRNOTAVAIL?:
            return "\(at): this machine has no such address; set one it has (or 0.0.0.0, or :: for IPv6) with \(hostHow)"
        default:
            return "\(at): \(underlying); check \(hostHow) and \(portHow)"
        }
    }
}
