import ChannelProtocol
import ChannelStore
import FloorControl
import Foundation
import ParticipantClaims
import Wire

extension ChannelHub {
    /// The token was checked at the door (or at a renewal); the session must not outlive it either (a
    /// shift's token kept connected for days, or resumed across networks, would otherwise never end).
    /// The member hears `tokenRenewalNotice` before the end, at once if less than that is left.
    func scheduleExpiry(_ channel: ChannelState, slot: UInt16, link: Link, claims: ParticipantClaims, at time: HubTime) {
        let left = UInt64((min(max(0, claims.expiresAt.timeIntervalSince(time.date)), 10 * 365 * 86_400) * 1e9).rounded())
        var notice: WireInstant?
        if left > configuration.tokenRenewalNotice {
            notice = time.instant + (left - configuration.tokenRenewalNotice)
        } else if left > 0 {
            outputs.append(.send(.tokenExpiring(expiresAt: claims.expiresAt), to: [link]))
        }
        expiries.schedule(.init(channel: channel, slot: slot, tokenID: claims.tokenID, at: time.instant + left, notice: notice))
    }

    /// Ends the sessions whose token has expired, and warns those whose token is about to.
    func expireTokens(at time: HubTime) {
        let due = expiries.takeDue(at: time.instant) { entry in
            guard let member = entry.channel.members[entry.slot], member.link != nil, member.token?.id == entry.tokenID else { return false }
            return channels[entry.channel.record.id] === entry.channel
        }
        for (entry, kind) in due {
            switch kind {
            case .expired:
                expire(entry.channel, slot: entry.slot, at: time)
            case .notice:
                guard let member = entry.channel.members[entry.slot], let link = member.link, let token = member.token else { continue }
                outputs.append(.send(.tokenExpiring(expiresAt: token.expiresAt), to: [link]))
            }
        }
    }

    /// The member's token expired while it was connected: it is told so and disconnected, and stays a
    /// member (offline, its push token kept): a new token lets it back in, as after any absence.
    func expire(_ channel: ChannelState, slot: UInt16, at time: HubTime) {
        guard var member = channel.members[slot], let link = member.link else { return }
        counters.tokenExpiries += 1
        sessions[link] = .refused
        outputs.append(.send(.refused(code: .tokenExpired, reason: "your participant token expired; ask the channel's administrator for a new one, then join again"), to: [link]))
        outputs.append(.close(link, code: .refused, reason: "token expired"))
        member.link = nil
        member.connection = .offline
        member.lastSeen = time.date
        member.reconnectingUntil = nil
        owe(channel, slot: slot, replaying: member.catchUp, at: time.instant)
        stopCatchUp(&member, in: channel)
        channel.members[slot] = member
        if channel.floor.mayTalk(slot) { channel.endReasons[slot] = "tokenExpired" }
        channel.floor.release(slot, now: time.instant.nanoseconds)
        applyFloorEvents(channel, at: time)
        listenersChanged(channel)
        announce(channel, slot: slot, at: time.instant)
        outputs.append(.store(.touchMember(channel: channel.record.id, user: member.userID, lastSeen: time.date)))
    }
}
