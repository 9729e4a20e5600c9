import ChannelProtocol
import ChannelStore
import Foundation
import Hummingbird
import HummingbirdCore
import Logging
import NIOCore
import ParticipantClaims
import ParticipantTokens
import Prometheus
import SquelchInfo

/// What the admin API works on. The server builds one at start; tests build one around a temporary
/// store, a fake hub and a test registry.
public struct AdminContext: Sendable {
    /// Channels, members and the transmission log.
    public var store: any ChannelStore
    /// Signs the participant tokens `POST /v1/channels/:id/tokens` hands out.
    public var tokens: TokenAuthority
    /// The bearer key every `/v1` request must present (`ServerConfiguration.resolveAdminKey()`).
    public var adminKey: String
    /// Where `adminKey` comes from, in words, for a 401's advice: "the one in <data-dir>/admin-key",
    /// the key file, or the setting.
    public var adminKeySource = "the one in <data-dir>/admin-key, unless set with --admin-key-file, SQUELCH_ADMIN_KEY or SQUELCH_ADMIN_KEY_FILE"
    /// The live channel hub, told about edits so that connected members see them at once. `nil` when
    /// the API runs without a hub (the roster is then empty and edits take effect at the next poll).
    public var hub: (any AdminHubHooks)?
    /// What `GET /metrics` emits.
    public var registry: PrometheusCollectorRegistry
    /// The certificate the transport presents, as `/healthz` shows it.
    public var identitySummary: String
    /// When the server started, for uptime.
    public var started: Date
    /// Whether the server can serve right now; `/healthz` answers 503 when it can't (with the reason, to the admin key).
    /// squelchd's covers the voice transport and the store writer (`StoreWriter.unhealthyReason`).
    /// `/healthz` also reads the store (a cheap `revision()`), so a database that fails reads shows too.
    public var readiness: @Sendable () async -> Readiness
    /// Whether wake pushes are getting through (`PushHealth`); nil when pushes are off. A failing push
    /// path makes `/healthz` "degraded", still 200: the voice service works for everyone connected.
    public var pushStatus: (@Sendable () -> AdminAPI.PushStatus)?
    /// The transport certificate's expiry: `/healthz` is "degraded" within two weeks of it (the
    /// readiness check makes it "unavailable" once it has passed). Nil: not checked.
    public var certificateExpiry: CertificateExpiry?
    /// Where every change made through the API is logged (notice level), as an audit trail: who was
    /// removed, which token revoked or issued, which channel changed. Nil logs nothing.
    public var auditLog: Logger?

    public enum Readiness: Sendable, Equatable {
        case ready
        case unavailable(reason: String)
    }

    public init(store: any ChannelStore, tokens: TokenAuthority, adminKey: String, hub: (any AdminHubHooks)? = nil,
                registry: PrometheusCollectorRegistry = PrometheusCollectorRegistry(), identitySummary: String,
                started: Date = Date(), readiness: @escaping @Sendable () async -> Readiness = { .ready },
                pushStatus: (@Sendable () -> AdminAPI.PushStatus)? = nil, certificateExpiry: CertificateExpiry? = nil,
                auditLog: Logger? = nil) {
        self.store = store
        self.tokens = tokens
        self.adminKey = adminKey
        self.hub = hub
        self.registry = registry
        self.identitySummary = identitySummary
        self.started = started
        self.readiness = readiness
        self.pushStatus = pushStatus
        self.certificateExpiry = certificateExpiry
        self.auditLog = auditLog
    }

