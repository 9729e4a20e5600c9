import ChannelProtocol
@testable import ChannelStore
import Foundation
import Testing

extension StoreContractTests {
    @Test(arguments: StoreBackend.allCases) func membersUpsertKeepPushTokensAndRemove(_ backend: StoreBackend) async throws {
        let fixture = try await StoreFixture(backend)
        let store = try await fixture.open()
        let channel = makeChannel()
        try await store.createChannel(channel)
        let joined = ms()
        let ann = MemberRecord(channelID: channel.id, userID: "u1", displayName: "Ann", joinedAt: joined, lastSeen: joined,
                               pushToken: "abcd", pushEnvironment: .sandbox, pushRegisteredAt: joined)
        try await store.upsertMember(ann)
        #expect(try await store.member(channel: channel.id, user: "u1") == ann)

        // A rejoin without a token renames but keeps the token.
        var renamed = MemberRecord(channelID: channel.id, userID: "u1", displayName: "Ann B", joinedAt: joined, lastSeen: ms())
        try await store.upsertMember(renamed)
        renamed.pushToken = "abcd"
        renamed.pushEnvironment = .sandbox
        renamed.pushRegisteredAt = joined
        #expect(try await store.member(channel: channel.id, user: "u1") == renamed)

        // A new token replaces the old one.
        var retokened = renamed
        retokened.pushToken = "ef01"
        retokened.pushEnvironment = .production
        try await store.upsertMember(retokened)
        #expect(try await store.member(channel: channel.id, user: "u1") == retokened)

        let bob = MemberRecord(channelID: channel.id, userID: "u2", displayName: "Bob", joinedAt: ms().addingTimeInterval(1))
        try await store.upsertMember(bob)
        #expect(try await store.members(of: channel.id).map(\.userID) == ["u1", "u2"])

        try await store.removeMember(channel: channel.id, user: "u1")
        #expect(try await store.member(channel: channel.id, user: "u1") == nil)
        #expect(try await store.members(of: channel.id).map(\.userID) == ["u2"])
        #expect(await storeError { try await store.removeMember(channel: channel.id, user: "u1") }
                == .memberNotFound(channel: channel.id, user: "u1"))

