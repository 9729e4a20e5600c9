@testable import PTTServer
import Testing
import Wire

/// The driver's queue for control messages that found their stream full, as a plain value: space
/// and time are given, nothing is sent anywhere.
@Suite struct ControlBacklogTests {
    let ann = Endpoint.Handle(index: 1, generation: 1)
    let bob = Endpoint.Handle(index: 2, generation: 1)
    let t0 = WireInstant(nanoseconds: 1_000_000_000)

    func message(_ tag: UInt8, _ count: Int = 100) -> [UInt8] { [UInt8](repeating: tag, count: count) }

    /// `append`, outside `#expect`, which cannot take a mutating call.
    static func add(_ backlog: inout ControlBacklog, _ message: [UInt8], for link: Endpoint.Handle, now: WireInstant) -> Bool {
        backlog.append(message, for: link, now: now)
    }

    @Test func messagesLeaveInOrderAsRoomAllows() {
        var backlog = ControlBacklog()
        for tag in 1...5 { #expect(Self.add(&backlog, message(UInt8(tag)), for: ann, now: t0)) }
        var sent: [UInt8] = []
        // Room for two framed 100-byte messages (a 2-byte length prefix each), not three.
        var stalled = backlog.drain(now: t0 + 1_000_000, space: { _ in 2 * 102 + 50 }) { _, bytes in sent.append(bytes[0]) }
        #expect(sent == [1, 2] && stalled.isEmpty && backlog.holds(ann))
        stalled = backlog.drain(now: t0 + 2_000_000, space: { _ in 10_000 }) { _, bytes in sent.append(bytes[0]) }
        #expect(sent == [1, 2, 3, 4, 5] && stalled.isEmpty && backlog.isEmpty)
    }

    @Test func aQueueThatDoesNotMoveIsGivenUpAndAGoneConnectionForgotten() {
        var backlog = ControlBacklog()
        #expect(Self.add(&backlog, message(1), for: ann, now: t0))
        #expect(Self.add(&backlog, message(2), for: bob, now: t0))
        var stalled = backlog.drain(now: t0 + (backlog.maxStall - 1), space: { $0 == ann ? 0 : nil }) { _, _ in Issue.record("nothing fits") }
        #expect(stalled.isEmpty && backlog.holds(ann) && !backlog.holds(bob))
        stalled = backlog.drain(now: t0 + backlog.maxStall, space: { _ in 0 }) { _, _ in Issue.record("nothing fits") }
        #expect(stalled == [ann] && backlog.isEmpty)
    }

    @Test func aLinkOverTheLimitLosesItsQueue() {
        var backlog = ControlBacklog()
        backlog.maxBytes = 250
        #expect(Self.add(&backlog, message(1), for: ann, now: t0))
        #expect(Self.add(&backlog, message(2), for: ann, now: t0))
        #expect(!Self.add(&backlog, message(3), for: ann, now: t0))
        #expect(!backlog.holds(ann))
        // Progress resets the stall clock; a link's leftover bytes are counted after each send.
        #expect(Self.add(&backlog, message(4), for: bob, now: t0))
        #expect(Self.add(&backlog, message(5), for: bob, now: t0))
        _ = backlog.drain(now: t0 + 5, space: { _ in 102 }) { _, _ in }
        #expect(Self.add(&backlog, message(6), for: bob, now: t0 + 6))
        #expect(backlog.queues[bob]?.bytes == 200 && backlog.queues[bob]?.movedAt == t0 + 5)
    }

    /// A close drops what waited for the session but the newest message, the one that explains it.
    @Test func aCloseKeepsOnlyTheNewestMessage() {
        var backlog = ControlBacklog()
        for tag in 1...3 { #expect(Self.add(&backlog, message(UInt8(tag), 100 * Int(tag)), for: ann, now: t0)) }
        backlog.keepNewest(ann)
        backlog.keepNewest(bob)  // nothing queued: nothing happens
        #expect(backlog.queues[ann]?.messages.map { $0[0] } == [3] && backlog.queues[ann]?.bytes == 300 && !backlog.holds(bob))
    }
}
