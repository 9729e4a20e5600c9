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

extension AdminAPITests {
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
        let participant = RosterMember(slot: 7, userID: "alice", name: "Alice", role: "dispatcher", priority: 9, talking: true)
        let offline = RosterMember(slot: 8, userID: "bob", name: "Bob", connection: .offline)
        let entries = [LiveMember(participant: participant, receptionLoss: 12), LiveMember(participant: offline)]
        let fixture = try await AdminFixture(hub: RecordingHub(roster: entries))
        defer { Task { await fixture.cleanUp() } }
        let channel = ChannelRecord(name: "Ops")
        try await fixture.store.createChannel(channel)
        try await fixture.application.test(.router) { client in
            let roster = try await client.send(.get, "/v1/channels/\(channel.id)/roster")
            #expect(roster.status == .ok)
            // The roster entry's own fields, as members see them, with the server's figure beside them.
            #expect(try roster.decode([RosterMember].self) == [participant, offline])
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
