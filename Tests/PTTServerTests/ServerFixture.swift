import APNsSimulatorEmbedding
import ChannelProtocol
import ChannelStore
import ChannelStoreSQLite
import Crypto
import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import GRDB
import ParticipantClaims
import ParticipantTokens
import PTTServer
import SeededRandom
import ServerTesting
import SquelchTesting
import Testing
import Wire
import WireTesting

/// squelchd end to end in this process: the real server (UDP transport on 127.0.0.1, SQLite in a
/// temporary data directory, the admin API) and real clients on their own UDP sockets.
final class ServerFixture: Sendable {
    let pki: TestPKI
    let identity: ServerIdentity
    let dataDirectory: String
    let channel: ChannelRecord

    init(mode: TransmissionMode = .halfDuplex) async throws {
        pki = try TestPKI()
        identity = try pki.identity()
        dataDirectory = FileManager.default.temporaryDirectory.appendingPathComponent("squelchd-test-\(UUID())").path
        try FileManager.default.createDirectory(atPath: dataDirectory, withIntermediateDirectories: true)
        channel = ChannelRecord(name: "Ops", mode: mode, maxBurstSeconds: 60)
        let store = try SQLiteChannelStore(directory: dataDirectory)
        try await store.createChannel(channel)
        try await store.close()
    }

    deinit { try? FileManager.default.removeItem(atPath: dataDirectory) }

    /// Starts squelchd on free ports; returns once both listeners are up.
    /// With `pushCertificates` (a directory made by certs/make-dev-certs.sh), pushes go to the embedded
    /// APNs simulator on free ports; without, pushes are off.
    func start(pushCertificates: String? = nil, wakeSilence: Double? = nil,
               transmissionLogDays: Int? = nil, memberRetentionDays: Int? = nil,
               shutdownLimit: Duration? = nil, floorGrantsPerMinute: Int? = nil) async throws -> (task: Task<Void, any Error>, listening: SquelchServer.Listening) {
        var configuration = TestServer.configuration(dataDirectory: dataDirectory, pushCertificates: pushCertificates)
        if let wakeSilence { configuration.pushWakeSilenceSeconds = wakeSilence }
        if let transmissionLogDays { configuration.transmissionLogDays = transmissionLogDays }
        if let memberRetentionDays { configuration.memberRetentionDays = memberRetentionDays }
        if let floorGrantsPerMinute { configuration.floorGrantsPerMinute = floorGrantsPerMinute }
        return try await TestServer.start(configuration, identity: identity, shutdownLimit: shutdownLimit)
    }

    func token(_ user: String, capabilities: Set<Capability> = [.talk, .listen], priority: UInt8 = 0,
               channel: UUID? = nil, ttl: TimeInterval = 3600) async throws -> String {
        let authority = try await TokenAuthority.loadOrCreate(in: dataDirectory)
        return try await authority.issue(ParticipantClaims(
            userID: user, name: user.capitalized, channel: channel ?? self.channel.id, capabilities: capabilities,
            priority: priority, expiresAt: Date().addingTimeInterval(ttl)))
    }

    /// A connected member that has joined; fails the test if the join is refused.
    func member(_ user: String, port: Int, capabilities: Set<Capability> = [.talk, .listen], priority: UInt8 = 0) async throws -> TestMember {
        let member = try TestMember(port: port, configuration: pki.client())
        try await member.connect()
        let answer = try await member.join(token: try await token(user, capabilities: capabilities, priority: priority), channel: channel.id)
        guard case .joined? = answer else { throw FixtureError.notJoined(user, answer) }
        return member
    }

    enum FixtureError: Error { case notJoined(String, ServerMessage?) }

    /// The data directory's store for `body`, as another process would open it; closed after.
    func withStore<T>(_ body: (SQLiteChannelStore) async throws -> T) async throws -> T {
        let store = try SQLiteChannelStore(directory: dataDirectory)
        do {
            let result = try await body(store)
            try await store.close()
            return result
        } catch {
            try? await store.close()
            throw error
        }
    }

    /// An admin API call on this fixture's channel (`path` after `/v1/channels/<id>`).
    func admin(_ listening: SquelchServer.Listening, _ method: String, _ path: String, json: String? = nil) async throws -> (status: Int, body: String) {
        var request = URLRequest(url: try #require(URL(string: "http://127.0.0.1:\(listening.adminPort)/v1/channels/\(channel.id)\(path)")))
        request.httpMethod = method
        request.setValue("Bearer \(TestServer.adminKey)", forHTTPHeaderField: "Authorization")
        if let json {
            request.setValue("application/json", forHTTPHeaderField: "Content-Type")
            request.httpBody = Data(json.utf8)
        }
        let (body, response) = try await URLSession.shared.data(for: request)
        return ((response as? HTTPURLResponse)?.statusCode ?? 0, String(decoding: body, as: UTF8.self))
    }

    /// What `/healthz` says now, with its HTTP status: to the admin key, or (`anonymous`) to anyone.
    func health(_ listening: SquelchServer.Listening, anonymous: Bool = false) async throws -> (status: Int, health: AdminAPI.Health) {
        let url = try #require(URL(string: "http://127.0.0.1:\(listening.adminPort)/healthz"))
        var request = URLRequest(url: url)
        if !anonymous { request.setValue("Bearer \(TestServer.adminKey)", forHTTPHeaderField: "Authorization") }
        let (body, response) = try await URLSession.shared.data(for: request)
        let decoder = JSONDecoder()
        decoder.dateDecodingStrategy = .iso8601
        return ((response as? HTTPURLResponse)?.statusCode ?? 0, try decoder.decode(AdminAPI.Health.self, from: body))
    }

    /// What `/metrics` shows once it contains `needle` (they are published once a second), or after
    /// `seconds` without it.
    func metrics(_ listening: SquelchServer.Listening, containing needle: String, seconds: Double = 3) async throws -> String {
        var text = ""
        let deadline = ContinuousClock.now + .seconds(seconds)
        while !text.contains(needle), ContinuousClock.now < deadline {
            text = try await metrics(listening)
            try await Task.sleep(for: .milliseconds(100))
        }
        return text
    }

    /// What `/metrics` shows now.
    func metrics(_ listening: SquelchServer.Listening) async throws -> String {
        let url = try #require(URL(string: "http://127.0.0.1:\(listening.adminPort)/metrics"))
        return String(decoding: try await URLSession.shared.data(from: url).0, as: UTF8.self)
    }
}

/// The roster as a client holds it: every message applied in order, entries replaced by slot.
func rosterEntries(_ messages: [ServerMessage]) -> [UInt16: RosterMember] {
    var entries: [UInt16: RosterMember] = [:]
    for message in messages {
        switch message {
        case .joined(_, _, let chunk, _, _), .roster(let chunk): for entry in chunk { entries[entry.slot] = entry }
        case .participant(let entry): entries[entry.slot] = entry
        case .participantLeft(let slot, _): entries[slot] = nil
        default: break
        }
    }
    return entries
}

func slot(of member: TestMember) -> UInt16? {
    for message in member.messages { if case .joined(_, let you, _, _, _) = message { return you } }
    return nil
}
