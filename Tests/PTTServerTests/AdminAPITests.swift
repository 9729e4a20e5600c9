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
                    .replacingOccurrences(of: "{node}", with: "node-a")
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

    /// The reason goes only to the admin key: it can name database errors, paths and hosts. Anyone
    /// else (a load balancer) gets the status, and how to see why.
    @Test func healthzIs503WithAReasonForTheAdminKeyOnly() async throws {
        let fixture = try await AdminFixture(readiness: { .unavailable(reason: "the store at /var/lib/squelch failed: disk I/O error") })
        defer { Task { await fixture.cleanUp() } }
        try await fixture.application.test(.router) { client in
            let response = try await client.send(.get, "/healthz")
            #expect(response.status == .serviceUnavailable)
            let health = try response.decode(AdminAPI.Health.self)
            #expect(health.status == "unavailable")
            #expect(health.reason == "the store at /var/lib/squelch failed: disk I/O error")
            #expect(!health.version.isEmpty)
            for key in [nil, AdminFixture.key + "x"] {
                let anonymous = try await client.send(.get, "/healthz", key: key)
                #expect(anonymous.status == .serviceUnavailable)
                let told = try anonymous.decode(AdminAPI.Health.self)
                #expect(told.status == "unavailable" && !anonymous.text.contains("/var/lib") && !anonymous.text.contains("disk"), "\(anonymous.text)")
                #expect(told.reason?.contains("Authorization: Bearer <admin key>") == true)
            }
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
            let response = try await client.send(.get, "/healthz")
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
        #expect(BearerKey.constantTimeEqual(key, key))
        #expect(!BearerKey.constantTimeEqual(Array("abcdeg".utf8), key))
        #expect(!BearerKey.constantTimeEqual(Array("abcde".utf8), key))
        #expect(!BearerKey.constantTimeEqual(Array("abcdef\0".utf8), key))
        #expect(!BearerKey.constantTimeEqual([], key))
    }
}
