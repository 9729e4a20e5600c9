import ChannelProtocol
import ChannelStore
import Foundation
import ParticipantClaims
import Testing
import Wire
@testable import ChannelHub

/// Administration: channel edits and deletion, removals, revocations, stored members and forgetting them.
@Suite struct HubAdminTests {
    @Test func aChannelSeenByAJoinCheckIsLoadedUnlessDeletedOrKnown() {
        let h = Harness()
        let fresh = ChannelRecord(name: "New", mode: .fullDuplex, maxBurstSeconds: 20)
        h.hub.channelSeenByCheck(fresh, at: h.time)
        #expect(h.hub.channelIDs.contains(fresh.id))
        var stale = h.channel
        stale.name = "Old name"
        h.hub.channelSeenByCheck(stale, at: h.time)
        #expect(h.hub.channels[h.channel.id]?.record.name == h.channel.name)
        h.hub.deleteChannel(fresh.id, at: h.time)
        h.hub.channelSeenByCheck(fresh, at: h.time)
        #expect(!h.hub.channelIDs.contains(fresh.id))
    }

    /// A phone gone quiet in the background resumes its session (no new join): the bursts it was
    /// noted missing while silent are replayed from their first packet, as a join would get them,
    /// whether it comes back by the sweep or by a control message.
    @Test func descriptorUpdateReachesConnectedMembers() {
        let h = Harness()
        let ann = h.join("ann")
        var record = h.channel
        record.name = "Ops North"
        h.hub.upsertChannel(record, at: h.time)
        h.drain()
        #expect(h.lastMessage(to: ann.link) == .descriptor(ChannelInfo(id: record.id, name: "Ops North", image: nil,
                                                                       mode: .halfDuplex, maxBurstSeconds: 60)))
    }

    @Test func deletingTheChannelRemovesEveryoneWithAReason() {
        let h = Harness()
        let ann = h.join("ann")
        h.send(.registerPushToken(token: "ABCD", environment: .sandbox), from: ann.link)
        #expect(h.lastMessage(to: ann.link) == .pushTokenRegistered)
        h.hub.deleteChannel(h.channel.id, at: h.time)
        h.drain()
        #expect(h.lastMessage(to: ann.link) == .refused(code: .channelDeleted, reason: "the channel was deleted by an administrator"))
        #expect(h.closes.contains { $0.0 == ann.link && $0.1 == .removed })
        #expect(h.other.contains { if case .memberGone(_, let m) = $0 { return m.pushToken == "abcd" } else { return false } })
    }

    @Test func anAdministratorsRemovalEndsTheSessionAndQueuesTheRowsDeletionAfterItsWrite() {
        let h = Harness()
        let ann = h.join("ann"), bob = h.join("bob")
        #expect(h.hub.isMember(channel: h.channel.id, user: "bob"))
        #expect(!h.hub.isMember(channel: h.channel.id, user: "carol"))
        #expect(!h.hub.isMember(channel: UUID(), user: "bob"))
        h.hub.removeMember(channel: h.channel.id, user: "bob", at: h.time)
        h.drain()
        #expect(h.lastMessage(to: bob.link) == .refused(code: .removedByAdmin, reason: "an administrator removed you from the channel"))
        #expect(h.closes.contains { $0.0 == bob.link && $0.1 == .removed })
        #expect(h.messages(to: ann.link).last == .participantLeft(slot: bob.slot, userID: "bob"))
        #expect(!h.hub.isMember(channel: h.channel.id, user: "bob"))
        // The join's row and its deletion go to the store writer in that order, so a row written late
        // is deleted after it, not before.
        let joined = h.stored.lastIndex { if case .upsertMember(let m) = $0 { m.userID == "bob" } else { false } }
        let removed = h.stored.lastIndex(of: .removeMember(channel: h.channel.id, user: "bob"))
        #expect(joined != nil && removed != nil && joined! < removed!, "\(h.stored)")
    }

    /// A burst cut short by a removal or a revocation says so in the transmission log, not "left".
    @Test func aRemovedTalkersBurstIsLoggedWithTheReason() {
        let h = Harness()
        let ann = h.join("ann"), bob = h.join("bob")
        h.send(.floorRequest(), from: ann.link)
        h.hub.removeMember(channel: h.channel.id, user: "ann", at: h.time)
        h.send(.floorRequest(), from: bob.link)
        h.hub.removeMember(channel: h.channel.id, user: "bob", at: h.time, code: .tokenRevoked, reason: "lost phone")
        h.drain()
        let logged = h.stored.compactMap { if case .logTransmission(let t) = $0, t.endReason != TransmissionRecord.inProgress { return t } else { return nil } }
        #expect(logged.map(\.userID) == ["ann", "bob"])
        #expect(logged.map(\.endReason) == ["removedByAdmin", "tokenRevoked"])
    }

    @Test func leaveForgetsTheMemberAndItsToken() {
        let h = Harness()
        let ann = h.join("ann"), bob = h.join("bob")
        h.send(.registerPushToken(token: "beef", environment: .production), from: bob.link)
        h.send(.leave, from: bob.link)
        #expect(h.messages(to: ann.link).last == .participantLeft(slot: bob.slot, userID: "bob"))
        #expect(h.stored.last == .removeMember(channel: h.channel.id, user: "bob"))
        #expect(h.closes.contains { $0.0 == bob.link && $0.1 == .normal })
        #expect(!h.other.contains { if case .memberGone = $0 { return true } else { return false } },
                "a member who left by itself gets no leave push")
        h.send(.floorRequest(), from: ann.link)
        #expect(!h.other.contains { if case .burstStarted = $0 { return true } else { return false } }, "its token is gone")
    }

    @Test func registeringTheSameTokenAgainIsWrittenAtMostEveryTenMinutes() {
        let h = Harness()
        let bob = h.join("bob")
        func tokenWrites() -> [StoreOperation] { h.stored.filter { if case .setPushToken = $0 { true } else { false } } }
        h.send(.registerPushToken(token: "00FF", environment: .production), from: bob.link)
        h.advance(1_000 * ms)
        h.send(.registerPushToken(token: "00ff", environment: .production), from: bob.link)
        #expect(h.lastMessage(to: bob.link) == .pushTokenRegistered, "still acknowledged")
        #expect(tokenWrites().count == 1)
        // The registration time still moves on in memory: APNs' Unregistered compares against it.
        #expect(h.hub.channels[h.channel.id]!.members[bob.slot]!.pushRegisteredAt == h.time.date)
        h.advance(600_000 * ms)
        h.send(.registerPushToken(token: "00ff", environment: .production), from: bob.link)
        #expect(tokenWrites().count == 2, "ten minutes on, written again")
        // A new token, or the same one in the other environment, is written at once.
        h.send(.registerPushToken(token: "00ff", environment: .sandbox), from: bob.link)
        h.send(.registerPushToken(token: "0a0a", environment: .sandbox), from: bob.link)
        #expect(tokenWrites().count == 4)
    }

    @Test func aRejectedPushTokenIsForgottenUnlessReplaced() {
        let h = Harness()
        let ann = h.join("ann"), bob = h.join("bob")
        h.send(.registerPushToken(token: "00ff", environment: .production), from: bob.link)
        h.hub.pushTokenRejected(channel: h.channel.id, user: "bob", token: "00aa")
        h.drain()
        #expect(!h.stored.contains(.clearPushToken(channel: h.channel.id, user: "bob")), "a stale rejection keeps the new token")
        h.hub.pushTokenRejected(channel: h.channel.id, user: "bob", token: "00FF")
        h.drain()
        #expect(h.stored.last == .clearPushToken(channel: h.channel.id, user: "bob"))
        h.send(.floorRequest(), from: ann.link)
        #expect(!h.other.contains { if case .burstStarted = $0 { return true } else { return false } })
    }

    @Test func aRevokedTokenRemovesItsLiveMemberWithTheReason() {
        let h = Harness()
        let ann = h.join("ann", tokenID: "ann-1"), bob = h.join("bob", tokenID: "bob-1")
        h.hub.apply(.token("nobody's", channel: h.channel.id, user: nil, expiresAt: nil, at: h.time.date, reason: "leaked"), at: h.time)
        h.hub.apply(.token("bob-1", channel: UUID(), user: nil, expiresAt: nil, at: h.time.date, reason: "leaked"), at: h.time)
        h.drain()
        #expect(h.hub.roster(of: h.channel.id).count == 2, "a token nobody holds, or one of another channel, removes nobody")

        h.hub.apply(.token("bob-1", channel: h.channel.id, user: "bob", expiresAt: nil, at: h.time.date, reason: "phone lost"), at: h.time)
        h.drain()
        guard case .refused(.tokenRevoked, let reason)? = h.lastMessage(to: bob.link) else {
            Issue.record("bob was not told: \(h.messages(to: bob.link))"); return
        }
        #expect(reason.contains("phone lost"))
        #expect(h.closes.contains { $0.0 == bob.link && $0.1 == .removed })
        #expect(h.messages(to: ann.link).contains(.participantLeft(slot: bob.slot, userID: "bob")))
        #expect(h.hub.roster(of: h.channel.id).map(\.userID) == ["ann"])
        #expect(h.stored.last == .removeMember(channel: h.channel.id, user: "bob"))
        // Whatever bob's connection sends before it closes is ignored.
        let count = h.messages(to: bob.link).count
        h.send(.floorRequest(), from: bob.link)
        #expect(h.messages(to: bob.link).count == count && h.floorEvents(to: ann.link).isEmpty)
    }

    @Test func aStoredMemberComesBackWithItsRightsAndItsTokenCanBeRevoked() throws {
        // After a restart: members loaded from the store, offline, with what their last token allowed.
        let hub = ChannelHub()
        let channel = ChannelRecord(id: UUID(), name: "Ops", maxBurstSeconds: 60)
        let date = Date(timeIntervalSince1970: 1_800_000_000)
        let time = HubTime(instant: WireInstant(nanoseconds: 1_000 * ms), date: date)
        func grant(_ id: String, talk: Bool, listen: Bool) -> MemberGrant {
            MemberGrant(canTalk: talk, canListen: listen, role: "crew", priority: 7, tokenID: id,
                        tokenIssuedAt: date.addingTimeInterval(-60), tokenExpiresAt: date.addingTimeInterval(3600))
        }
        let stored = [
            MemberRecord(channelID: channel.id, userID: "ann", displayName: "Ann", pushToken: "aa", pushEnvironment: .sandbox,
                         grant: grant("ann-1", talk: true, listen: true)),
            MemberRecord(channelID: channel.id, userID: "tom", displayName: "Tom", pushToken: "bb", pushEnvironment: .sandbox,
                         grant: grant("tom-1", talk: true, listen: false)),
            MemberRecord(channelID: channel.id, userID: "old", displayName: "Old", pushToken: "cc", pushEnvironment: .sandbox),
            MemberRecord(channelID: channel.id, userID: "sue", displayName: "Sue", pushToken: "dd", pushEnvironment: .sandbox,
                         grant: grant("sue-1", talk: true, listen: true), unheard: ["cy"]),
        ]
        hub.upsertChannel(channel, members: stored, at: time)
        let roster = Dictionary(uniqueKeysWithValues: hub.roster(of: channel.id).map { ($0.userID, $0) })
        #expect(roster["ann"]?.role == "crew" && roster["ann"]?.priority == 7 && roster["ann"]?.canTalk == true)
        #expect(roster["tom"]?.canListen == false)
        #expect(roster["old"]?.canTalk == false && roster["old"]?.canListen == true && roster["old"]?.role == nil)

        // A talk burst wakes only members that may listen, and want to hear the talker: not talk-only
        // Tom, nor Sue, who unsubscribed from Cy before the restart.
        let link = Link(index: 1, generation: 1)
        hub.connected(link)
        hub.control(link, bytes: MessageCodec().encode(.join(token: "t", channel: channel.id, reason: .developerRequest)), at: time)
        hub.admit(link, claims: ParticipantClaims(userID: "cy", name: "Cy", channel: channel.id, capabilities: [.talk, .listen],
                                                  issuedAt: date, expiresAt: date.addingTimeInterval(60), tokenID: "cy-1"),
                  reason: .developerRequest, at: time)
        hub.control(link, bytes: MessageCodec().encode(.floorRequest()), at: time)
        let grantOutputs = hub.takeOutputs()
        let granted = grantOutputs.compactMap { output -> UInt16? in
            if case .send(.floor(let event), _) = output, event.kind == .granted { return event.burst } else { return nil }
        }
        let key = try #require(grantOutputs.compactMap { output -> MediaKey? in
            if case .send(.mediaKey(let key), _) = output { return key } else { return nil }
        }.last)
        // The wakes go with the burst's first audio.
        let datagram = AudioHeader(flags: [], burst: try #require(granted.first), sequence: 0)
            .datagram(payload: Harness.frame([1], keyID: key.keyID))
        _ = datagram.withUnsafeBytes { hub.receiveAudio(from: link, datagram: $0, at: time.instant) { _, _ in true } }
        hub.wakeOwedListeners(at: time.instant)
        let woken = hub.takeOutputs().compactMap { output -> [String]? in
            if case .burstStarted(_, _, let wake, _) = output { return wake.map(\.userID).sorted() } else { return nil }
        }
        #expect(woken == [["ann", "old"]])

        // Revoking ann's token by id removes her although she has not joined since the restart, and
        // tells her device to leave.
        hub.apply(.token("ann-1", channel: channel.id, user: nil, expiresAt: nil, at: date, reason: "phone lost"), at: time)
        let outputs = hub.takeOutputs()
        #expect(!hub.isMember(channel: channel.id, user: "ann"))
        #expect(outputs.contains { if case .memberGone(_, let m) = $0 { return m.userID == "ann" } else { return false } })
        #expect(outputs.contains(.store(.removeMember(channel: channel.id, user: "ann"))))
        #expect(hub.isMember(channel: channel.id, user: "tom"))
    }

    /// Members away since before the cut-off are forgotten: offline ones only, whatever the store
    /// says of the others; everyone connected hears they left, their rows go, and a device with a
    /// push token is told to leave. A member that came back stays.
    @Test func membersAwayTooLongAreForgotten() {
        let h = Harness()
        let day = 86_400.0
        let channel = ChannelRecord(id: UUID(), name: "Field", maxBurstSeconds: 60)
        func stored(_ user: String, daysAgo: Double, pushToken: String? = nil) -> MemberRecord {
            MemberRecord(channelID: channel.id, userID: user, displayName: user.capitalized, lastSeen: h.epoch.addingTimeInterval(-daysAgo * day),
                         pushToken: pushToken, pushEnvironment: pushToken == nil ? nil : .sandbox)
        }
        h.hub.upsertChannel(channel, members: [stored("gone", daysAgo: 40, pushToken: "aa"), stored("quiet", daysAgo: 40),
                                               stored("recent", daysAgo: 10), stored("back", daysAgo: 40)], at: h.time)
        let watcher = h.join("watcher", channel: channel.id)
        let back = h.join("back", channel: channel.id)
        h.hub.closed(back.link, at: h.time)  // reconnecting, not offline
        _ = h.hub.takeOutputs()
        #expect(h.hub.forgetIdleMembers(seenBefore: h.epoch.addingTimeInterval(-30 * day), limit: 1, at: h.time) == 1, "one at a time if asked")
        #expect(h.hub.forgetIdleMembers(seenBefore: h.epoch.addingTimeInterval(-30 * day), limit: 20, at: h.time) == 1)
        let outputs = h.hub.takeOutputs()
        #expect(Set(h.hub.roster(of: channel.id).map(\.userID)) == ["recent", "back", "watcher"])
        #expect(outputs.contains(.store(.removeMember(channel: channel.id, user: "gone"))))
        #expect(outputs.contains(.store(.removeMember(channel: channel.id, user: "quiet"))))
        #expect(outputs.contains { if case .send(.participantLeft(_, "gone"), let links) = $0 { return links.contains(watcher.link) } else { return false } })
        let gone = outputs.compactMap { if case .memberGone(_, let m) = $0 { return m.userID } else { return nil } }
        #expect(gone == ["gone"])
        // The one that came back was seen just now: kept even once offline, until it is away long enough.
        h.advance(h.hub.configuration.disconnectGrace + 1_000_000_000)
        #expect(h.hub.forgetIdleMembers(seenBefore: h.epoch.addingTimeInterval(-30 * day), limit: 20, at: h.time) == 0)
        // A join being checked may be one of them coming back: its channel waits for the next round.
        let checking = Link(index: 999, generation: 1)
        h.hub.connected(checking)
        h.send(.join(token: "t", channel: channel.id, reason: .developerRequest), from: checking)
        #expect(h.hub.forgetIdleMembers(seenBefore: h.time.date.addingTimeInterval(1), limit: 20, at: h.time) == 0)
        h.hub.closed(checking, at: h.time)
        #expect(h.hub.forgetIdleMembers(seenBefore: h.time.date.addingTimeInterval(1), limit: 20, at: h.time) == 2, "recent and back, both offline now")
        #expect(h.hub.roster(of: channel.id).map(\.userID) == ["watcher"])
    }

    /// A member whose token runs out goes offline as of then, not as of its join; the hourly chore
    /// writes the last-seen times of the members still connected.
    @Test func lastSeenFollowsExpiryAndConnectedMembersAreTouched() {
        let h = Harness()
        let ann = h.join("ann", expiresAt: h.epoch.addingTimeInterval(3_600))
        _ = h.join("bob", expiresAt: h.epoch.addingTimeInterval(86_400))
        h.advance(3_601 * 1_000_000_000)
        #expect(h.messages(to: ann.link).contains { if case .refused(.tokenExpired, _) = $0 { true } else { false } })
        #expect(h.hub.forgetIdleMembers(seenBefore: h.epoch.addingTimeInterval(3_000), limit: 20, at: h.time) == 0, "seen at the expiry, not the join")
        #expect(h.hub.forgetIdleMembers(seenBefore: h.time.date.addingTimeInterval(1), limit: 20, at: h.time) == 1)
        #expect(h.hub.connectedMembers == [MemberKey(channel: h.channel.id, user: "bob")])
    }

    @Test func aJoinStoresWhatTheTokenAllows() {
        let h = Harness()
        h.join("ann", capabilities: [.listen], priority: 9, tokenID: "ann-7")
        let upsert = h.stored.compactMap { if case .upsertMember(let m) = $0 { return m } else { return nil } }.last
        #expect(upsert?.grant?.tokenID == "ann-7" && upsert?.grant?.priority == 9)
        #expect(upsert?.grant?.canTalk == false && upsert?.grant?.canListen == true)
        #expect(upsert?.grant?.tokenExpiresAt == h.epoch.addingTimeInterval(3600))
    }

    @Test func aMemberRevocationSparesATokenIssuedAfterIt() {
        let h = Harness()
        let cut = h.time.date
        let ann = h.join("ann", issuedAt: cut.addingTimeInterval(5))  // rejoined with a fresh token
        let bob = h.join("bob", issuedAt: cut.addingTimeInterval(-5))
        h.hub.apply(.member(channel: h.channel.id, user: "ann", at: cut, reason: "removed"), at: h.time)
        h.hub.apply(.member(channel: h.channel.id, user: "bob", at: cut, reason: "removed"), at: h.time)
        h.drain()
        #expect(h.lastMessage(to: bob.link) == .refused(code: .removedByAdmin, reason: "an administrator removed you from the channel"))
        #expect(!h.messages(to: ann.link).contains { if case .refused = $0 { true } else { false } })
        #expect(h.hub.roster(of: h.channel.id).map(\.userID) == ["ann"])
    }
}
