import ChannelProtocol
import ChannelStore
import FloorControl
import Foundation
import Wire

extension ChannelHub {
    /// The driver's liveness sweep (about once a second). A member whose connection is still open but
    /// has gone silent, because its phone died or lost its network or its app went to the background
    /// with keepalives off, would otherwise show `connected` until the transport's idle timeout,
    /// minutes later, and a dispatcher would call a unit that can't hear. Such a member shows
    /// `reconnecting` until it is heard again (then `connected`), its connection closes (then
    /// `closed(_:at:)` takes over), or it has been silent for `silentOffline` (then `offline`, the
    /// session still open for a resume). Only the roster changes: its place, the floor
    /// (`FloorArbiter.silenceLimit` covers a silent talker) and the relay are as they were.
    ///
    /// The changes of one sweep go out as one `roster` message per channel (in chunks), not one
    /// `participant` each: when the server itself was cut off, every member goes silent in the same
    /// sweep, and a message per member to every member would be millions in a big channel.
    /// - Parameters:
    ///   - mayMarkSilent: false right after the server itself stalled (the driver's loop ran late):
    ///     what it hasn't read yet may be from every member, so only "heard" counts this time.
    ///   - time: now, for how long a burst the member is owed is kept.
    ///   - isHeard: whether the transport has heard from `link` within the liveness window; a query,
    ///     so that the hub stays free of clocks and sockets.
    public func sweepLiveness(mayMarkSilent: Bool = true, at time: HubTime, isHeard: (Link) -> Bool) {
        closeUnjoined(at: time)
        for channel in channels.values {
            var changed: [UInt16] = []
            var replaying = false
            // The listener array is rebuilt once for the channel, not once per member back: after
            // an outage of the server's own network, every member comes back in the same sweep.
            defer { if replaying { listenersChanged(channel) } }
            for (slot, member) in channel.members {
                guard let link = member.link else { continue }
                let heard = isHeard(link)
                if heard, member.connection != .connected {
                    channel.members[slot]?.connection = .connected
                    channel.members[slot]?.silentSince = nil
                    if replayOwed(channel, slot: slot, at: time, rebuild: false) { replaying = true }
                } else if !heard, mayMarkSilent, member.connection == .connected {
                    channel.members[slot]?.connection = .reconnecting
                    channel.members[slot]?.silentSince = time.instant
                    counters.silentMembers += 1
                    owe(channel, slot: slot, replaying: [], at: time.instant)
                } else if !heard, mayMarkSilent, member.connection == .reconnecting, configuration.silentOffline > 0,
                          let since = member.silentSince, time.instant.since(since) >= configuration.silentOffline {
                    channel.members[slot]?.connection = .offline
                } else {
                    continue
                }
                changed.append(slot)
            }
            guard let first = changed.first else { continue }
            let links = channel.connectedLinks
            if changed.count == 1 {
                announce(channel, slot: first, to: links, at: time.instant)
                continue
            }
            // Chunked as a joiner's roster is.
            var stream = RosterStream(channel: channel, slots: changed, next: 0)
            while !stream.isFinished { outputs.append(.send(.roster(nextRosterChunk(&stream)), to: links)) }
        }
    }

    /// Reconnecting members whose grace ran out show offline (a stale entry, for a member that came
    /// back or left, is dropped).
    func reconnectingGraceEnds(at time: HubTime) {
        var index = 0
        while index < reconnecting.count {
            let channel = reconnecting[index].channel, slot = reconnecting[index].slot
            guard let member = channel.members[slot], member.connection == .reconnecting,
                  let until = member.reconnectingUntil else {
                reconnecting.remove(at: index)
                continue
            }
            if until <= time.instant {
                channel.members[slot]?.connection = .offline
                channel.members[slot]?.reconnectingUntil = nil
                reconnecting.remove(at: index)
                announce(channel, slot: slot, at: time.instant)
            } else {
                index += 1
            }
        }
    }

    /// Refuses connections that have not sent `join` within `joinDeadline` of a sweep first seeing
    /// them (so between the deadline and a sweep interval or two more). The transport's handshake
    /// doesn't authenticate clients: without this, anyone could hold connections open for good with
    /// keepalives, each with its control stream's reassembly buffer, and the hub's tables, pinned.
    /// Every client joins right after its handshake.
    func closeUnjoined(at time: HubTime) {
        guard configuration.joinDeadline > 0 else { return }
        var late: [Link] = []
        for (link, session) in sessions {
            guard case .connected = session else { continue }
            guard let since = unjoined[link] else {
                unjoined[link] = time.instant
                continue
            }
            if time.instant.since(since) >= configuration.joinDeadline { late.append(link) }
        }
        let seconds = configuration.joinDeadline / 1_000_000_000
        for link in late {
            unjoined[link] = nil
            refuse(link, code: .notJoined, reason: "no join within \(seconds) s of connecting; send join right after the handshake")
        }
    }
}