    /// One entry of the audit trail: a line in the log and a record in the store (`AuditRecord`), which
    /// `GET /v1/audit` and `squelchd audit` read. Tokens themselves are never recorded, only their ids.
    /// Written after the change it records: a store that fails here fails the record, not the change,
    /// which is made and answered (a retry would repeat it); the log line says so.
    func audit(_ action: String, channel: UUID?, user: String? = nil, _ details: [String: String] = [:]) async {
        var metadata: Logger.Metadata = details.mapValues { .string($0) }
        if let channel { metadata["channel"] = "\(channel)" }
        if let user { metadata["user"] = .string(user) }
        auditLog?.notice("admin API: \(action)", metadata: metadata)
        do {
            try await store.recordAudit(AuditRecord(source: AuditRecord.Source.api, action: action, channelID: channel,
                                                    userID: user, details: details))
        } catch {
            metadata["error"] = "\(error)"
            (auditLog ?? Logger(label: "squelchd.audit")).error("admin API: '\(action)' was made but could not be recorded in the audit trail", metadata: metadata)
        }
    }
}

/// The admin HTTP API (docs/decisions/0031-admin-api.md).
///
/// Unauthenticated: `GET /healthz`, `GET /version`, `GET /metrics`. Everything under `/v1` needs
/// `Authorization: Bearer <admin key>` and speaks JSON; every error is `{"error": "..."}` saying what
/// went wrong and what to do. Dates are ISO 8601.
public enum AdminAPI {
    /// Request bodies larger than this are refused with 413.
    public static let maxBodyBytes = 64 * 1024
    /// Longest participant token lifetime `POST /v1/channels/:id/tokens` issues.
    public static let maxTokenLifetimeSeconds = Int(ParticipantClaims.maxLifetime)
    public static let defaultTokenLifetimeSeconds = 12 * 3_600
    public static let defaultTransmissionLimit = 50
    public static let maxTransmissionLimit = 1_000
    public static let metricsContentType = "text/plain; version=0.0.4"

    /// `GET /healthz` body. `status` is "ok" while the server can serve; "degraded" (still 200) while
    /// it serves connected members but wake pushes are failing; "unavailable" (503) when it can't
    /// serve. `reason` says why for the last two, to a request with the admin key; without it,
    /// only that the key shows why (and `pushes.reason` is left out).
    public struct Health: Codable, Sendable, Equatable {
        public var status: String
        public var reason: String?
        public var version: String
        public var uptimeSeconds: Double
        public var certificate: String
        /// Live connections, when a hub is attached.
        public var connections: Int?
        /// Wake pushes; absent when pushes are off.
        public var pushes: PushStatus?
    }

    /// The push part of `/healthz`.
    public struct PushStatus: Codable, Sendable, Equatable {
        /// "ok" (the last push that said anything of the server went out), "idle" (none sent since
        /// start), or "failing" (see `PushHealth`).
        public var status: String
        /// While failing: what the last failure says is wrong, and what to check.
        public var reason: String?
        public var failingSince: Date?
        /// Failures on the server's side since the last delivery (device tokens' own don't count).
        public var failuresSinceLastDelivery: Int
        public var lastDelivered: Date?

        public init(status: String, reason: String?, failingSince: Date?, failuresSinceLastDelivery: Int, lastDelivered: Date?) {
            self.status = status
            self.reason = reason
            self.failingSince = failingSince
            self.failuresSinceLastDelivery = failuresSinceLastDelivery
            self.lastDelivered = lastDelivered
        }
    }

    /// A channel member as `GET /v1/channels/:id/members` shows it.
    public typealias MemberView = MemberSummary

    /// Every endpoint the router has: its path (a `{name}` segment is a parameter) and its methods, in
    /// the order `Allow` lists them. Read off the registered routes, so that a known path asked with
    /// another method gets 405 and `Allow` (RFC 9110 §15.5.6), not the 404 that would send a client
    /// looking for a path that exists.
    static func endpoints(of routes: [Router<BasicRequestContext>.RouteDescription]) -> [(path: String, methods: [HTTPRequest.Method])] {
        let order: [HTTPRequest.Method] = [.get, .head, .post, .put, .patch, .delete]
        var paths: [String] = [], methods: [String: [HTTPRequest.Method]] = [:]
        for route in routes {
            let path = route.path.description
            if methods[path] == nil { paths.append(path) }
            methods[path, default: []].append(route.method)
        }
        return paths.map { path in
            (path, methods[path, default: []].sorted { (order.firstIndex(of: $0) ?? order.count) < (order.firstIndex(of: $1) ?? order.count) })
        }
    }

