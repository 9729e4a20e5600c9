import ClusterPlacement
import Testing

@Suite struct LeaseKeeperTests {
    let sent = LocalInstant(nanoseconds: 50_000_000_000)

    func at(_ offset: Duration) -> LocalInstant { sent + offset }

    @Test func validityIsTheLeaseLessDriftLessMargin() {
        #expect(LeaseKeeper<String>.Settings().validity == .milliseconds(4_850))
    }

    @Test func aLeaseIsBelievedFromTheRequestsSendingForTheValidity() {
        var keeper = LeaseKeeper<String>()
        let taken = keeper.acquired("ops", epoch: Epoch(3), requestSentAt: sent)
        #expect(taken)
        #expect(keeper.isServing("ops", now: at(.milliseconds(4_849))))
        #expect(keeper.isServing("ops", epoch: Epoch(3), now: at(.seconds(1))))
        #expect(!keeper.isServing("ops", epoch: Epoch(2), now: at(.seconds(1))))
        #expect(!keeper.isServing("ops", now: at(.milliseconds(4_850))))
        #expect(!keeper.isServing("fire", now: at(.seconds(1))))
    }

    /// A reply that reaches a node after it was stopped for a while counts from when it asked.
    @Test func aReplyAfterAPauseIsAlreadyOver() {
        var keeper = LeaseKeeper<String>()
        keeper.acquired("ops", epoch: Epoch(3), requestSentAt: sent)
        #expect(!keeper.isServing("ops", now: at(.seconds(12))))
        let events = keeper.tick(now: at(.seconds(12)))
        #expect(events == [.fenced("ops", epoch: Epoch(3))])
        #expect(keeper.held.isEmpty)
    }

    @Test func renewalsExtendFromTheirOwnSendingAndOnlyTheEpochHeld() {
        var keeper = LeaseKeeper<String>()
        keeper.acquired("ops", epoch: Epoch(3), requestSentAt: sent)
        keeper.renewalSucceeded([HeldLease(channel: "ops", epoch: Epoch(3))], requestSentAt: at(.seconds(2)))
        #expect(keeper.isServing("ops", now: at(.milliseconds(6_849))))
        #expect(!keeper.isServing("ops", now: at(.milliseconds(6_850))))
        // An older round answering late doesn't shorten anything; another epoch or channel is ignored.
        keeper.renewalSucceeded([HeldLease(channel: "ops", epoch: Epoch(3))], requestSentAt: at(.seconds(1)))
        keeper.renewalSucceeded([HeldLease(channel: "ops", epoch: Epoch(2)), HeldLease(channel: "fire", epoch: Epoch(3))],
                                requestSentAt: at(.seconds(4)))
        #expect(keeper.holding("ops")?.validUntil == at(.milliseconds(6_850)))
        #expect(keeper.holding("fire") == nil)
    }

    @Test func tickFencesOnceAndForgets() {
        var keeper = LeaseKeeper<String>()
        keeper.acquired("ops", epoch: Epoch(3), requestSentAt: sent)
        keeper.acquired("fire", epoch: Epoch(1), requestSentAt: at(.seconds(2)))
        let events = [4, 5, 6].map { keeper.tick(now: at(.seconds($0))) }
        #expect(events == [[], [.fenced("ops", epoch: Epoch(3))], []])
        #expect(keeper.held.map(\.channel) == ["fire"])
        #expect(keeper.nextDeadline() == at(.seconds(1)), "the first renewal, overdue, comes before fire's validity ends")
    }

    @Test func aNewerEpochReplacesAnOlderOneAndAStaleReplyIsIgnored() {
        var keeper = LeaseKeeper<String>()
        keeper.acquired("ops", epoch: Epoch(3), requestSentAt: sent)
        let newer = keeper.acquired("ops", epoch: Epoch(5), requestSentAt: at(.seconds(1)))
        let stale = keeper.acquired("ops", epoch: Epoch(4), requestSentAt: at(.seconds(2)))
        #expect(newer && !stale)
        #expect(keeper.holding("ops")?.epoch == Epoch(5))
        #expect(keeper.isServing("ops", epoch: Epoch(5), now: at(.seconds(5))))
    }

    @Test func lostAndReleaseStopServingAtOnce() {
        var keeper = LeaseKeeper<String>()
        keeper.acquired("ops", epoch: Epoch(3), requestSentAt: sent)
        keeper.acquired("fire", epoch: Epoch(7), requestSentAt: sent)
        let lostOther = keeper.lost("ops", epoch: Epoch(2)), lost = keeper.lost("ops", epoch: Epoch(3))
        #expect(!lostOther && lost)
        #expect(!keeper.isServing("ops", now: at(.seconds(1))))
        let released = keeper.release("fire"), releasedAgain = keeper.release("fire")
        #expect(released == Epoch(7) && releasedAgain == nil)
        #expect(!keeper.isServing("fire", now: at(.seconds(1))))
        #expect(keeper.nextRenewal() == nil && keeper.nextDeadline() == nil)
    }

    @Test func renewalsComeEveryIntervalWhileAnythingIsHeld() {
        var keeper = LeaseKeeper<String>()
        #expect(keeper.nextRenewal() == nil)
        keeper.acquired("ops", epoch: Epoch(3), requestSentAt: sent)
        #expect(keeper.nextRenewal() == at(.seconds(1)))
        let round = keeper.startRenewal(now: at(.milliseconds(1_020)))
        #expect(round == [HeldLease(channel: "ops", epoch: Epoch(3))])
        #expect(keeper.nextRenewal() == at(.milliseconds(2_020)))
    }

    /// The whole argument in numbers: a lease won by a request sent at true time 0, granted by the
    /// database up to 200 ms later, is given up by the node strictly before the database's expiry for
    /// any clock offset and any rate within the drift bound.
    @Test func theNodeLetsGoBeforeTheDatabaseCouldGiveTheChannelAway() {
        let settings = LeaseKeeper<String>.Settings()
        for rate in stride(from: 0.99, through: 1.01, by: 0.0025) {
            for offset: Int64 in [-7_000_000_000_000, 0, 123_456_789] {
                let sentLocal = LocalInstant(nanoseconds: offset)
                var keeper = LeaseKeeper<String>(settings: settings)
                keeper.acquired("ops", epoch: .first, requestSentAt: sentLocal)
                for dbNowNanos: Int64 in [0, 200_000_000] {
                    let expiryNanos = dbNowNanos + 5_000_000_000
                    let localAtExpiry = LocalInstant(nanoseconds: offset + Int64((Double(expiryNanos) * rate).rounded(.down)))
                    #expect(!keeper.isServing("ops", now: localAtExpiry), "rate \(rate)")
                }
            }
        }
    }
}
