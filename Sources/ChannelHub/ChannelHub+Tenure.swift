import ChannelProtocol
import ChannelStore
import FloorControl
import Foundation
import Wire

/// How long this node may serve a channel: for good on a single node; in a cluster, until the
/// validity of its lease (ClusterPlacement's `LeaseKeeper`), by the hub's own monotonic clock.
enum Tenure: Equatable {
    case unlimited
    case until(WireInstant)
}

extension ChannelState {
    /// Checked before every floor grant and every relayed packet: a node whose lease may have passed
    /// to another node (it was paused, or cut off from the database) neither grants nor relays.
    @inline(__always)
    func isServed(at now: WireInstant) -> Bool {
        switch tenure {
        case .unlimited: true
        case .until(let end): now < end
        }
    }
}

extension ChannelHub {
    /// Whether the channel is loaded and served now.
    public func serves(_ id: UUID, at now: WireInstant) -> Bool { channels[id]?.isServed(at: now) ?? false }

    /// Whether a burst is going on in the channel: a draining node waits for it to end.
    public func isTalking(in id: UUID) -> Bool { !(channels[id]?.floor.currentTalkers.isEmpty ?? true) }

    /// Stops serving the channel at once (no grant, no relayed packet), members still connected: a
    /// draining node does this before it hands the channel over, so that two nodes never serve it.
    public func endTenure(_ id: UUID) {
        channels[id]?.tenure = .until(WireInstant(nanoseconds: 0))
    }

    /// This node holds the channel's lease until `validUntil` (a claim won, or a renewal).
    public func leaseHeld(_ id: UUID, until validUntil: WireInstant) {
        guard let channel = channels[id] else { return }
        if case .until(let end) = channel.tenure, end >= validUntil { return }
        channel.tenure = .until(validUntil)
    }

    /// The lease is gone (not renewed in time, or the database says another node has it): members are
    /// told the channel is `connecting`, then disconnected as by a server going away, so that they
    /// rejoin through the cluster and find its home. Bursts stop where they are: this node can no
    /// longer write for the channel (its writes are fenced), and the new home closes their records.
    /// The channel's live state is dropped; it is loaded afresh from the store if it comes back.
    public func fence(_ id: UUID, reason: String, at time: HubTime) {
        guard let channel = channels.removeValue(forKey: id) else { return }
        channel.tenure = .until(WireInstant(nanoseconds: 0))
        let links = channel.connectedLinks
        if !links.isEmpty { outputs.append(.send(.serviceStatus(.connecting, reason: reason), to: links)) }
        for link in links {
            sessions[link] = nil
            outputs.append(.close(link, code: .goingAway, reason: "the channel moved to another node"))
        }
        forgetLiveState(of: channel)
        counters.fenced += 1
    }

    /// This node took the channel up as its home (it was not before): the channel is loaded afresh
    /// from what the store has now (members that joined at its earlier home included), and served
    /// until `validUntil`.
    public func takeUp(_ record: ChannelRecord, members: [MemberRecord], until validUntil: WireInstant, at time: HubTime) {
        if let channel = channels[record.id], channel.connectedLinks.isEmpty {
            channels[record.id] = nil
            forgetLiveState(of: channel)
        }
        upsertChannel(record, members: members, at: time)
        leaseHeld(record.id, until: validUntil)
    }

    /// Whatever still points at a channel dropped from `channels`.
    private func forgetLiveState(of channel: ChannelState) {
        reconnecting.removeAll { $0.channel === channel }
        catchingUp.removeAll(in: channel)
        expiries.drop { $0.channel === channel }
    }

    /// A join reached this node, but the channel's home is `home`: the client is sent there, and the
    /// connection closes once it has the message (as after a refusal). `pass`: the home's entry pass
    /// for this join, when the node can issue one.
    public func redirect(_ link: Link, to home: NodeAddress, pass: HomePass? = nil) {
        guard case .verifying? = sessions[link] else { return }  // closed while its placement was decided
        _ = tokenChecks.ended(link, claims: nil)
        sessions[link] = .refused
        counters.redirects += 1
        outputs.append(.send(.redirect(home: home, pass: pass), to: [link]))
        outputs.append(.close(link, code: .goingAway, reason: "the channel's home is \(home)"))
    }

    /// The channel moved to `home` (this node drains): its members are sent there at once, and its
    /// live state here is dropped. Bursts in progress end as `moved`.
    public func move(_ id: UUID, to home: NodeAddress, at time: HubTime) {
        guard let channel = channels.removeValue(forKey: id) else { return }
        for slot in channel.floor.currentTalkers { logBurstEnd(channel, slot: slot, reason: "moved", at: time) }
        for link in channel.connectedLinks {
            sessions[link] = .refused
            outputs.append(.send(.move(home: home), to: [link]))
            outputs.append(.close(link, code: .goingAway, reason: "the channel moved to \(home)"))
        }
        forgetLiveState(of: channel)
    }
}
