import ChannelProtocol
@testable import ChannelStore
import Foundation
import Testing

extension StoreContractTests {
    /// squelchd's token ids are upper-case UUIDs; typed in lower case, or pasted with spaces, the id
    /// still names the token. (It used to be stored as given, reported as revoked, and match nothing.)
    @Test(arguments: StoreBackend.allCases) func aTokenIDInLowerCaseOrWithSpacesNamesTheSameToken(_ backend: StoreBackend) async throws {
        let fixture = try await StoreFixture(backend)
        let store = try await fixture.open()
        let channel = makeChannel()
        try await store.createChannel(channel)
        let now = ms()
        let id = UUID().uuidString
        let revocation = RevocationRecord.token(" \(id.lowercased())\n", channel: channel.id, user: nil, expiresAt: nil, at: now, reason: "lost")
        #expect(revocation.tokenID == id)
        #expect(revocation.voids(channel: channel.id, user: "ann", tokenID: id, issuedAt: now))
        _ = try await store.revoke(revocation)
        #expect(try await store.revocation(channel: channel.id, user: "ann", tokenID: id, issuedAt: now) != nil)
        #expect(try await store.revocation(channel: channel.id, user: "ann", tokenID: id.lowercased(), issuedAt: now) != nil,
                "a token whose own id is in lower case")
        #expect(try await store.revocation(channel: channel.id, user: "ann", tokenID: UUID().uuidString, issuedAt: now) == nil)
        // An id that is no UUID is kept as it is, trimmed.
        #expect(RevocationRecord.token(" jti-7 ", channel: channel.id, user: nil, expiresAt: nil, at: now, reason: "x").tokenID == "jti-7")
        try await store.close()
    }

    @Test(arguments: StoreBackend.allCases) func aRevokedTokenIsVoidAndOthersAreNot(_ backend: StoreBackend) async throws {
        let fixture = try await StoreFixture(backend)
        let store = try await fixture.open()
        let channel = makeChannel()
        try await store.createChannel(channel)
        let now = ms()
        let stored = try await store.revoke(.token("jti-1", channel: channel.id, user: "ann", expiresAt: now.addingTimeInterval(3600),
                                                   at: now, reason: "phone lost"))
        #expect(stored.sequence > 0 && stored.tokenID == "jti-1" && stored.reason == "phone lost")
        let hit = try await store.revocation(channel: channel.id, user: "ann", tokenID: "jti-1", issuedAt: now.addingTimeInterval(-60))
        #expect(hit == stored)
        // Another token of the same user, the same id on another channel: both good.
        #expect(try await store.revocation(channel: channel.id, user: "ann", tokenID: "jti-2", issuedAt: now.addingTimeInterval(-60)) == nil)
        #expect(try await store.revocation(channel: UUID(), user: "ann", tokenID: "jti-1", issuedAt: now) == nil)
        // Listing by channel leaves out the other channel's.
        let other = makeChannel("Other")
        try await store.createChannel(other)
        let elsewhere = try await store.revoke(.member(channel: other.id, user: "bob", at: now, reason: "removed"))
        #expect(try await store.revocations(after: 0, channel: channel.id) == [stored])
        #expect(try await store.revocations(after: 0, channel: nil) == [stored, elsewhere])
        // Revoked again: the first revocation stands, with no second row.
        let again = try await store.revoke(.token("jti-1", channel: channel.id, user: "ann", expiresAt: now.addingTimeInterval(3600),
                                                  at: now.addingTimeInterval(5), reason: "retry"))
        #expect(again == stored)
        #expect(try await store.revocations(after: 0, channel: channel.id) == [stored])
        // One made by id alone learns the token's expiry and user when the whole token is revoked.
        let byID = try await store.revoke(.token("jti-3", channel: channel.id, user: nil, expiresAt: nil, at: now, reason: "by id"))
        // The revoked member's terminal shows the reason: no escape sequences, and an id is not blank.
        for (bad, expected) in [(RevocationRecord.token("jti-4", channel: channel.id, user: nil, expiresAt: nil, at: now, reason: "\u{1B}[2Jfake"),
                                 "control characters"),
                                (.token("   ", channel: channel.id, user: nil, expiresAt: nil, at: now, reason: "x"), "token id")] {
            let error = await storeError { _ = try await store.revoke(bad) }
            #expect(message(error).contains(expected), "\(String(describing: error))")
        }
        let whole = try await store.revoke(.token("jti-3", channel: channel.id, user: "cy", expiresAt: now.addingTimeInterval(60),
                                                  at: now, reason: "whole"))
        #expect(whole.sequence == byID.sequence && whole.reason == "by id" && whole.userID == "cy" && whole.expiresAt == now.addingTimeInterval(60))
        #expect(try await store.revocations(after: 0, channel: channel.id).count == 2)
    }

    @Test(arguments: StoreBackend.allCases) func removingAMemberVoidsItsEarlierTokensOnly(_ backend: StoreBackend) async throws {
        let fixture = try await StoreFixture(backend)
        let store = try await fixture.open()
        let channel = makeChannel()
        try await store.createChannel(channel)
        let removal = ms()
        let first = try await store.revoke(.member(channel: channel.id, user: "bob", at: removal, reason: "removed"))
        #expect(first.userID == "bob" && first.tokenID == nil && first.expiresAt == nil)
        let before = try await store.revocation(channel: channel.id, user: "bob", tokenID: "old", issuedAt: removal.addingTimeInterval(-1))
        #expect(before?.sequence == first.sequence)
        #expect(try await store.revocation(channel: channel.id, user: "bob", tokenID: "new", issuedAt: removal.addingTimeInterval(1)) == nil)
        #expect(try await store.revocation(channel: channel.id, user: "carol", tokenID: "old", issuedAt: removal.addingTimeInterval(-1)) == nil)
        // Within the removal's millisecond it can't be told which came first: refused, in the store
        // and in the record's own check (which the hub applies to live members).
        for offset in [-0.0004, 0, 0.0004] {
            let issued = removal.addingTimeInterval(offset)
            #expect(try await store.revocation(channel: channel.id, user: "bob", tokenID: "same-ms", issuedAt: issued)?.sequence == first.sequence,
                    "issued \(offset) s from the removal")
            #expect(first.voids(channel: channel.id, user: "bob", tokenID: "same-ms", issuedAt: issued))
        }
        #expect(try await store.revocation(channel: channel.id, user: "bob", tokenID: "next-ms", issuedAt: removal.addingTimeInterval(0.001)) == nil)
        #expect(!first.voids(channel: channel.id, user: "bob", tokenID: "next-ms", issuedAt: removal.addingTimeInterval(0.001)))

        // A second removal moves the cut-off; the first record goes, and the list shows the order.
        let later = removal.addingTimeInterval(10)
        let second = try await store.revoke(.member(channel: channel.id, user: "bob", at: later, reason: "removed again"))
        #expect(try await store.revocation(channel: channel.id, user: "bob", tokenID: "new", issuedAt: removal.addingTimeInterval(1))?.sequence
                == second.sequence)
        let all = try await store.revocations(after: 0, channel: nil)
        #expect(all.map(\.sequence) == [second.sequence], "\(all)")
        #expect(try await store.revocations(after: second.sequence, channel: nil).isEmpty)
    }

    @Test(arguments: StoreBackend.allCases) func expiredTokenRevocationsArePrunedAndBadOnesRefused(_ backend: StoreBackend) async throws {
        let fixture = try await StoreFixture(backend)
        let store = try await fixture.open()
        let channel = makeChannel()
        try await store.createChannel(channel)
        let now = ms()
        let expired = try await store.revoke(.token("gone", channel: channel.id, user: nil, expiresAt: now.addingTimeInterval(-5), at: now,
                                                    reason: "r"))
        let kept = try await store.revoke(.token("kept", channel: channel.id, user: nil, expiresAt: nil, at: now, reason: "r"))
        #expect(try await store.revocations(after: 0, channel: nil).map(\.sequence) == [kept.sequence], "the next revocation prunes \(expired.sequence)")

        #expect(await storeError { _ = try await store.revoke(.token("x", channel: UUID(), user: nil, expiresAt: nil, at: now, reason: "r")) }
                .map { if case .channelNotFound = $0 { true } else { false } } == true)
        let nobody = RevocationRecord(sequence: 0, channelID: channel.id, userID: nil, tokenID: nil, revokedAt: now, expiresAt: nil, reason: "r")
        #expect(message(await storeError { _ = try await store.revoke(nobody) }).contains("token id, a user"))
        #expect(message(await storeError {
            _ = try await store.revoke(.token(String(repeating: "j", count: 129), channel: channel.id, user: nil, expiresAt: nil, at: now, reason: "r"))
        }).contains("1-128"))
    }

    /// Two administrators (or a retry racing the first try) revoking the same token at once: one is
    /// told it revoked the token, the others that it was already revoked, with the one record.
    @Test(arguments: StoreBackend.allCases) func ofIdenticalRevocationsAtOnceExactlyOneIsNew(_ backend: StoreBackend) async throws {
        let fixture = try await StoreFixture(backend)
        let store = try await fixture.open()
        let channel = makeChannel()
        try await store.createChannel(channel)
        for round in 0 ..< 5 {
            let token = UUID().uuidString
            let outcomes = try await withThrowingTaskGroup(of: TokenRevocation.self) { group in
                for attempt in 0 ..< 8 {
                    group.addTask {
                        try await store.revokeToken(.token(token, channel: channel.id, user: nil, expiresAt: nil, at: ms(),
                                                           reason: "attempt \(attempt)"), byIDAlone: true)
                    }
                }
                return try await group.reduce(into: [TokenRevocation]()) { $0.append($1) }
            }
            let records = outcomes.compactMap { if case .revoked(let record, let isNew, _) = $0 { (record, isNew) } else { nil } }
            #expect(records.count == 8 && records.filter(\.1).count == 1, "round \(round): \(records.map(\.1))")
            #expect(Set(records.map(\.0.sequence)).count == 1, "one stored revocation, returned to all")
            // Each attempt gave its own reason: the repeats are answered with the stored one's, not theirs.
            #expect(Set(records.map(\.0.reason)).count == 1, "round \(round): \(records.map(\.0.reason))")
        }
        // Revoked again later: not new either; an expired revocation pruned and made again is.
        let token = UUID().uuidString
        guard case .revoked(_, true, _) = try await store.revokeToken(.token(token, channel: channel.id, user: nil, expiresAt: nil, at: ms(), reason: "r"),
                                                                      byIDAlone: true) else { Issue.record("first revocation not new"); return }
        guard case .revoked(_, false, _) = try await store.revokeToken(.token(token, channel: channel.id, user: nil, expiresAt: nil, at: ms(), reason: "r"),
                                                                       byIDAlone: true) else { Issue.record("repeat told new"); return }
        let lapsed = UUID().uuidString
        _ = try await store.revoke(.token(lapsed, channel: channel.id, user: nil, expiresAt: ms().addingTimeInterval(-5), at: ms(), reason: "r"))
        guard case .revoked(_, true, _) = try await store.revokeToken(.token(lapsed, channel: channel.id, user: nil, expiresAt: nil, at: ms(), reason: "r"),
                                                                      byIDAlone: true) else { Issue.record("a pruned revocation made again is new"); return }
    }

    @Test(arguments: StoreBackend.allCases) func revocationsMadeByAnotherConnectionMoveTheRevision(_ backend: StoreBackend) async throws {
        let fixture = try await StoreFixture(backend)
        let store = try await fixture.open()
        let channel = makeChannel()
        try await store.createChannel(channel)
        let before = try await store.revision()
        let other = try await fixture.open()
        _ = try await other.revoke(.member(channel: channel.id, user: "ann", at: ms(), reason: "removed"))
        try await other.close()
        #expect(try await store.revision() > before)
        #expect(try await store.revocations(after: 0, channel: nil).count == 1)
    }

}