    /// The methods of the endpoint `path` names in `endpoints` (nil: no endpoint has this path).
    static func methods(ofPath path: String, in endpoints: [(path: String, methods: [HTTPRequest.Method])]) -> [HTTPRequest.Method]? {
        let segments = path.split(separator: "/", omittingEmptySubsequences: true)
        return endpoints.first { endpoint in
            let pattern = endpoint.path.split(separator: "/")
            return pattern.count == segments.count && zip(pattern, segments).allSatisfy { $0.hasPrefix("{") || $0 == $1 }
        }?.methods
    }

    /// The HTTP server the API runs on: HTTP/1.1, closing a connection that sends nothing for
    /// `idleTimeout`, half-sent requests included. Without it a client that sent half its headers
    /// held its connection for good, and one that stalled mid-body held squelchd's shutdown for its
    /// whole 30 s budget, before the voice members were told the server was going away.
    public static func httpServer(idleTimeout: Duration = .seconds(10)) -> HTTPServerBuilder {
        .http1(configuration: .init(idleTimeout: TimeAmount(idleTimeout)))
    }

    /// Builds the router.
    public static func router(context admin: AdminContext) -> Router<BasicRequestContext> {
        let router = Router()
        router.get("/healthz") { request, _ in try await health(admin, request: request) }
        // Load balancers often check health with HEAD: the same status, no body.
        router.on("/healthz", method: .head) { request, _ in
            let full = try await health(admin, request: request)
            return Response(status: full.status, headers: [.contentType: "application/json"])
        }
        router.get("/version") { _, _ in SquelchInfo.version + "\n" }
        router.get("/metrics") { _, _ in
            Response(status: .ok, headers: [.contentType: metricsContentType],
                     body: .init(byteBuffer: ByteBuffer(bytes: admin.registry.emitToBuffer())))
        }

        let v1 = router.group("v1")
            .add(middleware: JSONErrorMiddleware())
            .add(middleware: BearerAuthMiddleware(key: admin.adminKey, source: admin.adminKeySource))
        ChannelsController(admin: admin).addRoutes(to: v1)
        MembersController(admin: admin).addRoutes(to: v1)
        TokensController(admin: admin).addRoutes(to: v1)
        LogsController(admin: admin).addRoutes(to: v1)
        ClusterController(admin: admin).addRoutes(to: v1)
        // Last, so that it wraps only what no route matched (Hummingbird applies a router's
        // middleware to the routes added after it, and to its not-found answer).
        router.add(middleware: UnknownEndpointMiddleware(endpoints: endpoints(of: router.routes)))
        return router
    }

    // MARK: - Health

    /// Anyone may ask (a load balancer carries no key), but only the admin key sees why the server
    /// is unwell: the reasons name database errors, file paths and hosts, which help an attacker
    /// more than a load balancer.
    static func health(_ admin: AdminContext, request: Request) async throws -> Response {
        var reason: String?
        if case .unavailable(let why) = await admin.readiness() { reason = why }
        if reason == nil {
            do { _ = try await admin.store.revision() } catch { reason = "the channel store is failing: \(error)" }
        }
        let pushes = admin.pushStatus?()
        var status = reason == nil ? "ok" : "unavailable"
        if reason == nil, let pushes, pushes.status == "failing" {
            status = "degraded"
            reason = "wake pushes are failing, so members who are not connected are not woken: \(pushes.reason ?? "see the log")"
        }
        if status != "unavailable", case .expiresSoon(let why)? = admin.certificateExpiry?.status() {
            status = "degraded"
            reason = reason.map { "\($0); and \(why)" } ?? why
        }
        var shown = pushes
        if !BearerKey.matches(request.headers, key: Array(admin.adminKey.utf8)) {
            if reason != nil { reason = "send the admin key ('Authorization: Bearer <admin key>') to see why" }
            shown?.reason = nil
        }
        let health = Health(status: status, reason: reason, version: SquelchInfo.version,
                            uptimeSeconds: Date().timeIntervalSince(admin.started), certificate: admin.identitySummary,
                            connections: await admin.hub?.connectionCount(), pushes: shown)
        return try json(health, status: status == "unavailable" ? .serviceUnavailable : .ok)
    }

