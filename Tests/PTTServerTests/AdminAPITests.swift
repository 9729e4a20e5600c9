import ChannelHub
import ChannelProtocol
import ChannelStore
import ChannelStoreSQLite
import Foundation
import Glibc
import NIOConcurrencyHelpers
import Hummingbird
import HummingbirdTesting
import Logging
import ParticipantClaims
import ParticipantTokens
import Prometheus
import SquelchTesting
import Synchronization
import Testing
@testable import PTTServer

/// Stands in for the live channel hub (tested with the hub itself elsewhere): records what the admin
/// API tells it and answers roster and connection queries with canned values.
final class RecordingHub: AdminHubHooks {
    enum Event: Equatable {
        case changed(UUID)
        case deleted(UUID)
        case removed(UUID, String)
        case revoked(UUID, String?)
    }

    private let recorded = Mutex<[Event]>([])
    let rosterEntries: [LiveMember]
    let connections: Int
    /// Users the hub holds whose rows the store may not have yet.
    let liveMembers: Set<String>

    init(roster: [LiveMember] = [], connections: Int = 0, liveMembers: Set<String> = []) {
        rosterEntries = roster
        self.connections = connections
        self.liveMembers = liveMembers
    }

    var events: [Event] { recorded.withLock { $0 } }

    func channelChanged(_ id: UUID) async { recorded.withLock { $0.append(.changed(id)) } }
    func channelDeleted(_ id: UUID) async { recorded.withLock { $0.append(.deleted(id)) } }
    func memberRemoved(channel: UUID, user: String, revocation: RevocationRecord) async { recorded.withLock { $0.append(.removed(channel, user)) } }
    func isMember(channel: UUID, user: String) async -> Bool { liveMembers.contains(user) }
    func tokenRevoked(_ revocation: RevocationRecord) async {
        recorded.withLock { $0.append(.revoked(revocation.channelID, revocation.tokenID)) }
    }
    func roster(of channel: UUID) async -> [LiveMember] { rosterEntries }
    func connectionCount() async -> Int { connections }
}

/// A real SQLite store and token key in a fresh temporary directory, and the admin router around them.
struct AdminFixture {
    static let key = "test-admin-key-0123456789abcdef"

    let directory: String
    let store: SQLiteChannelStore
    let tokens: TokenAuthority
    let hub: RecordingHub?
    let registry = PrometheusCollectorRegistry()
    let context: AdminContext

    init(hub: RecordingHub? = RecordingHub(), busyTimeout: TimeInterval = SQLiteChannelStore.busyTimeoutSeconds,
         readiness: @escaping @Sendable () async -> AdminContext.Readiness = { .ready }) async throws {
        directory = FileManager.default.temporaryDirectory.appendingPathComponent("squelch-admin-\(UUID())").path
        store = try SQLiteChannelStore(directory: directory, busyTimeout: busyTimeout)
        tokens = try await TokenAuthority.loadOrCreate(in: directory)
        self.hub = hub
        context = AdminContext(store: store, tokens: tokens, adminKey: Self.key, hub: hub, registry: registry,
                               identitySummary: "CN=test", readiness: readiness)
    }

    var application: some ApplicationProtocol { Application(router: AdminAPI.router(context: context)) }

    func cleanUp() async {
        try? await store.close()
        try? FileManager.default.removeItem(atPath: directory)
    }
}

extension TestClientProtocol {
    /// An authenticated JSON request.
    func send(_ method: HTTPRequest.Method, _ uri: String, json: String? = nil,
              key: String? = AdminFixture.key) async throws -> TestResponse {
        var headers: HTTPFields = [:]
        if let key { headers[.authorization] = "Bearer \(key)" }
        if json != nil { headers[.contentType] = "application/json" }
        return try await execute(uri: uri, method: method, headers: headers, body: json.map { ByteBuffer(string: $0) })
    }
}

extension TestResponse {
    var text: String { String(buffer: body) }

    /// The `error` member of a JSON error body ("" when there is none).
    var errorMessage: String {
        let object = try? JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any]
        return object?["error"] as? String ?? ""
    }

    func decode<T: Decodable>(_ type: T.Type) throws -> T {
        let decoder = JSONDecoder()
        decoder.dateDecodingStrategy = .iso8601
        return try decoder.decode(type, from: Data(text.utf8))
    }
}

/// Keeps what is logged through it, for the audit trail's tests.
struct RecordingLogHandler: LogHandler {
    final class Lines: Sendable {
        let value = Mutex<[String]>([])
    }
    let lines: Lines
    var metadata: Logger.Metadata = [:]
    var logLevel: Logger.Level = .trace
    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }
    func log(event: LogEvent) {
        let fields = (event.metadata ?? [:]).sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: " ")
        lines.value.withLock { $0.append("\(event.level) \(event.message) \(fields)") }
    }
}

