import Foundation

/// Everything `squelchd serve` needs to start. Defaults are safe: everything binds to 127.0.0.1.
public struct ServerConfiguration: Sendable {
    /// Where the database and generated keys live. Created (mode 0700) if missing.
    public var dataDirectory: String = "data"
    /// Admin HTTP API address. Keep it on loopback unless it sits behind an authenticating proxy.
    public var adminHost: String = "127.0.0.1"
    /// Admin HTTP API port; 0 picks a free port (tests).
    public var adminPort: Int = 7780
    /// PEM chain the transport presents (leaf first).
    public var certificateChainPath: String = "certs/server-chain.pem"
    /// PEM private key of the leaf certificate.
    public var privateKeyPath: String = "certs/server.key"

    public init() {}

    public enum ConfigurationError: Error, CustomStringConvertible {
        case badPort(Int)
        case dataDirectory(path: String, reason: String)

        public var description: String {
            switch self {
            case .badPort(let port):
                return "admin port \(port) is out of range; use 1-65535, or 0 for any free port"
            case .dataDirectory(let path, let reason):
                return "data directory \(path): \(reason); pass a writable directory with --data-dir"
            }
        }
    }

    /// Checks the values and creates the data directory.
    public func prepare() throws(ConfigurationError) {
        guard (0...65_535).contains(adminPort) else { throw .badPort(adminPort) }
        var isDirectory: ObjCBool = false
        if FileManager.default.fileExists(atPath: dataDirectory, isDirectory: &isDirectory) {
            guard isDirectory.boolValue else { throw .dataDirectory(path: dataDirectory, reason: "it exists but is not a directory") }
        } else {
            do {
                try FileManager.default.createDirectory(atPath: dataDirectory, withIntermediateDirectories: true,
                                                        attributes: [.posixPermissions: 0o700])
            } catch {
                throw .dataDirectory(path: dataDirectory, reason: "cannot create it (\(error.localizedDescription))")
            }
        }
        guard FileManager.default.isWritableFile(atPath: dataDirectory) else {
            throw .dataDirectory(path: dataDirectory, reason: "it is not writable")
        }
    }
}
