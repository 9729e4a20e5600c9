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
