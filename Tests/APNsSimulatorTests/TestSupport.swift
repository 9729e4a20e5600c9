import APNsDevice
import Crypto
import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import NIOConcurrencyHelpers
import NIOCore
import NIOHTTP2
import NIOPosix
import NIOSSL
import Testing
@testable import APNsSimulator

/// The development certificates from the real script (`make certs`), made once per test run.
enum DevCertificates {
    static let repository = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

    private static let made: Result<String, any Error> = Result {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("apns-sim-tests-\(UUID().uuidString)").path
        let script = Process()
        script.executableURL = repository.appendingPathComponent("certs/make-dev-certs.sh")
        script.arguments = [directory]
        script.standardOutput = FileHandle.nullDevice
        try script.run()
        script.waitUntilExit()
        guard script.terminationStatus == 0 else { throw TestFailure("certs/make-dev-certs.sh failed with status \(script.terminationStatus)") }
        return directory
    }

    static func directory() throws -> String { try made.get() }
    static func path(_ name: String) throws -> String { try directory() + "/" + name }
}

struct TestFailure: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}

/// A clock the tests move by hand.
final class TestClock: Sendable {
    private let current: NIOLockedValueBox<Date>
    init(_ start: Date = Date(timeIntervalSince1970: 1_750_000_000)) { current = NIOLockedValueBox(start) }
    var now: Date { current.withLockedValue { $0 } }
    func advance(_ seconds: TimeInterval) { current.withLockedValue { $0 = $0.addingTimeInterval(seconds) } }
}

/// A provider key with its private half, to sign JWTs as a provider would.
struct TestProviderKey: Sendable {
    var keyID: String
    var teamID: String
    var privateKey = P256.Signing.PrivateKey()
    /// ECDSA signatures are randomised, so signing the same claims twice gives two JWTs, which APNs
    /// would take for a token change; a provider reuses its JWT, and so do the tests.
    private let cache = NIOLockedValueBox<[String: String]>([:])

    var simulatorKey: APNsProviderKey { APNsProviderKey(keyID: keyID, teamID: teamID, publicKey: privateKey.publicKey) }

    /// An ES256 JWT as Apple specifies it; every part can be bent for the negative cases.
    func jwt(issuedAt: Date, alg: String = "ES256", kid: String? = nil, iss: String? = nil, signer: P256.Signing.PrivateKey? = nil) -> String {
        let header = #"{"alg":"\#(alg)","kid":"\#(kid ?? keyID)"}"#
        let claims = #"{"iss":"\#(iss ?? teamID)","iat":\#(Int64(issuedAt.timeIntervalSince1970))}"#
        let signingInput = base64URL(Data(header.utf8)) + "." + base64URL(Data(claims.utf8))
        func sign() -> String {
            let signature = try! (signer ?? privateKey).signature(for: Data(signingInput.utf8))
            return signingInput + "." + base64URL(signature.rawRepresentation)
        }
        if signer != nil { return sign() }
        return cache.withLockedValue { cache in
            if let jwt = cache[signingInput] { return jwt }
            let jwt = sign()
            cache[signingInput] = jwt
            return jwt
        }
    }
}

func base64URL(_ data: Data) -> String {
    data.base64EncodedString().replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
        .replacingOccurrences(of: "=", with: "")
}

let ptTopic = "com.example.squelch.voip-ptt"
let deviceToken = String(repeating: "a1b2c3d4", count: 8)

/// A simulator on ephemeral ports with in-memory keys and a hand-moved clock, stopped afterwards.
struct SimulatorFixture: Sendable {
    let clock = TestClock()
    let key = TestProviderKey(keyID: "KEY0000001", teamID: "TEAM000001")
    let otherTeamKey = TestProviderKey(keyID: "KEY0000002", teamID: "TEAM000002")
    let simulator: APNsSimulator
    let endpoints: APNsSimulatorEndpoints

    static let watchdogSeconds = 15.0

    static func with<T>(allowedTopics: Set<String>? = nil, maxConcurrentStreams: Int = 1000, logCapacity: Int = 100_000,
                        _ body: (SimulatorFixture) async throws -> T) async throws -> T {
        let fixture = try await SimulatorFixture(allowedTopics: allowedTopics, maxConcurrentStreams: maxConcurrentStreams, logCapacity: logCapacity)
        // A test waiting for a response or a close that never comes would hang the suite; stopping the
        // simulator closes every connection, which fails those waits instead.
        let watchdog = Task { [simulator = fixture.simulator] in
            try await Task.sleep(for: .seconds(watchdogSeconds))
            Issue.record("the test ran over \(watchdogSeconds) s; stopped the simulator to unblock it")
            try? await simulator.stop()
        }
        defer { watchdog.cancel() }
        do {
            let result = try await body(fixture)
            try await fixture.simulator.stop()
            return result
        } catch {
            try? await fixture.simulator.stop()
            throw error
        }
    }