        let stranger = MemberRecord(channelID: UUID(), userID: "u3", displayName: "Cy")
        #expect(await storeError { try await store.upsertMember(stranger) } == .channelNotFound(stranger.channelID))
    }

    @Test(arguments: StoreBackend.allCases) func aMembersGrantIsStoredAndKeptByAWriteWithoutOne(_ backend: StoreBackend) async throws {
        let fixture = try await StoreFixture(backend)
        let store = try await fixture.open()
        let channel = makeChannel()
        try await store.createChannel(channel)
        let joined = ms()
        let grant = MemberGrant(canTalk: false, canListen: true, role: "dispatcher", priority: 200, tokenID: "jti-1",
                                tokenIssuedAt: joined, tokenExpiresAt: joined.addingTimeInterval(3600))
        var ann = MemberRecord(channelID: channel.id, userID: "u1", displayName: "Ann", joinedAt: joined, lastSeen: joined, grant: grant)
        try await store.upsertMember(ann)
        #expect(try await store.member(channel: channel.id, user: "u1")?.grant == grant)
        // A write that doesn't know the grant (or the push token) keeps what is stored.
        try await store.upsertMember(MemberRecord(channelID: channel.id, userID: "u1", displayName: "Ann", joinedAt: joined, lastSeen: joined))
        #expect(try await store.member(channel: channel.id, user: "u1")?.grant == grant)
        // A new token's grant replaces it.
        ann.grant = MemberGrant(canTalk: true, canListen: false, role: nil, priority: 0, tokenID: "jti-2",
                                tokenIssuedAt: joined, tokenExpiresAt: joined.addingTimeInterval(60))
        try await store.upsertMember(ann)
        #expect(try await store.member(channel: channel.id, user: "u1") == ann)
        // A row edited by hand into an impossible priority reads as having no grant, not as an error.
        try await fixture.execute("UPDATE member SET priority = 999")
        #expect(try await store.member(channel: channel.id, user: "u1")?.grant == nil)
    }

    @Test(arguments: StoreBackend.allCases) func aMembersSubscriptionsAreStoredAndADamagedListReadsAsNone(_ backend: StoreBackend) async throws {
        let fixture = try await StoreFixture(backend)
        let store = try await fixture.open()
        let channel = makeChannel()
        try await store.createChannel(channel)
        let joined = ms()
        try await store.upsertMember(MemberRecord(channelID: channel.id, userID: "u1", displayName: "Ann", joinedAt: joined, lastSeen: joined))
        #expect(try await store.member(channel: channel.id, user: "u1")?.unheard == [])
        try await store.setSubscriptions(channel: channel.id, user: "u1", unheard: ["u3", "u2"])
        #expect(try await store.member(channel: channel.id, user: "u1")?.unheard == ["u2", "u3"])
        // A member record carries the whole list, as the hub keeps it.
        try await store.upsertMember(MemberRecord(channelID: channel.id, userID: "u1", displayName: "Ann", joinedAt: joined,
                                                  lastSeen: joined, unheard: ["u4"]))
        #expect(try await store.member(channel: channel.id, user: "u1")?.unheard == ["u4"])
        try await store.setSubscriptions(channel: channel.id, user: "u1", unheard: [])
        #expect(try await store.member(channel: channel.id, user: "u1")?.unheard == [])
        #expect(await storeError { try await store.setSubscriptions(channel: channel.id, user: "nobody", unheard: ["u1"]) }
                == .memberNotFound(channel: channel.id, user: "nobody"))
        // A value edited by hand into something else loses the list, not the member or its channel.
        // (PostgreSQL's column is a typed array: it cannot hold anything but a list.)
        if backend == .sqlite {
            try await fixture.execute("UPDATE member SET unheard = '{not a list'")
            let members = try await store.members(of: channel.id)
            #expect(members.map(\.userID) == ["u1"] && members[0].unheard == [])
        }
    }

    @Test(arguments: StoreBackend.allCases) func deletingAChannelDeletesItsMembers(_ backend: StoreBackend) async throws {
        let fixture = try await StoreFixture(backend)
        let store = try await fixture.open()
        let channel = makeChannel(), other = makeChannel("Other")
        try await store.createChannel(channel)
        try await store.createChannel(other)
        try await store.upsertMember(MemberRecord(channelID: channel.id, userID: "u1", displayName: "Ann", pushToken: "aa", pushEnvironment: .sandbox))
        try await store.upsertMember(MemberRecord(channelID: other.id, userID: "u1", displayName: "Ann"))
        try await store.deleteChannel(channel.id)
        #expect(try await store.members(of: channel.id).isEmpty)
        #expect(try await store.members(of: other.id).count == 1)
        #expect(try await fixture.count("SELECT count(*) FROM member") == 1, "no rows left behind the deleted channel")
    }

    @Test(arguments: StoreBackend.allCases) func pushTokensAndLastSeen(_ backend: StoreBackend) async throws {
        let fixture = try await StoreFixture(backend)
        let store = try await fixture.open()
        let channel = makeChannel()
        try await store.createChannel(channel)
        try await store.upsertMember(MemberRecord(channelID: channel.id, userID: "u1", displayName: "Ann"))

        let registered = ms()
        try await store.setPushToken(channel: channel.id, user: "u1", token: "00ff", environment: .production, registeredAt: registered)
        var member = try #require(try await store.member(channel: channel.id, user: "u1"))
        #expect(member.pushToken == "00ff" && member.pushEnvironment == .production && member.pushRegisteredAt == registered)

        let seen = ms().addingTimeInterval(60)
        try await store.touchMember(channel: channel.id, user: "u1", lastSeen: seen)
        member = try #require(try await store.member(channel: channel.id, user: "u1"))
        #expect(member.lastSeen == seen && member.pushToken == "00ff")

        try await store.clearPushToken(channel: channel.id, user: "u1")
        member = try #require(try await store.member(channel: channel.id, user: "u1"))
        #expect(member.pushToken == nil && member.pushEnvironment == nil && member.pushRegisteredAt == nil)

        let missing = StoreError.memberNotFound(channel: channel.id, user: "nobody")
        #expect(await storeError { try await store.setPushToken(channel: channel.id, user: "nobody", token: "aa", environment: .sandbox, registeredAt: Date()) } == missing)
        #expect(await storeError { try await store.clearPushToken(channel: channel.id, user: "nobody") } == missing)
        #expect(await storeError { try await store.touchMember(channel: channel.id, user: "nobody", lastSeen: Date()) } == missing)
    }
}
