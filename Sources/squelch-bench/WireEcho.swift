import ArgumentParser
import Crypto
import Foundation
import NIOCore
import Wire
import WireNIO

/// A transport echo server in its own process: control messages come back prefixed "echo:", datagrams
/// come back as they are. Tests use it to check the transport across two processes (handshake, port
/// rebinding, restart with stateless reset); load generators use it as a far end.
struct WireEcho: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "wire-echo",
        abstract: "Run a Wire echo server until killed (transport tests and load generation).")

    @Option(help: "Address to bind.") var host = "127.0.0.1"
    @Option(help: "UDP port (0 picks one; the bound port is printed).") var port = 0
    @Option(help: "Server certificate chain (PEM).") var cert = "certs/server-chain.pem"
    @Option(help: "Server private key (PEM).") var key = "certs/server.key"
    @Option(help: "File holding the 32-byte stateless-reset key; created if missing. Keep it across restarts.")
    var resetKey = "wire-reset.key"

    func run() async throws {
        let identity: ServerIdentity
        do { identity = try ServerIdentity.load(chainPath: cert, keyPath: key) } catch {
            throw ValidationError("\(error)")
        }
        let secrets = ServerSecrets(identity: identity, resetKey: try loadResetKey())
        let server = try await WireServer.start(host: host, port: port, secrets: secrets, delegate: EchoDelegate())
        // Written unbuffered: a test reads the port from this line through a pipe.
        FileHandle.standardOutput.write(Data("wire-echo listening on \(host):\(server.localAddress.port ?? 0)\n".utf8))
        while true { try await Task.sleep(for: .seconds(3_600)) }
    }

    /// Reads the reset key, or makes one readable only by this user. Losing it only means that old
    /// clients wait for their idle timeout instead of being reset after a restart.
    func loadResetKey() throws -> SymmetricKey {
        if let data = FileManager.default.contents(atPath: resetKey) {
            guard data.count == 32 else { throw ValidationError("\(resetKey) holds \(data.count) bytes, not 32; delete it to make a new one") }
            return SymmetricKey(data: data)
        }
        let key = SymmetricKey(size: .bits256)
        let bytes = key.withUnsafeBytes { Data($0) }
        guard FileManager.default.createFile(atPath: resetKey, contents: bytes, attributes: [.posixPermissions: 0o600]) else {
            throw ValidationError("cannot write \(resetKey); pass --reset-key with a writable path")
        }
        return key
    }
}

/// Echoes on the event loop. Stateless, so sharing it across the loop is safe.
final class EchoDelegate: WireServerDelegate {
    func wireServer(_ server: WireServer, handle: Endpoint.Handle, event: ConnectionEvent) {
        if case .control(let message) = event { try? server.sendControl(Array("echo:".utf8) + message, to: handle) }
    }

    func wireServer(_ server: WireServer, handle: Endpoint.Handle, datagram payload: UnsafeRawBufferPointer) {
        server.sendDatagram(payload, to: handle)
    }
}