    private init(allowedTopics: Set<String>?, maxConcurrentStreams: Int, logCapacity: Int) async throws {
        var configuration = APNsSimulatorConfiguration(
            certificateChainPath: try DevCertificates.path("apns-sim.pem"), privateKeyPath: try DevCertificates.path("apns-sim.key"),
            providerKeys: [key.simulatorKey, otherTeamKey.simulatorKey], allowedTopics: allowedTopics,
            maxConcurrentStreams: maxConcurrentStreams, logCapacity: logCapacity)
        configuration.now = { [clock] in clock.now }
        simulator = try APNsSimulator(configuration: configuration)
        endpoints = try await simulator.start()
    }

    func connect() async throws -> H2TestClient {
        try await H2TestClient.connect(port: endpoints.port)
    }

    var jwt: String { key.jwt(issuedAt: clock.now) }

    /// Headers of a valid pushtotalk push, in the order a client sends them.
    func validHeaders(jwt: String? = nil, apnsID: String? = nil) -> [(String, String)] {
        var headers = [
            ("authorization", "bearer \(jwt ?? self.jwt)"), ("apns-push-type", "pushtotalk"), ("apns-topic", ptTopic),
            ("apns-priority", "10"), ("apns-expiration", "0"),
        ]
        if let apnsID { headers.append(("apns-id", apnsID)) }
        return headers
    }

    /// Sends a valid push on `client`.
    func push(on client: H2TestClient, token: String = deviceToken, body: String = #"{"activeSpeaker":"Alice"}"#,
              jwt: String? = nil) async throws -> H2Response {
        try await client.send(path: "/3/device/\(token)", headers: validHeaders(jwt: jwt), body: body)
    }

    func controlURL(_ path: String) -> URL { URL(string: "http://127.0.0.1:\(endpoints.controlPort)\(path)")! }
}

struct H2Response: Sendable {
    var status: Int
    var headers: [(String, String)]
    var body: String

    func header(_ name: String) -> String? { headers.first { $0.0 == name }?.1 }

    /// The `reason` of an error body, and its `timestamp`.
    var reason: String? { (try? JSONSerialization.jsonObject(with: Data(body.utf8)) as? [String: Any])?["reason"] as? String }
    var timestamp: Int64? {
        ((try? JSONSerialization.jsonObject(with: Data(body.utf8)) as? [String: Any])?["timestamp"] as? NSNumber)?.int64Value
    }
}

/// What the client saw on stream 0.
enum RootEvent: Sendable, Equatable {
    case settings([HTTP2SettingsParameter: UInt32])
    case goAway(lastStreamID: Int, errorCode: UInt32, debugData: String)
    case pingAck(UInt64)
}

/// A raw HTTP/2 client over NIOSSL, trusting the dev CA, recording SETTINGS and GOAWAY.
final class H2TestClient: Sendable {
    let channel: any Channel
    let multiplexer: NIOHTTP2Handler.StreamMultiplexer
    private let events: NIOLockedValueBox<[RootEvent]>

    private init(channel: any Channel, multiplexer: NIOHTTP2Handler.StreamMultiplexer, events: NIOLockedValueBox<[RootEvent]>) {
        self.channel = channel
        self.multiplexer = multiplexer
        self.events = events
    }

    static func tlsContext(alpn: [String] = ["h2"]) throws -> NIOSSLContext {
        var tls = TLSConfiguration.makeClientConfiguration()
        tls.trustRoots = .certificates(try NIOSSLCertificate.fromPEMFile(DevCertificates.path("ca.pem")))
        tls.applicationProtocols = alpn
        return try NIOSSLContext(configuration: tls)
    }

