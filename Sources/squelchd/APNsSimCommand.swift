import APNsSimulator
import ArgumentParser
import Dispatch
import Foundation
import Logging

/// `squelchd apns-sim`: the local APNs for development and tests (docs/architecture.md, `APNsSimulator`).
struct APNsSim: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "apns-sim",
        abstract: "Run a local APNs simulator until SIGTERM or SIGINT.",
        discussion: """
            The APNs port speaks HTTP/2 over TLS (ALPN h2) and answers as Apple does, status and reason; \
            point squelchd's APNs client at https://<host>:<port> and trust certs/ca.pem. The control \
            port is plain HTTP with JSON: GET /healthz, GET|DELETE /v1/pushes[?token=], GET /v1/rejections, \
            GET /v1/stats, GET|PUT /v1/faults, GET /v1/devices/<token>/stream. The certificates and the \
            provider key come from `make certs`.
            """)

    @Option(help: ArgumentHelp("Address both ports bind.", valueName: "address"))
    var host = "127.0.0.1"

    @Option(help: ArgumentHelp("APNs port (HTTP/2 over TLS; 0: any free port).", valueName: "port"))
    var port = 2197

    @Option(help: ArgumentHelp("Control API port (HTTP/1.1; 0: any free port).", valueName: "port"))
    var controlPort = 2198

    @Option(help: ArgumentHelp("PEM certificate chain the APNs port presents.", valueName: "path"))
    var cert = "certs/apns-sim.pem"

    @Option(help: ArgumentHelp("PEM private key of that certificate.", valueName: "path"))
    var key = "certs/apns-sim.key"

    @Option(help: ArgumentHelp("Provider signing key (.p8) whose JWTs are accepted.", valueName: "path"))
    var providerKey = "certs/AuthKey_DEVKEY0001.p8"

    @Option(help: ArgumentHelp("The provider key's Key ID (default: keyId in apns-provider.json next to the .p8).", valueName: "id"))
    var keyId: String?

    @Option(help: ArgumentHelp("The provider key's Team ID (default: teamId in apns-provider.json next to the .p8).", valueName: "id"))
    var teamId: String?

    @Option(name: .customLong("topic"), help: ArgumentHelp("A topic pushes may name; repeat for more (default: any topic).", valueName: "topic"))
    var topics: [String] = []

    @Option(help: ArgumentHelp("Log level: trace, debug, info, notice, warning, error, critical.", valueName: "level"))
    var logLevel = "info"

    /// `certs/apns-provider.json`, as `make certs` writes it.
    private struct ProviderInfo: Decodable {
        var keyId: String
        var teamId: String
    }

    func validate() throws {
        guard (0...65535).contains(port), (0...65535).contains(controlPort) else {
            throw ValidationError("--port and --control-port must be 0-65535")
        }
        guard Logger.Level(rawValue: logLevel) != nil else {
            throw ValidationError("--log-level '\(logLevel)' is not one of trace, debug, info, notice, warning, error, critical")
        }
    }

    func run() async throws {
        let level = Logger.Level(rawValue: logLevel) ?? .info
        LoggingSystem.bootstrap { label in
            var handler = StreamLogHandler.standardError(label: label)
            handler.logLevel = level
            return handler
        }
        let simulator: APNsSimulator
        do {
            var configuration = APNsSimulatorConfiguration(
                certificateChainPath: cert, privateKeyPath: key, providerKeys: [try loadProviderKey()], host: host, port: port,
                controlPort: controlPort, allowedTopics: topics.isEmpty ? nil : Set(topics))
            configuration.logger = Logger(label: "apns-sim")
            simulator = try APNsSimulator(configuration: configuration)
        } catch {
            throw Serve.configurationFailure(error)
        }

        // Signals are watched before the listeners start, so an early SIGTERM still stops cleanly.
        let (signals, signalContinuation) = AsyncStream.makeStream(of: Int32.self)
        let sources = [SIGINT, SIGTERM].map { number in
            signal(number, SIG_IGN)
            let source = DispatchSource.makeSignalSource(signal: number, queue: .global())
            source.setEventHandler { signalContinuation.yield(number) }
            source.resume()
            return source
        }
        defer { sources.forEach { $0.cancel() } }

        let endpoints: APNsSimulatorEndpoints
        do { endpoints = try await simulator.start() } catch {
            throw Serve.configurationFailure(error)
        }
        let topicsLine = topics.isEmpty ? "any topic" : topics.sorted().joined(separator: ", ")
        // FileHandle writes at once; print() would sit in a pipe's buffer, and scripts wait for these lines.
        FileHandle.standardOutput.write(Data("""
            APNs simulator: https://\(host):\(endpoints.port) (HTTP/2, TLS; trust certs/ca.pem)
            control API: http://\(host):\(endpoints.controlPort)
            topics: \(topicsLine)

            """.utf8))

        var iterator = signals.makeAsyncIterator()
        let received = await iterator.next()
        FileHandle.standardError.write(Data("squelchd apns-sim: \(received == SIGINT ? "SIGINT" : "SIGTERM"), stopping\n".utf8))
        try await simulator.stop()
    }

    private func loadProviderKey() throws -> APNsProviderKey {
        var keyID = keyId
        var teamID = teamId
        if keyID == nil || teamID == nil {
            let path = URL(fileURLWithPath: providerKey).deletingLastPathComponent().appendingPathComponent("apns-provider.json").path
            guard let data = FileManager.default.contents(atPath: path) else {
                throw ValidationError("cannot read \(path) for the key and team IDs; run `make certs`, or pass --key-id and --team-id")
            }
            let info: ProviderInfo
            do { info = try JSONDecoder().decode(ProviderInfo.self, from: data) } catch {
                throw ValidationError("\(path) is not {\"keyId\": …, \"teamId\": …} (\(error)); rerun `make certs` or pass --key-id and --team-id")
            }
            keyID = keyID ?? info.keyId
            teamID = teamID ?? info.teamId
        }
        return try APNsProviderKey.load(p8Path: providerKey, keyID: keyID ?? "", teamID: teamID ?? "")
    }
}
