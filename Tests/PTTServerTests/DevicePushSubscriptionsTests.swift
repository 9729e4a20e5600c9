import ChannelProtocol
import Foundation
@testable import PTTServer
import Testing

/// The device push service's streams: a push reaches only a stream its own member opened.
struct DevicePushSubscriptionsTests {
    let ann = DevicePushSubscriptions.Owner(channel: UUID(), user: "ann")
    var bob: DevicePushSubscriptions.Owner { .init(channel: ann.channel, user: "bob") }
    let later = Date().addingTimeInterval(3600)

    func push(_ id: String) -> DevicePushDelivery { DevicePushDelivery(id: id, body: #"{"activeSpeaker":"Cat"}"#) }

    @Test func aPushGoesToItsMembersStreamAndNoOtherMemberCanTakeTheToken() async throws {
        let subscriptions = DevicePushSubscriptions()
        guard case .opened(_, let lines) = subscriptions.subscribe(token: "aa01", owner: ann, expiresAt: later) else {
            Issue.record("Ann's stream was not opened")
            return
        }
        // Bob names Ann's token: refused, and Ann's stream stays.
        guard case .heldByAnother = subscriptions.subscribe(token: "aa01", owner: bob, expiresAt: later) else {
            Issue.record("Bob took Ann's token")
            return
        }
        #expect(subscriptions.deliver(push("1"), token: "aa01", to: bob) == .heldByAnother, "a push for Bob never reaches Ann's stream")
        #expect(subscriptions.deliver(push("2"), token: "aa01", to: ann) == .delivered)
        #expect(subscriptions.deliver(push("3"), token: "bb02", to: ann) == .notConnected)
        var iterator = lines.makeAsyncIterator()
        guard case .push(let first)? = await iterator.next() else {
            Issue.record("no push on Ann's stream")
            return
        }
        #expect(first.id == "2")
    }

    @Test func aNewStreamForTheSameTokenEndsTheOldOneAndExpiryEndsAStream() async throws {
        let subscriptions = DevicePushSubscriptions()
        guard case .opened(_, let old) = subscriptions.subscribe(token: "aa01", owner: ann, expiresAt: later),
              case .opened(_, let new) = subscriptions.subscribe(token: "aa01", owner: ann, expiresAt: Date().addingTimeInterval(30)) else {
            Issue.record("Ann's streams were not opened")
            return
        }
        var oldLines = old.makeAsyncIterator()
        #expect(await oldLines.next() == nil, "the stale stream ended")
        #expect(subscriptions.count == 1)
        subscriptions.tick(now: Date())
        var newLines = new.makeAsyncIterator()
        guard case .keepalive? = await newLines.next() else {
            Issue.record("no keepalive")
            return
        }
        subscriptions.tick(now: Date().addingTimeInterval(31))
        #expect(await newLines.next() == nil, "ended at the participant token's expiry")
        #expect(subscriptions.count == 0)
        #expect(subscriptions.deliver(push("4"), token: "aa01", to: ann) == .notConnected)
    }

    @Test func aMembersFifthStreamEndsItsOldest() async {
        let subscriptions = DevicePushSubscriptions()
        // Held, as the server's open answers hold theirs: a stream dropped ends.
        var streams: [AsyncStream<DevicePushSubscriptions.Line>] = []
        for index in 0 ..< DevicePushSubscriptions.perMember + 1 {
            guard case .opened(_, let lines) = subscriptions.subscribe(token: "a\(index)", owner: ann, expiresAt: later) else {
                Issue.record("stream \(index) not opened")
                return
            }
            streams.append(lines)
        }
        var iterator = streams.first?.makeAsyncIterator()
        #expect(await iterator?.next() == nil, "the oldest ended")
        #expect(subscriptions.count == DevicePushSubscriptions.perMember)
        #expect(subscriptions.deliver(push("5"), token: "a0", to: ann) == .notConnected)
        #expect(subscriptions.deliver(push("6"), token: "a4", to: ann) == .delivered)
        // Another member's streams don't count against Ann's.
        guard case .opened(_, let bobs) = subscriptions.subscribe(token: "b0", owner: bob, expiresAt: later) else {
            Issue.record("Bob's stream not opened")
            return
        }
        #expect(subscriptions.count == DevicePushSubscriptions.perMember + 1)
        withExtendedLifetime((streams, bobs)) {}
    }

    @Test func closingRefusesNewStreams() async {
        let subscriptions = DevicePushSubscriptions()
        guard case .opened(_, let lines) = subscriptions.subscribe(token: "aa01", owner: ann, expiresAt: later) else {
            Issue.record("not opened")
            return
        }
        subscriptions.closeAll()
        var iterator = lines.makeAsyncIterator()
        #expect(await iterator.next() == nil)
        guard case .closed = subscriptions.subscribe(token: "cc03", owner: bob, expiresAt: later) else {
            Issue.record("a stream opened on a stopping server")
            return
        }
    }
}
