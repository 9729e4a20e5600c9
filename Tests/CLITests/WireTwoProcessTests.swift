import Foundation
import NIOCore
import Testing
import Wire
import WireNIO

/// The transport across two real processes on 127.0.0.1: `squelch-bench wire-echo` is the server,
/// this test process the client. Certificates come from the real script; nothing is mocked.
@Suite(.timeLimit(.minutes(2))) struct WireTwoProcessTests {
    /// Starts the echo server; returns the process and its port.
    func startEcho(dir: URL, port: Int = 0) async throws -> (Process, Int) {
        let process = Process()
        process.executableURL = Executables.url("squelch-bench")
        process.arguments = ["wire-echo", "--port", "\(port)", "--cert", dir.path + "/certs/server-chain.pem",
                             "--key", dir.path + "/certs/server.key", "--reset-key", dir.path + "/reset.key"]
        let out = Pipe()
        process.standardOutput = out
        let log = PipeCollector(out)
        try process.run()
        let line = await log.wait(for: #"listening on 127\.0\.0\.1:\d+"#, seconds: 20)
        let portText = try #require(line?.split(separator: ":").last, "wire-echo did not start")
        return (process, try #require(Int(portText)))
    }

    /// Waits for the next event matching `match`, or fails after `seconds`.
    func next(_ events: inout AsyncStream<ClientEvent>.Iterator, seconds: Double = 10,
              _ match: @escaping (ClientEvent) -> Bool) async -> ClientEvent? {
        let deadline = Date().addingTimeInterval(seconds)
        while Date() < deadline {
            guard let event = await events.next() else { return nil }
            if match(event) { return event }
        }
        return nil
    }

    @Test func handshakeEchoRebindAndRecoveryFromARestartByStatelessReset() async throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("wire-2p-\(UUID())")
        try Executables.makeDevCertificates(into: dir.path + "/certs")

        var (server, port) = try await startEcho(dir: dir)
        defer { if server.isRunning { kill(server.processIdentifier, SIGKILL) } }
        let ca = try String(contentsOfFile: dir.path + "/certs/ca.pem", encoding: .utf8)
        let configuration = ClientConfiguration(serverName: "127.0.0.1", validator: try CertificateValidator(caPEM: ca))
        let client = try WireClientChannel(configuration: configuration, server: try SocketAddress(ipAddress: "127.0.0.1", port: port))
        var events = client.events.makeAsyncIterator()
        var datagrams = client.datagrams.makeAsyncIterator()
        try await client.connect()

        func echo(_ text: String) async throws {
            try await client.send(control: Array(text.utf8))
            let reply = await next(&events) { $0 == .connection(.control(Array("echo:\(text)".utf8))) }
            #expect(reply != nil, "no echo of \(text)")
            #expect(await client.send(datagram: Array(text.utf8)))
            #expect(await datagrams.next() == Array(text.utf8))
        }
        try await echo("hello")

        // The client's port changes (a NAT rebinding, or an app resuming): same session, no handshake.
        let before = await client.localAddress()?.port
        try await client.rebind()
        #expect(await client.localAddress()?.port != before)
        try await echo("after rebind")
        #expect(try await client.withClient { $0?.reconnects } == 0)

        // The server crashes and comes back on the same port with the same reset key: the client's
        // next packet draws a stateless reset and it reconnects by itself.
        kill(server.processIdentifier, SIGKILL)
        server.waitUntilExit()
        (server, _) = try await startEcho(dir: dir, port: port)
        try? await client.send(control: Array("anyone?".utf8))
        #expect(await next(&events) { $0 == .reconnecting(.statelessReset) } != nil)
        #expect(await next(&events) { $0 == .connection(.connected) } != nil)
        try await echo("after restart")
        await client.close()
        server.terminate()
        _ = await server.waitForExit(seconds: 10)
    }
}