    // MARK: - Helpers

    /// The mode as the API names it ("halfDuplex"), or as `squelchd channel --mode` does ("half"),
    /// so that what works on the command line works in a request too. Answers always name it in full.
    static func transmissionMode(_ text: String) throws(AdminError) -> TransmissionMode {
        if let mode = TransmissionMode(rawValue: text) { return mode }
        switch text {
        case "half": return .halfDuplex
        case "full": return .fullDuplex
        default:
            let valid = TransmissionMode.allCases.map { "\"\($0.rawValue)\"" }.joined(separator: " or ")
            throw AdminError(.badRequest, "mode must be \(valid) (or \"half\", \"full\"), not \"\(text)\"")
        }
    }

    static func channelID(_ context: BasicRequestContext) throws(AdminError) -> UUID {
        guard let id = context.parameters.get("id", as: UUID.self) else {
            throw AdminError(.badRequest, "'\(context.parameters.get("id") ?? "")' is not a channel id (a UUID); GET /v1/channels lists them")
        }
        return id
    }

    static func existingChannel(_ id: UUID, in store: any ChannelStore) async throws -> ChannelRecord {
        guard let channel = try await store.channel(id) else { throw StoreError.channelNotFound(id) }
        return channel
    }

    static let encoder: JSONEncoder = {
        let encoder = JSONEncoder()
        encoder.dateEncodingStrategy = .iso8601
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return encoder
    }()

    /// `?limit=` of the endpoints that list a log, newest first.
    static func limitParameter(_ request: Request) throws(AdminError) -> Int {
        guard let text = request.uri.queryParameters.get("limit") else { return defaultTransmissionLimit }
        guard let value = Int(text), (1...maxTransmissionLimit).contains(value) else {
            throw AdminError(.badRequest, "limit must be a whole number from 1 to \(maxTransmissionLimit), not '\(text)'")
        }
        return value
    }

    static func json(_ value: some Encodable, status: HTTPResponse.Status = .ok) throws -> Response {
        let data = try encoder.encode(value)
        return Response(status: status, headers: [.contentType: "application/json; charset=utf-8"],
                        body: .init(byteBuffer: ByteBuffer(bytes: data)))
    }

    /// Reads a JSON object body of at most `maxBodyBytes`, refusing unknown fields, and decodes it;
    /// every failure is a 400 or 413 saying what to fix.
    static func decode<Body: Decodable>(_ type: Body.Type, from request: Request) async throws -> Body {
        let fields: [String]
        switch type {
        case is NewChannel.Type: fields = NewChannel.fields
        case is ChannelPatch.Type: fields = ChannelPatch.fields
        case is TokenRequest.Type: fields = TokenRequest.fields
        case is RevocationRequest.Type: fields = RevocationRequest.fields
        default: fields = []
        }
        var request = request
        let buffer: ByteBuffer
        do { buffer = try await request.collectBody(upTo: maxBodyBytes) } catch is NIOTooManyBytesError {
            throw AdminError(.contentTooLarge, "the request body is over \(maxBodyBytes / 1024) KB; send a smaller one (inline images must be at most \(ChannelRecord.maxImageBytes / 1024) KB)")
        }
        let data = Data(buffer: buffer)
        let expected = "send a JSON object with \(fields.joined(separator: ", "))"
        guard !data.isEmpty else { throw AdminError(.badRequest, "the request body is empty; \(expected)") }
        let object: Any
        do { object = try JSONSerialization.jsonObject(with: data) } catch {
            throw AdminError(.badRequest, "the request body is not valid JSON (\(error.localizedDescription)); \(expected)")
        }
        guard let dictionary = object as? [String: Any] else {
            throw AdminError(.badRequest, "the request body must be a JSON object; \(expected)")
        }
        if let unknown = dictionary.keys.sorted().first(where: { !fields.contains($0) }) {
            throw AdminError(.badRequest, "unknown field \"\(unknown)\"; valid fields are \(fields.joined(separator: ", "))")
        }
        // Foundation's decoder reports a fraction given for a whole number as "not valid JSON",
        // naming no field; the body is valid JSON, so say which field and why.
        for field in ["maxBurstSeconds", "priority", "ttlSeconds"] where fields.contains(field) {
            if let number = dictionary[field] as? NSNumber, number.doubleValue.rounded() != number.doubleValue {
                throw AdminError(.badRequest, "field \"\(field)\" must be a whole number, not \(number)")
            }
        }
        do { return try JSONDecoder().decode(Body.self, from: data) } catch let error as AdminError {
            throw error
        } catch let error as DecodingError {
            throw AdminError(.badRequest, describe(error))
        }
    }

