import Foundation
import ImpairmentKit
import NIOConcurrencyHelpers
import NIOCore
import Testing

@testable import impairment_proxy

@Suite("impairment-proxy command line")
struct CommandLineTests {
    @Test("the documented example parses into the same impairment for both directions")
    func example() throws {
        let options = try Options.parse(
            "--listen 0 --upstream 127.0.0.1:7700 --loss 10 --delay 20 --jitter 30 --reorder 1 --duplicate 1 --seed 42"
                .split(separator: " ").map(String.init))
        let expected = Impairment(
            lossPercent: 10, delayMilliseconds: 20, jitterMilliseconds: 30, reorderPercent: 1, duplicatePercent: 1,
            seed: 42)
        #expect(options.listenHost == "127.0.0.1" && options.listenPort == 0)
        #expect(options.upstreamHost == "127.0.0.1" && options.upstreamPort == 7700)
        #expect(options.clientToServer == expected && options.serverToClient == expected)
    }

    @Test("--up- and --down- set one direction; burst loss, shapes and host forms parse")
    func perDirection() throws {
        let options = try Options.parse([
            "--upstream=[::1]:9000", "--listen", "0.0.0.0:7000", "--loss", "5", "--down-loss", "20",
            "--up-burst-enter", "0.05", "--up-burst-stay", "0.7", "--jitter-dist", "normal", "--down-unordered",
            "--reorder-delay", "60",
        ])
        #expect(options.upstreamHost == "::1" && options.upstreamPort == 9000)
        #expect(options.listenHost == "0.0.0.0" && options.listenPort == 7000)
        #expect(options.clientToServer.lossPercent == 5 && options.serverToClient.lossPercent == 20)
        #expect(options.clientToServer.burstLoss == BurstLoss(enterProbability: 0.05, stayProbability: 0.7))
        #expect(options.serverToClient.burstLoss == nil)
        #expect(options.clientToServer.jitterDistribution == .normal)
        #expect(options.clientToServer.preservesOrder && !options.serverToClient.preservesOrder)
        #expect(options.serverToClient.reorderDelayMilliseconds == 60)
    }

    @Test("bad command lines are rejected", arguments: [
        [], ["--loss", "10"], ["--upstream", "nohost"], ["--upstream", "127.0.0.1:99999"],
        ["--upstream", "127.0.0.1:1", "--loss", "ten"], ["--upstream", "127.0.0.1:1", "--frobnicate", "1"],
        ["--upstream", "127.0.0.1:1", "--burst-enter", "0.1"], ["--upstream", "127.0.0.1:1", "--seed", "-1"],
        ["--upstream", "127.0.0.1:1", "--delay"], ["--upstream", "127.0.0.1:1", "stray"],
    ])
    func rejects(arguments: [String]) {
        #expect(throws: Options.ParseError.self) { try Options.parse(arguments) }
    }

    @Test("the binary listens, relays, rebinds on SIGUSR1 and prints stats on SIGINT")
    func endToEnd() async throws {
        let echo = try await UDPPeer.bind(echo: true)
        let client = try await UDPPeer.bind(echo: false)
        let child = try Child(["--listen", "0", "--upstream", "127.0.0.1:\(echo.port)", "--delay", "5", "--seed", "42"])

        let listening = await waitUntil(timeout: .seconds(20)) { child.output.contains("listening 127.0.0.1:") }
        try #require(listening, "no listening line; stderr: \(child.errors)")
        let line = try #require(child.output.split(separator: "\n").first { $0.hasPrefix("listening ") })
        let port = try #require(Int(line.split(separator: ":").last ?? ""))
        let proxy = try SocketAddress(ipAddress: "127.0.0.1", port: port)

        client.send([1], to: proxy)
        #expect(await client.waitFor(count: 1).count == 1)

        kill(child.process.processIdentifier, SIGUSR1)
        #expect(await waitUntil(timeout: .seconds(5)) { child.output.contains("rebound 1 client(s)") })
        client.send([2], to: proxy)
        #expect(await client.waitFor(count: 2).count == 2)
        let sources = echo.received.map(\.from.port)
        #expect(sources.count == 2 && sources[0] != sources[1])

        kill(child.process.processIdentifier, SIGINT)
        #expect(await waitUntil(timeout: .seconds(5)) { !child.process.isRunning })
        #expect(child.process.terminationStatus == 0)
        #expect(await waitUntil(timeout: .seconds(2)) { child.output.contains("stats proxy") })
        #expect(child.output.contains("stats c2s received=2 forwarded=2 dropped=0"))
        #expect(child.output.contains("stats s2c received=2 forwarded=2"))
        #expect(child.output.contains("stats proxy clients=1 rebinds=1"))
        await client.close()
        await echo.close()
    }
}

/// The built `impairment-proxy` binary, run as a child with its output collected.
private final class Child: Sendable {
    let process: Process
    private let stdout = NIOLockedValueBox("")
    private let stderr = NIOLockedValueBox("")

    init(_ arguments: [String]) throws {
        let process = Process()
        process.executableURL = Self.executable
        process.arguments = arguments
        let out = Pipe()
        let err = Pipe()
        process.standardOutput = out
        process.standardError = err
        for (pipe, box) in [(out, stdout), (err, stderr)] {
            pipe.fileHandleForReading.readabilityHandler = { handle in
                let text = String(decoding: handle.availableData, as: UTF8.self)
                box.withLockedValue { $0 += text }
            }
        }
        try process.run()
        self.process = process
    }

    deinit {
        if process.isRunning { process.terminate() }
    }

    var output: String { stdout.withLockedValue { $0 } }
    var errors: String { stderr.withLockedValue { $0 } }

    /// SwiftPM puts the executable next to the test bundle.
    static var executable: URL {
        let bundle = URL(fileURLWithPath: CommandLine.arguments[0]).resolvingSymlinksInPath()
        var directory = bundle.deletingLastPathComponent()
        // On Linux the runner may be the .xctest file itself or a binary inside a bundle directory.
        while !FileManager.default.isExecutableFile(atPath: directory.appendingPathComponent("impairment-proxy").path),
            directory.path != "/"
        {
            directory.deleteLastPathComponent()
        }
        return directory.appendingPathComponent("impairment-proxy")
    }
}
