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
    /// Whether the server can serve right now; `/healthz` answers 503 with the reason when it can't.
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
    /// serve. `reason` says why for the last two.
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

    /// `POST /v1/channels/:id/tokens` answer.
    public struct IssuedToken: Codable, Sendable, Equatable {
        public var token: String
        public var tokenID: String
        public var channel: UUID
        public var user: String
        public var expiresAt: Date
    }

    /// Every endpoint: its path (a segment starting with ':' is a parameter) and its methods. The
    /// router's registrations below must agree (AdminAPITests checks each): the table is what lets a
    /// known path asked with another method get 405 and `Allow` (RFC 9110 §15.5.6), rather than the
    /// 404 that would send a client looking for a path that exists.
    static let endpoints: [(path: String, methods: [HTTPRequest.Method])] = [
        ("/healthz", [.get, .head]), ("/version", [.get]), ("/metrics", [.get]),
        ("/v1/channels", [.get, .post]), ("/v1/channels/:id", [.get, .patch, .delete]),
        ("/v1/channels/:id/members", [.get]), ("/v1/channels/:id/members/:user", [.delete]),
        ("/v1/channels/:id/revocations", [.get, .post]), ("/v1/channels/:id/roster", [.get]),
        ("/v1/channels/:id/tokens", [.post]), ("/v1/channels/:id/transmissions", [.get]),
        ("/v1/audit", [.get]),
    ]

    /// The methods of the endpoint `path` names (nil: no endpoint has this path).
    static func methods(ofPath path: String) -> [HTTPRequest.Method]? {
        let segments = path.split(separator: "/", omittingEmptySubsequences: true)
        return endpoints.first { endpoint in
            let pattern = endpoint.path.split(separator: "/")
            return pattern.count == segments.count && zip(pattern, segments).allSatisfy { $0.hasPrefix(":") || $0 == $1 }
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
        router.get("/healthz") { _, _ in try await health(admin) }
        // Load balancers often check health with HEAD: the same status, no body.
        router.on("/healthz", method: .head) { _, _ in
            let full = try await health(admin)
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
        let store = admin.store

        v1.get("channels") { _, _ in
            try json(try await store.channels().map(ChannelView.init))
        }
        v1.post("channels") { request, _ in
            let body = try await decode(NewChannel.self, from: request)
            var channel = ChannelRecord(name: body.name.trimmingCharacters(in: .whitespacesAndNewlines), image: body.image,
                                        maxBurstSeconds: body.maxBurstSeconds ?? 60)
            if let mode = body.mode { channel.mode = try transmissionMode(mode) }
            try channel.validate()
            try await store.createChannel(channel)
            // The hub first: the trail's write (which may wait on a busy database) must not delay
            // what connected members see.
            await admin.hub?.channelChanged(channel.id)
            await admin.audit("channel created", channel: channel.id, ["name": channel.name, "mode": "\(channel.mode)",
                                                                       "max_burst_seconds": "\(channel.maxBurstSeconds)"])
            return try json(ChannelView(try await store.channel(channel.id) ?? channel), status: .created)
        }
        v1.get("channels/:id") { _, context in
            try json(ChannelView(try await existingChannel(try channelID(context), in: store)))
        }
        v1.patch("channels/:id") { request, context in
            let id = try channelID(context)
            let patch = try await decode(ChannelPatch.self, from: request)
            var channel = try await existingChannel(id, in: store)
            if let name = patch.name { channel.name = name.trimmingCharacters(in: .whitespacesAndNewlines) }
            if patch.imageSent { channel.image = patch.image }
            if let mode = patch.mode { channel.mode = try transmissionMode(mode) }
            if let burst = patch.maxBurstSeconds { channel.maxBurstSeconds = burst }
            try channel.validate()
            let updated = try await store.updateChannel(channel)
            await admin.hub?.channelChanged(id)
            await admin.audit("channel updated", channel: id, ["name": updated.name, "mode": "\(updated.mode)",
                                                               "max_burst_seconds": "\(updated.maxBurstSeconds)", "image": updated.image == nil ? "none" : "set"])
            return try json(ChannelView(updated))
        }
        v1.delete("channels/:id") { _, context in
            let id = try channelID(context)
            // Read first: once deleted, the trail's record is all that names the channel.
            let channel = try await existingChannel(id, in: store)
            try await store.deleteChannel(id)
            await admin.hub?.channelDeleted(id)
            await admin.audit("channel deleted", channel: id, ["name": channel.name])
            return Response(status: .noContent)
        }

        v1.get("channels/:id/members") { _, context in
            let id = try channelID(context)
            _ = try await existingChannel(id, in: store)
            return try json(try await store.members(of: id).map(MemberView.init))
        }
        v1.delete("channels/:id/members/:user") { _, context in
            let id = try channelID(context)
            // Path parameters arrive percent-encoded (a user id may hold any character).
            let raw = try context.parameters.require("user")
            let user = raw.removingPercentEncoding ?? raw
            _ = try await existingChannel(id, in: store)
            // The hub is asked too: a member that joined moments ago is live before the store writer
            // has written its row, and an administrator who sees it in the roster must be able to
            // remove it. The hub's removal then queues the row's deletion behind that write.
            var known = try await store.member(channel: id, user: user) != nil
            if !known, let hub = admin.hub { known = await hub.isMember(channel: id, user: user) }
            guard known else { throw StoreError.memberNotFound(channel: id, user: user) }
            // Revoked first, so that a rejoin racing the removal is refused: the tokens the member
            // holds stop working, and a token issued from the next millisecond on lets it back in.
            let revocation = try await store.revoke(.member(channel: id, user: user, at: Date(), reason: "removed by an administrator"))
            do { try await store.removeMember(channel: id, user: user) } catch StoreError.memberNotFound {}
            await admin.hub?.memberRemoved(channel: id, user: user, revocation: revocation)
            await admin.audit("member removed", channel: id, user: user)
            return Response(status: .noContent)
        }
        v1.post("channels/:id/revocations") { request, context in
            let id = try channelID(context)
            _ = try await existingChannel(id, in: store)
            let body = try await decode(RevocationRequest.self, from: request)
            let revocation = try await body.revocation(channel: id, tokens: admin.tokens, now: Date())
            let stored: RevocationRecord
            let isNew: Bool
            switch try await store.revokeToken(revocation, byIDAlone: body.token == nil) {
            case .otherChannel(let channel, let holder):
                throw AdminError(.badRequest, "token \(revocation.tokenID ?? "") is the one member '\(holder)' of channel \(channel) last joined with, not a token for this channel; revoke it there")
            case .revoked(let record, let new, _):
                (stored, isNew) = (record, new)
            }
            await admin.hub?.tokenRevoked(stored)
            await admin.audit(isNew ? "token revoked" : "token revocation repeated", channel: id, user: stored.userID,
                              AuditRecord.revocationDetails(stored, requestedReason: revocation.reason))
            // Revoked before: the first revocation stands (its time and reason), so nothing was created.
            return try json(stored, status: isNew ? .created : .ok)
        }
        v1.get("channels/:id/revocations") { _, context in
            let id = try channelID(context)
            _ = try await existingChannel(id, in: store)
            return try json(try await store.revocations(after: 0, channel: id))
        }
        v1.get("channels/:id/roster") { _, context in
            let id = try channelID(context)
            _ = try await existingChannel(id, in: store)
            return try json(await admin.hub?.roster(of: id) ?? [])
        }

        v1.post("channels/:id/tokens") { request, context in
            let id = try channelID(context)
            _ = try await existingChannel(id, in: store)
            let body = try await decode(TokenRequest.self, from: request)
            let claims = try body.claims(channel: id, now: Date())
            do throws(InvalidClaims) { try claims.validateForIssue() } catch { throw AdminError(.badRequest, error.message) }
            let token: String
            do { token = try await admin.tokens.issue(claims) } catch {
                throw AdminError(.internalServerError, "could not sign the token (\(error)); check the token key in the data directory")
            }
            await admin.audit("token issued", channel: id, user: claims.userID, AuditRecord.tokenDetails(claims))
            return try json(IssuedToken(token: token, tokenID: claims.tokenID, channel: id, user: claims.userID,
                                        expiresAt: claims.expiresAt), status: .created)
        }

        v1.get("channels/:id/transmissions") { request, context in
            let id = try channelID(context)
            let limit = try limitParameter(request)
            // The log outlives a deleted channel, so a deleted channel's bursts can still be read; a
            // channel that never had any and doesn't exist is a 404.
            let log = try await store.transmissions(of: id, limit: limit)
            if log.isEmpty { _ = try await existingChannel(id, in: store) }
            return try json(log)
        }
        v1.get("audit") { request, _ in
            let limit = try limitParameter(request)
            var channel: UUID?
            if let text = request.uri.queryParameters.get("channel") {
                guard let id = UUID(uuidString: text) else {
                    throw AdminError(.badRequest, "channel must be a channel UUID, not '\(text)'; GET /v1/channels lists them")
                }
                channel = id
            }
            // A deleted channel's records stay readable, as its transmission log does.
            return try json(try await store.auditRecords(channel: channel, limit: limit))
        }
        // Last, so that it wraps only what no route matched (Hummingbird applies a router's
        // middleware to the routes added after it, and to its not-found answer).
        router.add(middleware: UnknownEndpointMiddleware())
        return router
    }

    // MARK: - Health

    static func health(_ admin: AdminContext) async throws -> Response {
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
        let health = Health(status: status, reason: reason, version: SquelchInfo.version,
                            uptimeSeconds: Date().timeIntervalSince(admin.started), certificate: admin.identitySummary,
                            connections: await admin.hub?.connectionCount(), pushes: pushes)
        return try json(health, status: status == "unavailable" ? .serviceUnavailable : .ok)
    }

    // MARK: - Request bodies

    struct NewChannel: Decodable {
        static let fields = ["name", "image", "mode", "maxBurstSeconds"]
        var name: String
        var image: String?
        var mode: String?
        var maxBurstSeconds: Int?
    }

    /// A partial update: absent fields stay; `"image": null` clears the image.
    struct ChannelPatch: Decodable {
        static let fields = NewChannel.fields
        var name: String?
        var image: String?
        var imageSent = false
        var mode: String?
        var maxBurstSeconds: Int?

        enum CodingKeys: String, CodingKey { case name, image, mode, maxBurstSeconds }

        init(from decoder: any Decoder) throws {
            let container = try decoder.container(keyedBy: CodingKeys.self)
            name = try container.decodeIfPresent(String.self, forKey: .name)
            mode = try container.decodeIfPresent(String.self, forKey: .mode)
            maxBurstSeconds = try container.decodeIfPresent(Int.self, forKey: .maxBurstSeconds)
            if container.contains(.image) {
                imageSent = true
                image = try container.decodeNil(forKey: .image) ? nil : try container.decode(String.self, forKey: .image)
            }
            if name == nil, !imageSent, mode == nil, maxBurstSeconds == nil {
                throw AdminError(.badRequest, "nothing to change; send one or more of \(Self.fields.joined(separator: ", "))")
            }
        }
    }

    struct TokenRequest: Decodable {
        static let fields = ["user", "name", "capabilities", "priority", "role", "ttlSeconds"]
        var user: String
        var name: String
        var capabilities: [String]?
        var priority: Int?
        var role: String?
        var ttlSeconds: Int?

        func claims(channel: UUID, now: Date) throws(AdminError) -> ParticipantClaims {
            // Lengths and characters are `ParticipantClaims.validateForIssue`'s, as for the CLI.
            let user = self.user.trimmingCharacters(in: .whitespacesAndNewlines)
            let name = self.name.trimmingCharacters(in: .whitespacesAndNewlines)
            var capabilities = Set<Capability>()
            for text in self.capabilities ?? ["talk", "listen"] {
                guard let capability = Capability(rawValue: text) else {
                    throw AdminError(.badRequest, "unknown capability '\(text)'; use \"talk\", \"listen\" or both")
                }
                capabilities.insert(capability)
            }
            guard !capabilities.isEmpty else {
                throw AdminError(.badRequest, "capabilities is empty; give \"talk\", \"listen\" or both")
            }
            let priority = self.priority ?? 0
            guard (0...255).contains(priority) else {
                throw AdminError(.badRequest, "priority must be 0-255, not \(priority)")
            }
            let ttl = ttlSeconds ?? defaultTokenLifetimeSeconds
            guard (1...maxTokenLifetimeSeconds).contains(ttl) else {
                throw AdminError(.badRequest, "ttlSeconds must be 1-\(maxTokenLifetimeSeconds) (30 days), not \(ttl)")
            }
            let role = role?.trimmingCharacters(in: .whitespacesAndNewlines)
            return ParticipantClaims(userID: user, name: name, channel: channel, capabilities: capabilities,
                                     role: role?.isEmpty == true ? nil : role, priority: UInt8(priority),
                                     issuedAt: now, expiresAt: now.addingTimeInterval(TimeInterval(ttl)))
        }
    }

    /// `POST /v1/channels/:id/revocations`: one token, by its id (`tokenID` from the issue answer) or
    /// whole (`token`, whose expiry then bounds how long the revocation is kept).
    struct RevocationRequest: Decodable {
        static let fields = ["tokenID", "token", "reason"]
        var tokenID: String?
        var token: String?
        var reason: String?

        func revocation(channel: UUID, tokens: TokenAuthority, now: Date) async throws(AdminError) -> RevocationRecord {
            // Lengths are checked by `RevocationRecord.validate()` when the store takes it (a 400).
            let reason = (reason?.trimmingCharacters(in: .whitespacesAndNewlines)).flatMap { $0.isEmpty ? nil : $0 } ?? "revoked by an administrator"
            switch (tokenID, token) {
            case (let id?, nil):
                guard RevocationRecord.isIssuedTokenID(id) else {
                    throw AdminError(.badRequest, "tokenID '\(id.prefix(64))' is not a token id (a UUID: the tokenID of the issue answer, or of the member in GET /v1/channels/:id/members); or send the token itself as token")
                }
                return .token(id, channel: channel, user: nil, expiresAt: nil, at: now, reason: reason)
            case (nil, let token?):
                let claims: ParticipantClaims
                do throws(TokenError) { claims = try await tokens.inspect(token) } catch {
                    throw AdminError(.badRequest, "token: \(error)")
                }
                guard claims.channel == channel else {
                    throw AdminError(.badRequest, "the token is for channel \(claims.channel), not \(channel); revoke it there")
                }
                // Its revocation would be pruned as soon as stored (it outlives the token by nothing),
                // and a second request would be told "new" again: say what is true instead.
                guard claims.expiresAt > now else {
                    throw AdminError(.conflict, "the token expired at \(claims.expiresAt.formatted(.iso8601)), so it can't join anyway; nothing was revoked")
                }
                return .token(claims.tokenID, channel: channel, user: claims.userID, expiresAt: claims.expiresAt, at: now, reason: reason)
            default:
                throw AdminError(.badRequest, "send either tokenID (from the token's issue answer) or token (the token itself)")
            }
        }
    }

    /// A channel as the API shows it: `ChannelRecord`'s fields, with `image` always present (null when
    /// there is none).
    struct ChannelView: Encodable {
        var channel: ChannelRecord
        init(_ channel: ChannelRecord) { self.channel = channel }

        enum CodingKeys: String, CodingKey { case id, name, image, mode, maxBurstSeconds, createdAt, updatedAt }

        func encode(to encoder: any Encoder) throws {
            var container = encoder.container(keyedBy: CodingKeys.self)
            try container.encode(channel.id, forKey: .id)
            try container.encode(channel.name, forKey: .name)
            try container.encode(channel.image, forKey: .image)
            try container.encode(channel.mode, forKey: .mode)
            try container.encode(channel.maxBurstSeconds, forKey: .maxBurstSeconds)
            try container.encode(channel.createdAt, forKey: .createdAt)
            try container.encode(channel.updatedAt, forKey: .updatedAt)
        }
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
        let text = context.parameters.get("id") ?? ""
        guard let id = UUID(uuidString: text) else {
            throw AdminError(.badRequest, "'\(text)' is not a channel id (a UUID); GET /v1/channels lists them")
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
        case .unavailable: self.init(.serviceUnavailable, error.description + "; the request is safe to repeat: try again shortly")
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
            case .database, .unavailable: context.logger.error("admin API: \(error)")
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
    func handle(_ request: Request, context: Context,
                next: (Request, Context) async throws -> Response) async throws -> Response {
        do { return try await next(request, context) } catch let error as HTTPError where error.status == .notFound {
            if let methods = AdminAPI.methods(ofPath: request.uri.path), !methods.contains(request.method) {
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
        let parts = header.split(separator: " ", maxSplits: 1, omittingEmptySubsequences: true)
        guard parts.count == 2, parts[0].lowercased() == "bearer" else {
            throw AdminError(.unauthorized, "the Authorization header must be 'Bearer <admin key>'", headers: challenge)
        }
        guard Self.constantTimeEqual(Array(parts[1].trimmingCharacters(in: .whitespaces).utf8), key) else {
            throw AdminError(.unauthorized, "wrong admin key; this server's key is \(source)", headers: challenge)
        }
        return try await next(request, context)
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
