import ChannelProtocol
@testable import ChannelStore
import Foundation
import ChannelStoreSQLite
import Testing

extension StoreContractTests {
    @Test(arguments: StoreBackend.allCases) func revisionSeesEditsFromAnotherConnection(_ backend: StoreBackend) async throws {
        let fixture = try await StoreFixture(backend)
        let server = try await fixture.open(), cli = try await fixture.open()
        var seen = try await server.revision()

        func expectBumped(_ what: Comment) async throws {
            let now = try await server.revision()
            #expect(now > seen, what)
            seen = now
        }
        let channel = makeChannel()
        try await cli.createChannel(channel)
        try await expectBumped("create")
        var edited = channel
        edited.name = "Renamed"
        _ = try await cli.updateChannel(edited)
        try await expectBumped("update")
        try await cli.upsertMember(MemberRecord(channelID: channel.id, userID: "u1", displayName: "Ann"))
        try await cli.touchMember(channel: channel.id, user: "u1", lastSeen: Date())
        #expect(try await server.revision() == seen, "joins and presence must not make the server reload channels")
        try await cli.removeMember(channel: channel.id, user: "u1")
        try await expectBumped("remove member")
        try await cli.deleteChannel(channel.id)
        try await expectBumped("delete")
        #expect(try await server.channel(channel.id) == nil)
    }

    @Test(arguments: StoreBackend.allCases) func dataIsBackAfterCloseAndReopen(_ backend: StoreBackend) async throws {
        let fixture = try await StoreFixture(backend)
        let channel = makeChannel()
        let member = MemberRecord(channelID: channel.id, userID: "u1", displayName: "Ann", joinedAt: ms(), lastSeen: ms(),
                                  pushToken: "beef", pushEnvironment: .sandbox, pushRegisteredAt: ms())
        do {
            let store = try await fixture.open()
            try await store.createChannel(channel)
            try await store.upsertMember(member)
            _ = try await store.storeServerKeyIfAbsent(named: "reset", value: [4, 2])
            try await store.close()
        }
        if case .sqlite(let directory) = fixture.database {
            // The TRUNCATE checkpoint leaves the main file complete on its own.
            let path = directory + "/" + SQLiteChannelStore.defaultFileName
            let wal = (try? FileManager.default.attributesOfItem(atPath: path + "-wal")[.size] as? Int) ?? 0
            #expect(wal == 0)
        }

        let reopened = try await fixture.open()
        #expect(try await reopened.channel(channel.id) == channel)
        #expect(try await reopened.member(channel: channel.id, user: "u1") == member)
        #expect(try await reopened.serverKey(named: "reset") == [4, 2])
    }

    @Test(arguments: StoreBackend.allCases) func aClosedStoreReportsADatabaseError(_ backend: StoreBackend) async throws {
        let fixture = try await StoreFixture(backend)
        let store = try await fixture.open()
        try await store.close()
        let error = await storeError { _ = try await store.channels() }
        guard case .database? = error else { Issue.record("expected a database error, got \(String(describing: error))"); return }
    }
}