    static func describe(_ error: DecodingError) -> String {
        func field(_ path: [any CodingKey]) -> String {
            path.map { $0.intValue.map { "[\($0)]" } ?? $0.stringValue }.joined(separator: ".")
        }
        switch error {
        case .keyNotFound(let key, _):
            return "field \"\(key.stringValue)\" is required"
        case .valueNotFound(_, let context):
            return "field \"\(field(context.codingPath))\" must not be null"
        case .typeMismatch(let type, let context):
            return "field \"\(field(context.codingPath))\" must be \(describe(type))"
        case .dataCorrupted(let context):
            // The body parsed as JSON before it was decoded, so this is a value of the wrong kind,
            // whose field Foundation doesn't always name.
            if context.codingPath.isEmpty { return "a field has a value of the wrong kind (\(context.debugDescription)); check that each number, string and list is where the API expects one" }
            return "field \"\(field(context.codingPath))\" is not valid (\(context.debugDescription))"
        @unknown default:
            return "the request body could not be read (\(error))"
        }
    }

    static func describe(_ type: Any.Type) -> String {
        switch type {
        case is String.Type: return "a string"
        case is Int.Type: return "a whole number"
        case is Double.Type: return "a number"
        case is Bool.Type: return "true or false"
        case is [String].Type, is [Any].Type: return "an array of strings"
        default: return "a \(type)"
        }
    }
}

/// An API error: its status and a message that says what to do, sent as `{"error": "..."}`.
struct AdminError: HTTPResponseError, CustomStringConvertible {
    var status: HTTPResponse.Status
    var message: String
    var headers: HTTPFields

    init(_ status: HTTPResponse.Status, _ message: String, headers: HTTPFields = [:]) {
        self.status = status
        self.message = message
        self.headers = headers
    }

    var description: String { "\(status.code) \(message)" }

    func response(from request: Request, context: some RequestContext) throws -> Response {
        var response = try AdminAPI.json(["error": message], status: status)
        response.headers.append(contentsOf: headers)
        return response
    }

    init(_ error: StoreError) {
        switch error {
        case .invalid: self.init(.badRequest, error.description)
        case .channelNotFound(let id): self.init(.notFound, "no channel \(id); GET /v1/channels lists the channels")
        case .memberNotFound: self.init(.notFound, error.description + "; GET /v1/channels/<id>/members lists the members")
        case .database: self.init(.internalServerError, error.description + "; check the server log and the data directory")
        case .unavailable, .fenced: self.init(.serviceUnavailable, error.description + "; the request is safe to repeat: try again shortly")
        }
    }
}