@Suite struct AdminAPITests {
    /// Every change through the API leaves a line in the server's log and a record in the store's
    /// audit trail: who was removed, which token was revoked or issued (its id, never the token),
    /// which channel changed.
    @Test func changesLeaveAnAuditTrail() async throws {
        let lines = RecordingLogHandler.Lines()
        let fixture = try await AdminFixture()
        defer { Task { await fixture.cleanUp() } }
        var context = fixture.context
        context.auditLog = Logger(label: "audit") { _ in RecordingLogHandler(lines: lines) }
        let app = Application(router: AdminAPI.router(context: context))
        try await app.test(.router) { client in
            let created = try await client.send(.post, "/v1/channels", json: #"{"name":"Ops"}"#)
            #expect(created.status == .created)
            let id = try #require((try JSONSerialization.jsonObject(with: Data(created.text.utf8)) as? [String: Any])?["id"] as? String)
            #expect(try await client.send(.patch, "/v1/channels/\(id)", json: #"{"name":"Ops 2"}"#).status == .ok)
            let issued = try await client.send(.post, "/v1/channels/\(id)/tokens", json: #"{"user":"ann","name":"Ann"}"#)
            let token = try issued.decode(AdminAPI.IssuedToken.self)
            #expect(try await client.send(.post, "/v1/channels/\(id)/revocations", json: #"{"tokenID":"\#(token.tokenID)","reason":"lost phone"}"#).status == .created)
            // Revoked again with another reason: the first stands, and the trail keeps what was asked.
            #expect(try await client.send(.post, "/v1/channels/\(id)/revocations", json: #"{"tokenID":"\#(token.tokenID)","reason":"stolen"}"#).status == .ok)
            #expect(try await client.send(.get, "/v1/channels/\(id)").status == .ok)
            #expect(try await client.send(.delete, "/v1/channels/\(id)").status == .noContent)
            let log = lines.value.withLock { $0 }
            #expect(log.count == 6, "reads are not logged: \(log)")
            #expect(log.allSatisfy { $0.hasPrefix("notice admin API: ") })
            #expect(log[0].contains("channel created") && log[0].contains("channel=\(id)") && log[0].contains("name=Ops"))
            #expect(log[1].contains("channel updated") && log[1].contains("name=Ops 2"))
            #expect(log[2].contains("token issued") && log[2].contains("user=ann") && log[2].contains("token_id=\(token.tokenID)"))
            #expect(!log[2].contains(token.token), "the token itself stays out of the log")
            #expect(log[3].contains("token revoked") && log[3].contains("reason=lost phone"))
            #expect(log[4].contains("token revocation repeated") && log[4].contains("requested_reason=stolen"))
            #expect(log[5].contains("channel deleted") && log[5].contains("name=Ops 2"))

            // The same six are records in the store, which GET /v1/audit reads, newest first, and
            // which outlive the deleted channel.
            let decoder = JSONDecoder()
            decoder.dateDecodingStrategy = .iso8601
            let raw = try await client.send(.get, "/v1/audit").text
            #expect(!raw.contains(token.token), "the token itself stays out of the trail")
            var trail = try decoder.decode([AuditRecord].self, from: Data(raw.utf8))
            #expect(trail.map(\.action) == ["channel deleted", "token revocation repeated", "token revoked", "token issued", "channel updated",
                                             "channel created"])
            #expect(trail[0].details["name"] == "Ops 2", "a deleted channel's record names it")
            #expect(trail[1].details["reason"] == "lost phone" && trail[1].details["requested_reason"] == "stolen")
            #expect(trail[2].details["requested_reason"] == nil)
            trail.remove(at: 1)
            #expect(trail.allSatisfy { $0.source == "api" && $0.actor == nil && $0.channelID?.uuidString == id })
            #expect(trail[2].userID == "ann" && trail[2].details["token_id"] == token.tokenID && trail[2].details["capabilities"] == "listen,talk")
            #expect(!trail[2].details.values.contains(token.token), "the token itself stays out of the trail")
            #expect(trail[1].details["reason"] == "lost phone")
            #expect(trail[4].details["name"] == "Ops")
            let other = try await client.send(.post, "/v1/channels", json: #"{"name":"Other"}"#)
            let otherID = try #require((try JSONSerialization.jsonObject(with: Data(other.text.utf8)) as? [String: Any])?["id"] as? String)
            let filtered = try decoder.decode([AuditRecord].self, from: Data(try await client.send(.get, "/v1/audit?channel=\(id)&limit=2").text.utf8))
            #expect(filtered.map(\.action) == ["channel deleted", "token revocation repeated"])
            let newest = try decoder.decode([AuditRecord].self, from: Data(try await client.send(.get, "/v1/audit?limit=1").text.utf8))
            #expect(newest.map(\.channelID?.uuidString) == [otherID])
            let badChannel = try await client.send(.get, "/v1/audit?channel=ops")
            #expect(badChannel.status == .badRequest && badChannel.text.contains("channel must be a channel UUID"))
            #expect(try await client.send(.get, "/v1/audit?limit=0").status == .badRequest)
        }
    }

    /// Over a real socket on 127.0.0.1 (`.live`), not the in-process router.
    @Test func healthzAnswersWithVersionAndCertificateOverASocket() async throws {
        let fixture = try await AdminFixture(hub: RecordingHub(connections: 3))
        defer { Task { await fixture.cleanUp() } }
        let app = Application(router: AdminAPI.router(context: fixture.context),
                              configuration: .init(address: .hostname("127.0.0.1", port: 0)))
        try await app.test(.live) { client in
            try await client.execute(uri: "/healthz", method: .get) { response in
                #expect(response.status == .ok)
                let health = try response.decode(AdminAPI.Health.self)
                #expect(health.status == "ok")
                #expect(health.reason == nil)
                #expect(health.certificate == "CN=test")
                #expect(health.connections == 3)
                #expect(health.uptimeSeconds >= 0)
            }
            // A path with no route: the API's JSON error, saying where the routes are.
            try await client.execute(uri: "/nope", method: .get) { response in
                #expect(response.status == .notFound)
                #expect(response.errorMessage.contains("there is no GET /nope; the admin API has"), "\(response.text)")
            }
            // HEAD, as load balancers check health: the status, no body.
            try await client.execute(uri: "/healthz", method: .head) { response in
                #expect(response.status == .ok && response.body.readableBytes == 0)
            }
            // A known path with another method: 405 with the methods it takes.
            try await client.execute(uri: "/v1/channels", method: .put) { response in
                #expect(response.status == .methodNotAllowed)
                #expect(response.headers[.allow] == "GET, POST")
                #expect(response.errorMessage == "/v1/channels takes GET, POST, not PUT", "\(response.text)")
            }
        }
    }

    /// A client that sends half its request and then nothing (slowloris, or a script that died) is
    /// closed after the idle timeout, rather than holding its connection, and squelchd's shutdown,
    /// for as long as it likes. A real socket: the timeout lives in the HTTP server, not the router.
    @Test func aHalfSentRequestIsClosedAfterTheIdleTimeout() async throws {
        let fixture = try await AdminFixture()
        defer { Task { await fixture.cleanUp() } }
        let port = NIOLockedValueBox(0)
        let app = Application(router: AdminAPI.router(context: fixture.context), server: AdminAPI.httpServer(idleTimeout: .milliseconds(500)),
                              configuration: .init(address: .hostname("127.0.0.1", port: 0)),
                              onServerRunning: { channel in port.withLockedValue { $0 = channel.localAddress?.port ?? 0 } })
        let running = Task { try await app.runService() }
        defer { running.cancel() }
        for _ in 0 ..< 200 where port.withLockedValue({ $0 }) == 0 { try await Task.sleep(for: .milliseconds(10)) }
        let socket = Glibc.socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(socket) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port.withLockedValue { $0 }).bigEndian)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(socket, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        #expect(connected == 0)
        let half = Array("GET /heal".utf8)
        #expect(send(socket, half, half.count, 0) == half.count)
        let started = ContinuousClock.now
        var ready = pollfd(fd: socket, events: Int16(POLLIN), revents: 0)
        #expect(poll(&ready, 1, 5_000) == 1, "still open after 5 s")
        var buffer = [UInt8](repeating: 0, count: 512)
        #expect(recv(socket, &buffer, buffer.count, 0) == 0, "closed, not answered")
        #expect(ContinuousClock.now - started < .seconds(3))
    }

