import ChannelStore
import ChannelStoreSQLite
import Foundation
import Logging
import ParticipantTokens
@testable import PTTServer
import Synchronization
import Testing

/// The hub learns of channel changes twice: from the admin API's hooks at once, and from the
/// revision poll a second later, which reads every channel and then applies what it read. These
/// tests land an admin change in the poll's gap between its read and its apply (the poll's
/// `afterRead` seam), on the real voice service, store and SQLite file; the change must survive.
@Suite(.serialized, .timeLimit(.minutes(1))) struct ChannelSyncTests {
    let quiet = Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() })

    /// Runs `body` with a started voice service on the fixture's data directory (channel "Ops").
    func withVoiceService(_ body: (ServerFixture, SQLiteChannelStore, VoiceService) async throws -> Void) async throws {
        let fixture = try await ServerFixture()
        let store = try SQLiteChannelStore(directory: fixture.dataDirectory)
        var configuration = ServerConfiguration()
        configuration.dataDirectory = fixture.dataDirectory
        configuration.port = 0
        let metrics = ServerMetrics()
        let writer = StoreWriter(store: store, metrics: metrics, logger: quiet)
        let (listening, continuation) = AsyncStream.makeStream(of: Void.self)
        let voice = VoiceService(configuration: configuration, identity: fixture.identity, store: store,
                                 tokens: try await TokenAuthority.loadOrCreate(in: fixture.dataDirectory),
                                 writer: writer, metrics: metrics, logger: quiet,
                                 onListening: { _ in continuation.yield() })
        let writing = Task { await writer.run() }
        let serving = Task { try await voice.run() }
        var iterator = listening.makeAsyncIterator()
        _ = await iterator.next()
        // Stopped whatever the body does, so that a failure leaves nothing running into the next test.
        let outcome: Result<Void, any Error>
        do { outcome = .success(try await body(fixture, store, voice)) } catch { outcome = .failure(error) }
        serving.cancel()
        try? await serving.value
        await writing.value
        try await store.close()
        try outcome.get()
    }

    /// Reloads with `change` made in the gap: `change` writes the store and returns the admin hook's
    /// call, which is given time to finish before the reload applies what it read, as it would
    /// without the queue.
    func reload(_ voice: VoiceService, change: @escaping @Sendable () async -> Task<Void, Never>) async throws {
        let hook = Mutex<Task<Void, Never>?>(nil)
        try await voice.reloadChannels(afterRead: {
            let task = await change()
            hook.withLock { $0 = task }
            try? await Task.sleep(for: .milliseconds(300))
        })
        await hook.withLock { $0 }?.value
    }

    /// The hourly chore deletes audit records older than `auditDays` and bursts older than
    /// `transmissionLogDays` (365 days each by default), and only those.
    @Test func theHourlyChorePrunesTheAuditTrailAndTheTransmissionLogByAge() async throws {
        try await withVoiceService { fixture, store, voice in
            let now = Date()
            for days in [400.0, 300] {
                try await store.logTransmission(TransmissionRecord(channelID: fixture.channel.id, userID: "u\(Int(days))",
                                                                   startedAt: now.addingTimeInterval(-days * 86_400),
                                                                   durationMilliseconds: 1_000, endReason: "released"))
            }
            #expect(await voice.pruneTransmissionLog(now: now) <= 1)
            #expect(try await store.transmissions(of: fixture.channel.id, limit: 10).map(\.userID) == ["u300"])
            try await store.recordAudit(AuditRecord(at: now.addingTimeInterval(-400 * 86_400), source: AuditRecord.Source.api,
                                                    action: "channel updated", channelID: fixture.channel.id))
            try await store.recordAudit(AuditRecord(at: now.addingTimeInterval(-300 * 86_400), source: AuditRecord.Source.cli,
                                                    action: "token issued", channelID: fixture.channel.id))
            // The chore's first run, at start, may come after these records and take the old one first.
            #expect(await voice.pruneAuditTrail(now: now) <= 1)
            #expect(try await store.auditRecords(channel: nil, limit: 10).map(\.action) == ["token issued"])
            #expect(await voice.pruneAuditTrail(now: now) == 0)
        }
    }

    @Test func aRenameDuringAReloadIsNotUndone() async throws {
        try await withVoiceService { fixture, store, voice in
            var record = fixture.channel
            record.name = "Ops North"
            let renamed = record
            try await reload(voice) {
                _ = try? await store.updateChannel(renamed)
                return Task { await voice.channelChanged(renamed.id) }
            }
            #expect(await voice.onLoop { $0.hub.channel(fixture.channel.id)?.name } == "Ops North")
        }
    }

    @Test func aDeleteDuringAReloadIsNotUndone() async throws {
        try await withVoiceService { fixture, store, voice in
            try await reload(voice) {
                try? await store.deleteChannel(fixture.channel.id)
                return Task { await voice.channelDeleted(fixture.channel.id) }
            }
            #expect(await voice.onLoop { $0.hub.channel(fixture.channel.id) == nil } == true)
        }
    }

    /// A channel made by the CLI after the reload's read, and loaded by a join's token check (on the
    /// event loop, not through the admin hooks) before the reload applies: the stale read must not
    /// delete it from the hub, which refused its new member as 'channel deleted'.
    @Test func aChannelLoadedByAJoinDuringAReloadStays() async throws {
        try await withVoiceService { _, store, voice in
            let created = ChannelRecord(name: "Gate 5", maxBurstSeconds: 60)
            try await voice.reloadChannels(afterRead: {
                try? await store.createChannel(created)
                _ = await voice.onLoop { $0.hub.channelSeenByCheck(created, at: HubDriver.now()) }
            })
            #expect(await voice.onLoop { $0.hub.channel(created.id)?.name } == "Gate 5")
        }
    }

    @Test func aChannelCreatedDuringAReloadStays() async throws {
        try await withVoiceService { _, store, voice in
            let created = ChannelRecord(name: "Gate 4", maxBurstSeconds: 60)
            try await reload(voice) {
                try? await store.createChannel(created)
                return Task { await voice.channelChanged(created.id) }
            }
            #expect(await voice.onLoop { $0.hub.channel(created.id)?.name } == "Gate 4")
        }
    }
}