/// Turns every error under `/v1` into a JSON error body: store errors get their status, anything
/// unexpected is a logged 500.
struct JSONErrorMiddleware<Context: RequestContext>: RouterMiddleware {
    func handle(_ request: Request, context: Context,
                next: (Request, Context) async throws -> Response) async throws -> Response {
        do { return try await next(request, context) } catch let error as AdminError {
            throw error
        } catch let error as StoreError {
            switch error {
            case .database, .unavailable, .fenced: context.logger.error("admin API: \(error)")
            case .invalid, .channelNotFound, .memberNotFound: break
            }
            throw AdminError(error)
        } catch let error as any HTTPResponseError {
            // Hummingbird's own (for example a missing route parameter): keep the status, say it in JSON.
            throw AdminError(error.status, "\(error)")
        } catch {
            context.logger.error("admin API: \(request.method) \(request.uri.path) failed: \(error)")
            throw AdminError(.internalServerError, "internal error (\(error)); check the server log")
        }
    }
}

/// Turns the router's bare 404 for a path or method it has no route for into the API's JSON error,
/// with where the routes are.
struct UnknownEndpointMiddleware<Context: RequestContext>: RouterMiddleware {
    let endpoints: [(path: String, methods: [HTTPRequest.Method])]

    func handle(_ request: Request, context: Context,
                next: (Request, Context) async throws -> Response) async throws -> Response {
        do { return try await next(request, context) } catch let error as HTTPError where error.status == .notFound {
            if let methods = AdminAPI.methods(ofPath: request.uri.path, in: endpoints), !methods.contains(request.method) {
                let allowed = methods.map(\.rawValue).joined(separator: ", ")
                throw AdminError(.methodNotAllowed, "\(request.uri.path) takes \(allowed), not \(request.method)",
                                 headers: [.allow: allowed])
            }
            throw AdminError(.notFound, "there is no \(request.method) \(request.uri.path); the admin API has GET /healthz, /version and /metrics, and its JSON endpoints under /v1/channels and /v1/audit (docs/decisions/0031-admin-api.md)")
        }
    }
}

/// Checks `Authorization: Bearer <key>` in constant time.
struct BearerAuthMiddleware<Context: RequestContext>: RouterMiddleware {
    let key: [UInt8]
    /// Where the key is, for the 401's advice.
    let source: String

    init(key: String, source: String) {
        self.key = Array(key.utf8)
        self.source = source
    }

    func handle(_ request: Request, context: Context,
                next: (Request, Context) async throws -> Response) async throws -> Response {
        let challenge: HTTPFields = [.wwwAuthenticate: "Bearer"]
        guard let header = request.headers[.authorization] else {
            throw AdminError(.unauthorized, "missing Authorization header; send 'Authorization: Bearer <admin key>' (this server's key is \(source))", headers: challenge)
        }
        guard let given = BearerKey.given(header) else {
            throw AdminError(.unauthorized, "the Authorization header must be 'Bearer <admin key>'", headers: challenge)
        }
        guard BearerKey.constantTimeEqual(given, key) else {
            throw AdminError(.unauthorized, "wrong admin key; this server's key is \(source)", headers: challenge)
        }
        return try await next(request, context)
    }
}

/// The admin key as a request carries it: `Authorization: Bearer <key>`.
enum BearerKey {
    /// The key in an Authorization header's value; nil when it is not 'Bearer <key>'.
    static func given(_ header: String) -> [UInt8]? {
        let parts = header.split(separator: " ", maxSplits: 1, omittingEmptySubsequences: true)
        guard parts.count == 2, parts[0].lowercased() == "bearer" else { return nil }
        return Array(parts[1].trimmingCharacters(in: .whitespaces).utf8)
    }

    /// Whether `headers` carry `key`.
    static func matches(_ headers: HTTPFields, key: [UInt8]) -> Bool {
        guard let header = headers[.authorization], let given = given(header) else { return false }
        return constantTimeEqual(given, key)
    }

    /// Compares every byte of `expected` whatever the input, so the time taken says nothing about how
    /// much of a guess was right.
    static func constantTimeEqual(_ given: [UInt8], _ expected: [UInt8]) -> Bool {
        var difference: UInt8 = given.count == expected.count ? 0 : 1
        for index in expected.indices {
            difference |= (index < given.count ? given[index] : 0) ^ expected[index]
        }
        return difference == 0
    }
}