    /// The endpoint table behind 405, read off the router, holds: each route's method reaches a
    /// handler (its answer is never the router's "there is no"), and every other method gets 405.
    @Test func everyEndpointAnswersItsMethodsAndRefusesOthers() async throws {
        let fixture = try await AdminFixture()
        defer { Task { await fixture.cleanUp() } }
        let all: [HTTPRequest.Method] = [.get, .post, .put, .patch, .delete]
        try await fixture.application.test(.router) { client in
            for endpoint in AdminAPI.endpoints(of: AdminAPI.router(context: fixture.context).routes) {
                let uri = endpoint.path.replacingOccurrences(of: "{id}", with: UUID().uuidString).replacingOccurrences(of: "{user}", with: "ann")
                for method in all {
                    let response = try await client.send(method, uri, json: method == .post || method == .patch ? "{}" : nil)
                    if endpoint.methods.contains(method) {
                        #expect(response.status != .methodNotAllowed && !response.errorMessage.contains("there is no"),
                                "\(method) \(uri): \(response.status) \(response.text)")
                    } else {
                        #expect(response.status == .methodNotAllowed, "\(method) \(uri): \(response.status) \(response.text)")
                        #expect(response.headers[.allow] == endpoint.methods.map(\.rawValue).joined(separator: ", "))
                    }
                }
            }
        }
    }

    @Test func healthzIs503WithAReasonWhenUnhealthy() async throws {
        let fixture = try await AdminFixture(readiness: { .unavailable(reason: "transport not bound") })
        defer { Task { await fixture.cleanUp() } }
        try await fixture.application.test(.router) { client in
            let response = try await client.execute(uri: "/healthz", method: .get)
            #expect(response.status == .serviceUnavailable)
            let health = try response.decode(AdminAPI.Health.self)
            #expect(health.status == "unavailable")
            #expect(health.reason == "transport not bound")
            #expect(!health.version.isEmpty)
        }
    }

    /// A certificate that expires while the server runs: clients refuse it from that moment, so
    /// `/healthz` warns two weeks ahead ("degraded", still 200) and the log says so once a day; the
    /// squelchd readiness check makes an expired one "unavailable" (503).
    @Test func healthzWarnsOfACertificateAboutToExpire() async throws {
        let now = Date()
        let soon = CertificateExpiry(subject: "CN=squelchd", notValidAfter: now.addingTimeInterval(3 * 86_400 + 60))
        guard case .expiresSoon(let text) = soon.status(at: now) else { Issue.record("not flagged: \(soon.status(at: now))"); return }
        #expect(text.contains("in 3 days") && text.contains("CN=squelchd") && text.contains("--cert"), "\(text)")
        #expect(CertificateExpiry(subject: "CN=x", notValidAfter: now.addingTimeInterval(30 * 86_400)).status(at: now) == .fine)
        guard case .expired(let gone) = CertificateExpiry(subject: "CN=x", notValidAfter: now.addingTimeInterval(-1)).status(at: now) else {
            Issue.record("an expired certificate is not flagged"); return
        }
        #expect(gone.contains("every client refuses the handshake"))
        // The log looks again when the warning window opens, then daily, then hourly once expired.
        #expect(CertificateExpiry(subject: "CN=x", notValidAfter: now.addingTimeInterval(15 * 86_400)).nextLook(at: now) == 86_400)
        #expect(soon.nextLook(at: now) == 86_400)
        #expect(CertificateExpiry(subject: "CN=x", notValidAfter: now.addingTimeInterval(-5)).nextLook(at: now) == 3_600)

        let fixture = try await AdminFixture()
        defer { Task { await fixture.cleanUp() } }
        var context = fixture.context
        context.certificateExpiry = soon
        try await Application(router: AdminAPI.router(context: context)).test(.router) { client in
            let response = try await client.execute(uri: "/healthz", method: .get)
            #expect(response.status == .ok)
            let health = try response.decode(AdminAPI.Health.self)
            #expect(health.status == "degraded" && health.reason?.contains("expires at") == true, "\(health)")
        }
    }

    /// An alert on delivered or failed pushes has a series to read from the start, at 0, not "no
    /// data" until the first push.
    @Test func thePushCountersExistBeforeTheFirstPush() {
        let registry = PrometheusCollectorRegistry()
        _ = PushMetrics(registry: registry)
        var bytes: [UInt8] = []
        registry.emit(into: &bytes)
        let text = String(decoding: bytes, as: UTF8.self)
        #expect(text.contains(#"squelch_pushes_total{outcome="delivered",reason="Success"} 0"#), "\(text)")
        #expect(text.contains(#"squelch_pushes_total{outcome="failed",reason="QueueFull"} 0"#), "\(text)")
    }

    @Test func versionAndMetricsNeedNoKey() async throws {
        let fixture = try await AdminFixture()
        defer { Task { await fixture.cleanUp() } }
        let counter = fixture.registry.makeCounter(descriptor: MetricNameDescriptor(
            metricName: "squelch_test_joins", unitName: "total", helpText: "joins in the test"))
        counter.increment(by: Int64(3))
        try await fixture.application.test(.router) { client in
            let version = try await client.execute(uri: "/version", method: .get)
            #expect(version.status == .ok)
            let health = try await client.execute(uri: "/healthz", method: .get).decode(AdminAPI.Health.self)
            #expect(!health.version.isEmpty && version.text == health.version + "\n")

            let metrics = try await client.execute(uri: "/metrics", method: .get)
            #expect(metrics.status == .ok)
            #expect(metrics.headers[.contentType] == "text/plain; version=0.0.4")
            #expect(metrics.text.contains("squelch_test_joins_total 3"))
            #expect(metrics.text.contains("# HELP squelch_test_joins_total joins in the test"))
        }
    }

    @Test func v1RefusesMissingMalformedAndWrongKeys() async throws {
        let fixture = try await AdminFixture()
        defer { Task { await fixture.cleanUp() } }
        try await fixture.application.test(.router) { client in
            let missing = try await client.send(.get, "/v1/channels", key: nil)
            #expect(missing.status == .unauthorized)
            #expect(missing.headers[.wwwAuthenticate] == "Bearer")
            #expect(missing.errorMessage.contains("Authorization: Bearer"))

            let wrong = try await client.send(.get, "/v1/channels", key: AdminFixture.key + "x")
            #expect(wrong.status == .unauthorized)
            #expect(wrong.headers[.wwwAuthenticate] == "Bearer")
            #expect(wrong.errorMessage.contains("wrong admin key"))
        }
        // The 401 names where this server's key is: with a key file, that setting, not a stale
        // <data-dir>/admin-key left from before (and no path: it goes to whoever asks).
        var configuration = ServerConfiguration()
        configuration.adminKeyFile = "/etc/squelch/admin.key"
        var context = fixture.context
        context.adminKeySource = configuration.adminKeySource
        try await Application(router: AdminAPI.router(context: context)).test(.router) { client in
            let wrong = try await client.send(.get, "/v1/channels", key: AdminFixture.key + "x")
            #expect(wrong.errorMessage.contains("this server's key is the one in the file set with --admin-key-file")
                    && !wrong.errorMessage.contains("/etc/squelch"), "\(wrong.errorMessage)")
        }
        try await fixture.application.test(.router) { client in

            let prefix = try await client.send(.get, "/v1/channels", key: String(AdminFixture.key.dropLast()))
            #expect(prefix.status == .unauthorized)

            var basic: HTTPFields = [:]
            basic[.authorization] = "Basic \(AdminFixture.key)"
            let scheme = try await client.execute(uri: "/v1/channels", method: .get, headers: basic)
            #expect(scheme.status == .unauthorized)

            // Unauthenticated writes do nothing.
            let create = try await client.send(.post, "/v1/channels", json: #"{"name":"Ops"}"#, key: "nope")
            #expect(create.status == .unauthorized)
            #expect(try await fixture.store.channels().isEmpty)

            let right = try await client.send(.get, "/v1/channels")
            #expect(right.status == .ok)
            #expect(right.text == "[]")
        }
        #expect(fixture.hub?.events == [])
    }

    @Test func constantTimeComparisonMatchesEquality() {
        let key = Array("abcdef".utf8)
        #expect(BearerAuthMiddleware<BasicRequestContext>.constantTimeEqual(key, key))
        #expect(!BearerAuthMiddleware<BasicRequestContext>.constantTimeEqual(Array("abcdeg".utf8), key))
        #expect(!BearerAuthMiddleware<BasicRequestContext>.constantTimeEqual(Array("abcde".utf8), key))
        #expect(!BearerAuthMiddleware<BasicRequestContext>.constantTimeEqual(Array("abcdef\0".utf8), key))
        #expect(!BearerAuthMiddleware<BasicRequestContext>.constantTimeEqual([], key))
    }

    @Test func channelsCanBeCreatedListedReadPatchedAndDeleted() async throws {
        let fixture = try await AdminFixture()
        defer { Task { await fixture.cleanUp() } }
        let hub = try #require(fixture.hub)
        try await fixture.application.test(.router) { client in
            let created = try await client.send(.post, "/v1/channels",
                                                json: #"{"name":" Dispatch ","image":"https://example.com/d.png","mode":"fullDuplex","maxBurstSeconds":30}"#)
            #expect(created.status == .created)
            let channel = try created.decode(ChannelRecord.self)
            #expect(channel.name == "Dispatch")
            #expect(channel.image == "https://example.com/d.png")
            #expect(channel.mode == .fullDuplex)
            #expect(channel.maxBurstSeconds == 30)
            #expect(created.text.contains(#""createdAt":"20"#), "dates are ISO 8601: \(created.text)")
            #expect(try await fixture.store.channel(channel.id)?.name == "Dispatch")
            #expect(hub.events == [.changed(channel.id)])

            let defaults = try await client.send(.post, "/v1/channels", json: #"{"name":"Yard"}"#)
            #expect(defaults.status == .created)
            let yard = try defaults.decode(ChannelRecord.self)
            #expect(yard.mode == .halfDuplex && yard.maxBurstSeconds == 60 && yard.image == nil)
            #expect(defaults.text.contains(#""image":null"#))

            let list = try await client.send(.get, "/v1/channels")
            #expect(list.status == .ok)
            #expect(Set(try list.decode([ChannelRecord].self).map(\.id)) == [channel.id, yard.id])

            let read = try await client.send(.get, "/v1/channels/\(channel.id)")
            #expect(read.status == .ok)
            #expect(try read.decode(ChannelRecord.self).name == "Dispatch")

            let patched = try await client.send(.patch, "/v1/channels/\(channel.id)", json: #"{"name":"Dispatch 2","image":null}"#)
            #expect(patched.status == .ok)
            let updated = try patched.decode(ChannelRecord.self)
            #expect(updated.name == "Dispatch 2")
            #expect(updated.image == nil)
            #expect(updated.mode == .fullDuplex, "fields not sent stay")
            #expect(updated.maxBurstSeconds == 30)
            let stored = try #require(try await fixture.store.channel(channel.id))
            #expect(stored.name == "Dispatch 2" && stored.image == nil)

            // The command line's spelling ("--mode half") works here too; the answer names it in full.
            let mode = try await client.send(.patch, "/v1/channels/\(channel.id)", json: #"{"mode":"half"}"#)
            #expect(try mode.decode(ChannelRecord.self).mode == .halfDuplex)
            #expect(mode.text.contains(#""mode":"halfDuplex""#), "\(mode.text)")
            #expect(try await fixture.store.channel(channel.id)?.name == "Dispatch 2", "an absent name is not cleared")

            let deleted = try await client.send(.delete, "/v1/channels/\(channel.id)")
            #expect(deleted.status == .noContent)
            #expect(try await fixture.store.channel(channel.id) == nil)
            #expect(hub.events == [.changed(channel.id), .changed(yard.id), .changed(channel.id), .changed(channel.id),
                                   .deleted(channel.id)])

            let gone = try await client.send(.get, "/v1/channels/\(channel.id)")
            #expect(gone.status == .notFound)
            #expect(gone.errorMessage.contains(channel.id.uuidString))
            let again = try await client.send(.delete, "/v1/channels/\(channel.id)")
            #expect(again.status == .notFound)
            #expect(hub.events.last == .deleted(channel.id), "a failed delete does not tell the hub")
        }
    }

    @Test func badChannelBodiesAre400sThatSayWhatIsWrong() async throws {
        let fixture = try await AdminFixture()
        defer { Task { await fixture.cleanUp() } }
        try await fixture.application.test(.router) { client in
            let cases: [(body: String, expected: String)] = [
                (#"{"image":"https://x"}"#, "\"name\" is required"),
                (#"{"name":""}"#, "1-64 characters"),
                (#"{"name":"A","mode":"simplex"}"#, "\"halfDuplex\" or \"fullDuplex\""),
                (#"{"name":"A","maxBurstSeconds":0}"#, "1-600 seconds"),
                (#"{"name":"A","maxBurstSeconds":"30"}"#, "\"maxBurstSeconds\" must be a whole number"),
                (#"{"name":"A","image":"ftp://x"}"#, "http(s) URL"),
                (#"{"name":"A","colour":"red"}"#, "unknown field \"colour\""),
                (#"{"name":"A""#, "not valid JSON"),
                (#"["name"]"#, "must be a JSON object"),
                ("", "body is empty"),
            ]
            for (body, expected) in cases {
                let response = try await client.send(.post, "/v1/channels", json: body)
                #expect(response.status == .badRequest, "\(body)")
                #expect(response.headers[.contentType]?.hasPrefix("application/json") == true)
                #expect(response.errorMessage.contains(expected), "\(body) → \(response.text)")
            }
            #expect(try await fixture.store.channels().isEmpty)

            let huge = #"{"name":"A","image":""# + String(repeating: "x", count: 70 * 1024) + #""}"#
            let tooLarge = try await client.send(.post, "/v1/channels", json: huge)
            #expect(tooLarge.status == .contentTooLarge)
            #expect(tooLarge.errorMessage.contains("64 KB"))

            let badID = try await client.send(.get, "/v1/channels/not-a-uuid")
            #expect(badID.status == .badRequest)
            #expect(badID.errorMessage.contains("not-a-uuid"))

            let unknown = UUID()
            let patchUnknown = try await client.send(.patch, "/v1/channels/\(unknown)", json: #"{"name":"B"}"#)
            #expect(patchUnknown.status == .notFound)

            let created = try await client.send(.post, "/v1/channels", json: #"{"name":"Ops"}"#)
            let id = try created.decode(ChannelRecord.self).id
            let empty = try await client.send(.patch, "/v1/channels/\(id)", json: "{}")
            #expect(empty.status == .badRequest)
            #expect(empty.errorMessage.contains("nothing to change"))
            let tooLong = try await client.send(.patch, "/v1/channels/\(id)", json: #"{"maxBurstSeconds":9000}"#)
            #expect(tooLong.status == .badRequest)
            #expect(try await fixture.store.channel(id)?.maxBurstSeconds == 60, "a refused patch changes nothing")
        }
        #expect(fixture.hub?.events.count == 1, "only the one successful create reached the hub")
    }

    @Test func membersAreListedWithoutTheirPushTokensAndCanBeRemoved() async throws {
        let fixture = try await AdminFixture()
        defer { Task { await fixture.cleanUp() } }
        let hub = try #require(fixture.hub)
        let channel = ChannelRecord(name: "Ops")
        try await fixture.store.createChannel(channel)
        try await fixture.store.upsertMember(MemberRecord(channelID: channel.id, userID: "alice", displayName: "Alice"))
        try await fixture.store.upsertMember(MemberRecord(channelID: channel.id, userID: "bob smith", displayName: "Bob"))
        let secret = "a1b2c3d4e5f60718293a4b5c6d7e8f90"
        try await fixture.store.setPushToken(channel: channel.id, user: "alice", token: secret, environment: .sandbox,
                                             registeredAt: Date())
        try await fixture.application.test(.router) { client in
            let list = try await client.send(.get, "/v1/channels/\(channel.id)/members")
            #expect(list.status == .ok)
            #expect(!list.text.contains(secret), "the push token never leaves the server")
            let members = try list.decode([AdminAPI.MemberView].self).sorted { $0.userID < $1.userID }
            #expect(members.map(\.userID) == ["alice", "bob smith"])
            #expect(members[0].hasPushToken && members[0].pushEnvironment == .sandbox && members[0].pushRegisteredAt != nil)
            #expect(!members[1].hasPushToken && members[1].pushEnvironment == nil)

            let removed = try await client.send(.delete, "/v1/channels/\(channel.id)/members/bob%20smith")
            #expect(removed.status == .noContent)
            #expect(try await fixture.store.member(channel: channel.id, user: "bob smith") == nil)
            #expect(try await fixture.store.member(channel: channel.id, user: "alice") != nil)
            #expect(hub.events == [.removed(channel.id, "bob smith")])
            // The tokens bob holds stop working; one issued from now on lets him back in.
            let voids = try await fixture.store.revocation(channel: channel.id, user: "bob smith", tokenID: "any",
                                                           issuedAt: Date().addingTimeInterval(-1))
            #expect(voids?.reason == "removed by an administrator")
            #expect(try await fixture.store.revocation(channel: channel.id, user: "bob smith", tokenID: "any",
                                                       issuedAt: Date().addingTimeInterval(1)) == nil)

            let again = try await client.send(.delete, "/v1/channels/\(channel.id)/members/bob%20smith")
            #expect(again.status == .notFound)
            #expect(again.errorMessage.contains("bob smith"))
            #expect(hub.events.count == 1)

            let unknownChannel = try await client.send(.get, "/v1/channels/\(UUID())/members")
            #expect(unknownChannel.status == .notFound)
        }
    }

    /// A database locked by another process past the busy timeout is a 503 that says to try again, and
    /// the same request then succeeds.
    @Test func aLockedDatabaseIsA503ThatSaysToTryAgain() async throws {
        let fixture = try await AdminFixture(busyTimeout: 0.05)
        defer { Task { await fixture.cleanUp() } }
        try await fixture.application.test(.router) { client in
            let lock = try WriteLockHolder(path: fixture.store.path)
            let busy = try await client.send(.post, "/v1/channels", json: #"{"name":"Ops"}"#)
            lock.unlock()
            #expect(busy.status == .serviceUnavailable, "\(busy.text)")
            #expect(busy.errorMessage.contains("locked") && busy.errorMessage.contains("safe to repeat"), "\(busy.errorMessage)")
            #expect(try await fixture.store.channels().isEmpty)
            let created = try await client.send(.post, "/v1/channels", json: #"{"name":"Ops"}"#)
            #expect(created.status == .created, "\(created.text)")
        }
    }

    /// A member that has just joined is in the hub before the store writer writes its row: removing
    /// it then must not answer 404.
    @Test func aMemberTheHubHoldsBeforeItsRowIsWrittenCanBeRemoved() async throws {
        let fixture = try await AdminFixture(hub: RecordingHub(liveMembers: ["carol"]))
        defer { Task { await fixture.cleanUp() } }
        let hub = try #require(fixture.hub)
        let channel = ChannelRecord(name: "Ops")
        try await fixture.store.createChannel(channel)
        try await fixture.application.test(.router) { client in
            let removed = try await client.send(.delete, "/v1/channels/\(channel.id)/members/carol")
            #expect(removed.status == .noContent, "\(removed.text)")
            #expect(hub.events == [.removed(channel.id, "carol")])
            let voids = try await fixture.store.revocation(channel: channel.id, user: "carol", tokenID: "any",
                                                           issuedAt: Date().addingTimeInterval(-1))
            #expect(voids?.reason == "removed by an administrator", "the tokens carol holds stop working")

            let unknown = try await client.send(.delete, "/v1/channels/\(channel.id)/members/dave")
            #expect(unknown.status == .notFound, "neither the store nor the hub knows dave")
            #expect(hub.events.count == 1)
        }
    }

    @Test func tokensAreRevokedByIDOrWholeAndListed() async throws {
        let fixture = try await AdminFixture()
        defer { Task { await fixture.cleanUp() } }
        let hub = try #require(fixture.hub)
        let channel = ChannelRecord(name: "Ops")
        try await fixture.store.createChannel(channel)
        try await fixture.application.test(.router) { client in
            let issued = try await client.send(.post, "/v1/channels/\(channel.id)/tokens", json: #"{"user":"ann","name":"Ann"}"#)
                .decode(AdminAPI.IssuedToken.self)
            let byID = try await client.send(.post, "/v1/channels/\(channel.id)/revocations",
                                             json: #"{"tokenID":"\#(issued.tokenID)","reason":"phone lost"}"#)
            #expect(byID.status == .created, "\(byID.text)")
            #expect(try byID.decode(RevocationRecord.self).reason == "phone lost")
            let whole = try await fixture.tokens.issue(ParticipantClaims(userID: "bob", name: "Bob", channel: channel.id,
                                                                         capabilities: [.listen], expiresAt: Date().addingTimeInterval(600)))
            let byToken = try await client.send(.post, "/v1/channels/\(channel.id)/revocations", json: #"{"token":"\#(whole)"}"#)
            #expect(byToken.status == .created, "\(byToken.text)")
            let record = try byToken.decode(RevocationRecord.self)
            #expect(record.userID == "bob" && record.expiresAt != nil && record.reason == "revoked by an administrator")
            #expect(hub.events.count == 2 && hub.events.first == .revoked(channel.id, issued.tokenID))

            let listed = try await client.send(.get, "/v1/channels/\(channel.id)/revocations").decode([RevocationRecord].self)
            #expect(listed.map(\.tokenID) == [issued.tokenID, record.tokenID])

            let elsewhere = ChannelRecord(name: "Other")
            try await fixture.store.createChannel(elsewhere)
            let wrong = try await client.send(.post, "/v1/channels/\(elsewhere.id)/revocations", json: #"{"token":"\#(whole)"}"#)
            #expect(wrong.status == .badRequest && wrong.errorMessage.contains("revoke it there"), "\(wrong.text)")
            let neither = try await client.send(.post, "/v1/channels/\(channel.id)/revocations", json: #"{"reason":"x"}"#)
            #expect(neither.status == .badRequest && neither.errorMessage.contains("either tokenID"), "\(neither.text)")
            let garbage = try await client.send(.post, "/v1/channels/\(channel.id)/revocations", json: #"{"token":"a.b.c"}"#)
            #expect(garbage.status == .badRequest, "\(garbage.text)")
            // An id that is no UUID names no token squelchd issued: refused, not stored as a success.
            for id in ["not-a-uuid", "bob", String(repeating: "j", count: 129)] {
                let wrong = try await client.send(.post, "/v1/channels/\(channel.id)/revocations", json: #"{"tokenID":"\#(id)"}"#)
                #expect(wrong.status == .badRequest && wrong.errorMessage.contains("is not a token id"), "\(wrong.text)")
            }
            #expect(hub.events.count == 2, "refused revocations do not reach the hub")
            // An expired token can't join anyway: said so, nothing stored (its revocation would be
            // pruned at once, and a second request told "created" again).
            let expired = try await fixture.tokens.issue(ParticipantClaims(userID: "cy", name: "Cy", channel: channel.id, capabilities: [.listen],
                                                                           issuedAt: Date().addingTimeInterval(-7_200), expiresAt: Date().addingTimeInterval(-3_600)))
            let late = try await client.send(.post, "/v1/channels/\(channel.id)/revocations", json: #"{"token":"\#(expired)"}"#)
            #expect(late.status == .conflict && late.errorMessage.contains("nothing was revoked"), "\(late.text)")
            #expect(hub.events.count == 2)

            // Revoked again: 200, and the first revocation (its reason) is what stands.
            let again = try await client.send(.post, "/v1/channels/\(channel.id)/revocations",
                                              json: #"{"tokenID":"\#(issued.tokenID.lowercased())","reason":"second thoughts"}"#)
            #expect(again.status == .ok, "\(again.text)")
            #expect(try again.decode(RevocationRecord.self).reason == "phone lost")
            // By id, a token a member of another channel joined with: refused, naming where it belongs.
            let carolID = UUID().uuidString
            try await fixture.store.upsertMember(MemberRecord(channelID: elsewhere.id, userID: "carol", displayName: "Carol",
                                                              grant: MemberGrant(canTalk: true, canListen: true, role: nil, priority: 0, tokenID: carolID,
                                                                                 tokenIssuedAt: Date(), tokenExpiresAt: Date().addingTimeInterval(600))))
            let misplaced = try await client.send(.post, "/v1/channels/\(channel.id)/revocations", json: #"{"tokenID":"\#(carolID)"}"#)
            #expect(misplaced.status == .badRequest && misplaced.errorMessage.contains("member 'carol' of channel \(elsewhere.id)")
                    && misplaced.errorMessage.contains("revoke it there"), "\(misplaced.text)")
            // On its own channel it is taken, and the record names carol.
            let placed = try await client.send(.post, "/v1/channels/\(elsewhere.id)/revocations", json: #"{"tokenID":"\#(carolID)"}"#)
            #expect(placed.status == .created, "\(placed.text)")
            #expect(try placed.decode(RevocationRecord.self).userID == "carol")
        }
    }

    @Test func issuedTokensKeepToTheRosterLimits() async throws {
        let fixture = try await AdminFixture()
        defer { Task { await fixture.cleanUp() } }
        let channel = ChannelRecord(name: "Ops")
        try await fixture.store.createChannel(channel)
        try await fixture.application.test(.router) { client in
            let long = String(repeating: "é", count: 40)  // 40 characters, 80 bytes
            let refused = try await client.send(.post, "/v1/channels/\(channel.id)/tokens", json: #"{"user":"ann","name":"\#(long)"}"#)
            #expect(refused.status == .badRequest && refused.errorMessage.contains("at most 64"), "\(refused.text)")
        }
    }

    @Test func rosterComesFromTheHubAndIsEmptyWithoutOne() async throws {
        let participant = Participant(slot: 7, userID: "alice", name: "Alice", role: "dispatcher", priority: 9, talking: true)
        let offline = Participant(slot: 8, userID: "bob", name: "Bob", connection: .offline)
        let entries = [LiveMember(participant: participant, receptionLoss: 12), LiveMember(participant: offline)]
        let fixture = try await AdminFixture(hub: RecordingHub(roster: entries))
        defer { Task { await fixture.cleanUp() } }
        let channel = ChannelRecord(name: "Ops")
        try await fixture.store.createChannel(channel)
        try await fixture.application.test(.router) { client in
            let roster = try await client.send(.get, "/v1/channels/\(channel.id)/roster")
            #expect(roster.status == .ok)
            // The roster entry's own fields, as members see them, with the server's figure beside them.
            #expect(try roster.decode([Participant].self) == [participant, offline])
            #expect(try roster.decode([LiveMember].self) == entries)
            #expect(roster.text.contains("\"receptionLoss\":12"), "\(roster.text)")
            #expect(roster.text.components(separatedBy: "receptionLoss").count == 2, "absent, not null, for bob: \(roster.text)")
            let unknown = try await client.send(.get, "/v1/channels/\(UUID())/roster")
            #expect(unknown.status == .notFound)
        }

        var hubless = fixture.context
        hubless.hub = nil
        try await Application(router: AdminAPI.router(context: hubless)).test(.router) { client in
            let roster = try await client.send(.get, "/v1/channels/\(channel.id)/roster")
            #expect(roster.status == .ok)
            #expect(roster.text == "[]")
            let health = try await client.execute(uri: "/healthz", method: .get)
            #expect(try health.decode(AdminAPI.Health.self).connections == nil)
        }
    }

    @Test func issuedTokensVerifyForTheirChannel() async throws {
        let fixture = try await AdminFixture()
        defer { Task { await fixture.cleanUp() } }
        let channel = ChannelRecord(name: "Ops")
        try await fixture.store.createChannel(channel)
        try await fixture.application.test(.router) { client in
            let before = Date()
            let response = try await client.send(.post, "/v1/channels/\(channel.id)/tokens",
                                                 json: #"{"user":"alice","name":"Alice","capabilities":["listen"],"priority":200,"role":"dispatcher","ttlSeconds":600}"#)
            #expect(response.status == .created)
            let issued = try response.decode(AdminAPI.IssuedToken.self)
            #expect(issued.channel == channel.id && issued.user == "alice")
            #expect(abs(issued.expiresAt.timeIntervalSince(before) - 600) < 5)

            let claims = try await fixture.tokens.verify(issued.token, channel: channel.id)
            #expect(claims.userID == "alice" && claims.name == "Alice")
            #expect(claims.capabilities == [.listen])
            #expect(claims.priority == 200 && claims.role == "dispatcher")
            #expect(claims.tokenID == issued.tokenID)
            let other = UUID()
            await #expect(throws: TokenError.wrongChannel(tokenChannel: channel.id, requested: other)) {
                _ = try await fixture.tokens.verify(issued.token, channel: other)
            }

            let defaults = try await client.send(.post, "/v1/channels/\(channel.id)/tokens", json: #"{"user":"bob","name":"Bob"}"#)
            #expect(defaults.status == .created)
            let bob = try await fixture.tokens.verify(try defaults.decode(AdminAPI.IssuedToken.self).token, channel: channel.id)
            #expect(bob.capabilities == [.talk, .listen] && bob.priority == 0)
            #expect(abs(bob.expiresAt.timeIntervalSince(bob.issuedAt) - 43_200) < 2, "12 hours by default")

            let refusals: [(body: String, expected: String)] = [
                (#"{"user":"a","name":"A","ttlSeconds":2592001}"#, "30 days"),
                (#"{"user":"a","name":"A","ttlSeconds":0}"#, "ttlSeconds"),
                (#"{"user":"a","name":"A","priority":256}"#, "0-255"),
                (#"{"user":"a","name":"A","capabilities":["shout"]}"#, "unknown capability 'shout'"),
                (#"{"user":"a","name":"A","capabilities":[]}"#, "capabilities is empty"),
                (#"{"user":"","name":"A"}"#, "the user id is empty"),
                (#"{"user":"a","name":"Ann\u202Enimda"}"#, "bidirectional"),
                (#"{"user":"a","name":"A","priority":1.5}"#, "1.5"),
                (#"{"name":"A"}"#, "\"user\" is required"),
            ]
            for (body, expected) in refusals {
                let refused = try await client.send(.post, "/v1/channels/\(channel.id)/tokens", json: body)
                #expect(refused.status == .badRequest, "\(body)")
                #expect(refused.errorMessage.contains(expected), "\(body) → \(refused.text)")
            }

            let unknown = try await client.send(.post, "/v1/channels/\(UUID())/tokens", json: #"{"user":"a","name":"A"}"#)
            #expect(unknown.status == .notFound)
            #expect(unknown.errorMessage.contains("GET /v1/channels"))
        }
    }

    @Test func transmissionsAreNewestFirstAndLimited() async throws {
        let fixture = try await AdminFixture()
        defer { Task { await fixture.cleanUp() } }
        let channel = ChannelRecord(name: "Ops")
        try await fixture.store.createChannel(channel)
        let start = Date(timeIntervalSince1970: 1_700_000_000)
        for index in 0..<3 {
            try await fixture.store.logTransmission(TransmissionRecord(
                channelID: channel.id, userID: "user\(index)", startedAt: start.addingTimeInterval(Double(index) * 10),
                durationMilliseconds: 1_000 * (index + 1), endReason: "released"))
        }
        try await fixture.application.test(.router) { client in
            let all = try await client.send(.get, "/v1/channels/\(channel.id)/transmissions")
            #expect(all.status == .ok)
            #expect(try all.decode([TransmissionRecord].self).map(\.userID) == ["user2", "user1", "user0"])
            #expect(all.text.contains("2023-11-14T22:13:40Z"), "ISO 8601: \(all.text)")

            let two = try await client.send(.get, "/v1/channels/\(channel.id)/transmissions?limit=2")
            #expect(try two.decode([TransmissionRecord].self).map(\.userID) == ["user2", "user1"])

            for bad in ["0", "1001", "ten"] {
                let refused = try await client.send(.get, "/v1/channels/\(channel.id)/transmissions?limit=\(bad)")
                #expect(refused.status == .badRequest)
                #expect(refused.errorMessage.contains("limit"))
            }
            let unknown = try await client.send(.get, "/v1/channels/\(UUID())/transmissions")
            #expect(unknown.status == .notFound)
        }
    }
}
