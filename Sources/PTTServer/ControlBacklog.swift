import ChannelHub
import NIOCore
import Wire

/// Control messages that found a connection's control stream full, kept in order until it has room.
///
/// A connection's control stream holds at most `controlStreamLimit` (1 MiB) of messages its peer
/// has not acknowledged; a message that found it full used to be dropped, leaving the peer with a
/// wrong roster or floor state for as long as it stayed. Rosters no longer come here (the hub makes
/// each chunk when there is room, `ChannelHub.continueRoster`); what does is the rest, for a peer
/// that acknowledges slowly or not at all. Once a link has a queue, every later message for it joins
/// the queue too, so the order the hub sent them in is kept.
///
/// A plain value: the driver offers it the stream's free space and a clock.
struct ControlBacklog {
    struct Queue {
        var messages = CircularBuffer<[UInt8]>()
        var bytes = 0
        /// When a message last left this queue (or the queue began).
        var movedAt: WireInstant
    }

    /// Most a link may have waiting: far more than a working peer ever lets pile up.
    var maxBytes = 8 << 20
    /// A queue that has not moved for this long belongs to a peer that stopped acknowledging.
    var maxStall: UInt64 = 30_000_000_000

    private(set) var queues: [Link: Queue] = [:]

    var isEmpty: Bool { queues.isEmpty }

    func holds(_ link: Link) -> Bool { !queues.isEmpty && queues[link] != nil }

    /// Queues `message` for `link`. False when that takes the link over `maxBytes`: its queue is
    /// dropped, and the caller closes the connection, whose state the peer could no longer follow.
    mutating func append(_ message: [UInt8], for link: Link, now: WireInstant) -> Bool {
        var queue = queues.removeValue(forKey: link) ?? Queue(movedAt: now)
        queue.bytes += message.count
        guard queue.bytes <= maxBytes else { return false }
        queue.messages.append(message)
        queues[link] = queue
        return true
    }

    /// Sends what fits, oldest first: `space` says how many bytes a link's stream takes now (nil: the
    /// connection is gone, and so is its queue). Returns the links whose queues stalled past
    /// `maxStall`, already dropped, for the caller to close.
    mutating func drain(now: WireInstant, space: (Link) -> Int?, send: (Link, [UInt8]) -> Void) -> [Link] {
        var stalled: [Link] = []
        for link in Array(queues.keys) {
            guard var queue = queues.removeValue(forKey: link), var room = space(link) else { continue }
            while let first = queue.messages.first, Connection.framedControlSize(first.count) <= room {
                room -= Connection.framedControlSize(first.count)
                queue.bytes -= first.count
                send(link, queue.messages.removeFirst())
                queue.movedAt = now
            }
            if queue.messages.isEmpty { continue }
            if now.since(queue.movedAt) >= maxStall {
                stalled.append(link)
                continue
            }
            queues[link] = queue
        }
        return stalled
    }

    /// Drops all but the newest message waiting for `link`: the session is over, and only the
    /// message that says so still matters.
    mutating func keepNewest(_ link: Link) {
        guard var queue = queues[link], queue.messages.count > 1, let newest = queue.messages.last else { return }
        queue.messages = [newest]
        queue.bytes = newest.count
        queues[link] = queue
    }

    /// The connection closed: what waited for it is dropped.
    mutating func remove(_ link: Link) {
        queues[link] = nil
    }
}
