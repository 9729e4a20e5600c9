import ChannelProtocol
import Foundation

/// Where a channel lives and how to get in: the squelchd voice address, the CA that signs its
/// certificate, and a participant token. Apple's API has no counterpart because iOS apps bring their
/// own server connection; this library is that connection.
public struct ChannelCredentials: Sendable, Hashable, Codable {
    public var host: String
    public var port: Int
    /// The name the server's certificate must carry; the host when nil.
    public var serverName: String?
    /// PEM file of the CA that signs squelchd's certificate (`certs/ca.pem` in development). A
    /// relative path given to `init` is made absolute against the current directory: the credentials
    /// are saved for restoration, and an app restored from another directory must still find it.
    public var caPath: String
    /// The participant token (`squelchd token issue`).
    public var token: String

    public init(host: String, port: Int, serverName: String? = nil, caPath: String, token: String) {
        self.host = host
        self.port = port
        self.serverName = serverName
        self.caPath = caPath.hasPrefix("/") || caPath.isEmpty
            ? caPath : URL(fileURLWithPath: caPath, relativeTo: URL(fileURLWithPath: FileManager.default.currentDirectoryPath, isDirectory: true)).standardizedFileURL.path
        self.token = token
    }

    /// The server's address as a person types it: `host:port`, an IPv6 address in brackets.
    public var address: String { host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)" }
}
