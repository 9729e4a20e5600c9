import ChannelProtocol
import ChannelStore
import Foundation
import Wire

// What one member's use of the floor may cost everyone else. Each grant and its end tell every
// member of the channel three or four things, log the burst twice and may wake every sleeping
// phone; at the control rate a member cycling requests and releases multiplied that by ten a second.
extension ChannelHub {
    /// Why the member in `slot` may not be granted the floor now (nil: it may). Only a new request
    /// counts: a member that holds the floor or waits for it is answered as before.
    func floorLimit(_ channel: ChannelState, slot: UInt16, at now: WireInstant) -> String? {
        guard let member = channel.members[slot], channel.floor.burst(of: slot) == nil,
              !channel.floor.queuedMembers.contains(slot) else { return nil }
        let perMinute = configuration.floorGrantsPerMinute, burst = configuration.floorGrantBurst
        guard let grants = member.floorGrants, !grants.hasToken(at: now, perMinute: perMinute, burst: burst) else { return nil }
        let wait = (grants.wait(at: now, perMinute: perMinute, burst: burst) + 999_999_999) / 1_000_000_000
        return "you have started talking more than \(perMinute) times a minute; wait \(wait) s before the next"
    }

    /// A grant spends one of the member's allowance.
    func chargeGrant(_ channel: ChannelState, slot: UInt16, at now: WireInstant) {
        guard var member = channel.members[slot] else { return }
        var grants = member.floorGrants ?? TokenBucket(full: configuration.floorGrantBurst, at: now)
        _ = grants.take(at: now, perMinute: configuration.floorGrantsPerMinute, burst: configuration.floorGrantBurst)
        member.floorGrants = grants
        channel.members[slot] = member
    }

    /// The first audio of a burst: the members who hear the talker and have a push token are woken
    /// (asleep) or offered to the driver to wake (connected, maybe silently gone). Not at the grant:
    /// a burst that carries no audio, a tap or a request and release in a loop, has nothing to wake
    /// anyone for. A sleeping member is woken at most `wakesPerMinute`, whoever talks.
    func wakeListeners(_ channel: ChannelState, talker slot: UInt16, recording: BurstRecording, taken: HubTime, at now: WireInstant) {
        recording.wakeOwed = nil
        guard let talker = channel.members[slot] else { return }
        let time = HubTime(instant: now, date: taken.date.addingTimeInterval(Double(now.since(taken.instant)) / 1e9))
        var wake: [MemberRecord] = []
        var connected: [WakeCandidate] = []
        for other in channel.members.values where other.pushToken != nil && other.hears(talker) && other.slot != slot {
            if let link = other.link {
                connected.append(WakeCandidate(member: other.record(channel: channel.record.id, lastSeen: time.date), link: link))
                continue
            }
            guard mayBeWoken(other, at: time) else { continue }
            var wakes = other.wakes ?? TokenBucket(full: configuration.wakeBurst, at: now)
            let allowed = wakes.take(at: now, perMinute: configuration.wakesPerMinute, burst: configuration.wakeBurst)
            channel.members[other.slot]?.wakes = wakes
            guard allowed else {
                counters.wakesLimited += 1
                continue
            }
            wake.append(other.record(channel: channel.record.id, lastSeen: time.date))
        }
        if !wake.isEmpty || !connected.isEmpty {
            outputs.append(.burstStarted(channel: channel.record.id, talker: talker.participant, wake: wake, connected: connected))
        }
    }
}