    static func connect(port: Int) async throws -> H2TestClient {
        let tls = try tlsContext()
        let events = NIOLockedValueBox<[RootEvent]>([])
        let (channel, multiplexer) = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .connect(host: "127.0.0.1", port: port) { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(NIOSSLClientHandler(context: tls, serverHostname: "localhost"))
                    let multiplexer = try channel.pipeline.syncOperations.configureHTTP2Pipeline(
                        mode: .client, connectionConfiguration: .init(), streamConfiguration: .init(),
                        inboundStreamInitializer: { $0.close() })
                    try channel.pipeline.syncOperations.addHandler(RootFrameRecorder(events: events))
                    return (channel, multiplexer)
                }
            }
        return H2TestClient(channel: channel, multiplexer: multiplexer, events: events)
    }

    var rootEvents: [RootEvent] { events.withLockedValue { $0 } }

    var settings: [[HTTP2SettingsParameter: UInt32]] {
        rootEvents.compactMap { if case .settings(let values) = $0 { values } else { nil } }
    }

    /// Waits up to `seconds` for `condition` on the root events.
    func waitFor(seconds: Double = 3, _ condition: ([RootEvent]) -> Bool) async throws -> Bool {
        let deadline = ContinuousClock.now + .milliseconds(Int(seconds * 1000))
        while ContinuousClock.now < deadline {
            if condition(rootEvents) { return true }
            try await Task.sleep(for: .milliseconds(10))
        }
        return condition(rootEvents)
    }

    /// One request on a new stream; returns the complete response.
    func send(method: String = "POST", path: String, headers: [(String, String)], body: String?) async throws -> H2Response {
        let promise = channel.eventLoop.makePromise(of: H2Response.self)
        let stream = try await multiplexer.createStreamChannel { stream in
            stream.eventLoop.makeCompletedFuture {
                try stream.pipeline.syncOperations.addHandler(ResponseCollector(promise: promise))
            }
        }.get()
        var head = HTTP2Frame.FramePayload.Headers(headers: [":method": method, ":scheme": "https", ":path": path, ":authority": "localhost"])
        for (name, value) in headers { head.headers.add(name: name, value: value) }
        let bodyBytes = body.map { Array($0.utf8) } ?? []
        head.endStream = bodyBytes.isEmpty
        stream.write(HTTP2Frame.FramePayload.headers(head), promise: nil)
        if !bodyBytes.isEmpty {
            let data = HTTP2Frame.FramePayload.Data(data: .byteBuffer(ByteBuffer(bytes: bodyBytes)), endStream: true)
            stream.write(HTTP2Frame.FramePayload.data(data), promise: nil)
        }
        stream.flush()
        return try await promise.futureResult.get()
    }

    func close() async { try? await channel.close() }
}

private final class RootFrameRecorder: ChannelInboundHandler {
    typealias InboundIn = HTTP2Frame
    let events: NIOLockedValueBox<[RootEvent]>
    init(events: NIOLockedValueBox<[RootEvent]>) { self.events = events }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let frame = unwrapInboundIn(data)
        switch frame.payload {
        case .settings(.settings(let settings)):
            var values: [HTTP2SettingsParameter: UInt32] = [:]
            for setting in settings { values[setting.parameter] = UInt32(setting.value) }
            events.withLockedValue { $0.append(.settings(values)) }
        case .goAway(let lastStreamID, let errorCode, let opaqueData):
            let debug = opaqueData.map { String(buffer: $0) } ?? ""
            events.withLockedValue { $0.append(.goAway(lastStreamID: Int(lastStreamID), errorCode: UInt32(errorCode.networkCode), debugData: debug)) }
        case .ping(let data, ack: true):
            events.withLockedValue { $0.append(.pingAck(data.integer)) }
        default:
            break
        }
        context.fireChannelRead(data)
    }
}

private final class ResponseCollector: ChannelInboundHandler {
    typealias InboundIn = HTTP2Frame.FramePayload
    private let promise: EventLoopPromise<H2Response>
    private var response = H2Response(status: 0, headers: [], body: "")
    private var done = false

    init(promise: EventLoopPromise<H2Response>) { self.promise = promise }

    private func complete(_ result: Result<H2Response, any Error>) {
        guard !done else { return }
        done = true
        promise.completeWith(result)
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .headers(let frame):
            for (name, value, _) in frame.headers {
                if name == ":status" { response.status = Int(value) ?? -1 } else { response.headers.append((name, value)) }
            }
            if frame.endStream { complete(.success(response)) }
        case .data(let frame):
            if case .byteBuffer(let buffer) = frame.data { response.body += String(buffer: buffer) }
            if frame.endStream { complete(.success(response)) }
        case .rstStream(let code):
            complete(.failure(TestFailure("stream reset: \(code)")))
        default:
            break
        }
    }

    func channelInactive(context: ChannelHandlerContext) {
        complete(.failure(TestFailure("stream closed before the response ended")))
    }
}

/// Plain HTTP/1.1 against the control port.
enum Control {
    static func request(_ url: URL, method: String = "GET", body: Data? = nil) async throws -> (status: Int, body: Data) {
        var request = URLRequest(url: url)
        request.httpMethod = method
        request.httpBody = body
        if body != nil { request.setValue("application/json", forHTTPHeaderField: "content-type") }
        let (data, response) = try await URLSession.shared.data(for: request)
        return ((response as? HTTPURLResponse)?.statusCode ?? -1, data)
    }

    static func decode<T: Decodable>(_ type: T.Type, _ data: Data) throws -> T {
        try APNsSimulatorJSON.decoder().decode(type, from: data)
    }
}
