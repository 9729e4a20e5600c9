import ChannelProtocol
import ChannelStore
import FloorControl
import Foundation
import Wire

extension ChannelHub {
    func startCatchUp(_ channel: ChannelState, slot: UInt16, at time: HubTime) {
        var cursors: [CatchUpCursor] = []
        guard let joiner = channel.members[slot] else { return }
        var released = false
        for recording in channel.recordings where recording.talker != slot {
            // A burst still going is replayed to anyone who joins; one that ended, only to a member
            // who missed it, once. Both from the first packet, in the order they started.
            let owed = recording.forgetMissed(slot)
            released = released || (owed && recording.missed.isEmpty)
            guard !recording.ended || owed else { continue }
            if let talker = channel.members[recording.talker], !joiner.hears(talker) { continue }
            if recording.ended { counters.missedBurstReplays += 1 }
            recording.readers += 1
            cursors.append(CatchUpCursor(recording: recording, next: 0))
            // A burst going on: its keys went with the join (`sendLiveMediaKeys`).
            if recording.ended, let link = joiner.link { sendMediaKeys(of: recording, to: link) }
        }
        if released { channel.recycleRecordings() }
        guard !cursors.isEmpty else { return }
        channel.members[slot]?.catchUp = cursors
        catchingUp.add(channel, slot: slot, now: time.instant)
    }

    /// A burst that starts while members are still being replayed earlier ones: they are off the
    /// live fan-out until their replay ends, so without a cursor of their own they would miss its
    /// start. They get it from its first packet, after what they are being replayed.
    func addToCatchUps(_ channel: ChannelState, talker slot: UInt16) {
        guard !catchingUp.isEmpty, let talker = channel.members[slot], let recording = channel.recording(of: slot) else { return }
        for entry in catchingUp where entry.channel === channel && entry.slot != slot {
            guard let listener = channel.members[entry.slot], !listener.catchUp.isEmpty, listener.hears(talker) else { continue }
            recording.readers += 1
            channel.members[entry.slot]?.catchUp.append(CatchUpCursor(recording: recording, next: 0))
        }
    }

    /// A burst starts: the members who will hear it but aren't there to (no connection, or one gone
    /// silent) are owed it if they join soon enough after it ends (`missedBurstWindow`).
    func noteMissing(_ channel: ChannelState, talker slot: UInt16, at time: HubTime) {
        guard configuration.missedBurstWindow > 0, let talker = channel.members[slot],
              let recording = channel.recording(of: slot) else { return }
        for member in channel.members.values where member.slot != slot && member.hears(talker) && member.connection != .connected {
            // Only members who may be back within the window: woken by this burst's push, dropped
            // moments ago, or silent. One offline for long without a token won't, and noting it
            // would keep nearly every burst for 30 s.
            if member.link != nil || member.connection == .reconnecting || mayBeWoken(member, at: time) {
                recording.missed.insert(member.slot)
            }
        }
        // Its deadline is noted when it ends (`keepUntil` counts from the end).
    }

    /// Whether a burst's start wakes this offline member by push: the member has a push token of a
    /// kind the server delivers (one stored before kinds were recorded is Apple's), and the
    /// participant token it last joined with expired no more than `wakeAfterTokenExpiry` ago.
    func mayBeWoken(_ member: Member, at time: HubTime) -> Bool {
        guard member.pushToken != nil, configuration.pushKinds.contains(member.pushEnvironment ?? .production) else { return false }
        guard let token = member.token else { return true }
        return time.date.timeIntervalSince(token.expiresAt) <= configuration.wakeAfterTokenExpiry
    }

    /// Lets go of ended bursts kept past the window for members who missed them.
    func missedBurstsExpire(at time: HubTime) {
        nextMissedExpiry = nil
        for channel in channels.values where !channel.recordings.isEmpty {
            channel.expireMissedBursts(now: time.instant)
            for recording in channel.recordings { noteMissedDeadline(recording) }
        }
    }

    /// Keeps `nextMissedExpiry` no later than when `recording` stops being kept, so that the timer
    /// needn't look through every recording to know.
    func noteMissedDeadline(_ recording: BurstRecording) {
        // A burst still going is kept at least until its end plus the window: its end notes the time.
        guard !recording.missed.isEmpty, let due = recording.keepUntil else { return }
        nextMissedExpiry = nextMissedExpiry.map { min($0, due) } ?? due
    }

    /// A member drops out (its connection closed or went silent): it is owed the bursts still going,
    /// and those it was being replayed, from their start when it joins again.
    func owe(_ channel: ChannelState, slot: UInt16, replaying cursors: [CatchUpCursor], at now: WireInstant) {
        guard configuration.missedBurstWindow > 0, let member = channel.members[slot] else { return }
        for recording in channel.recordings where recording.talker != slot && !recording.missed.contains(slot) {
            let replaying = cursors.contains { $0.recording === recording }
            guard replaying || !recording.ended else { continue }
            if !replaying, let talker = channel.members[recording.talker], !member.hears(talker) { continue }
            recording.missed.insert(slot)
            // A replay cut off late in the window (a long burst, replayed at 20 times real time)
            // gets the member the whole window again to come back; at most twice the window from
            // the end, or a member dropping again and again would keep it for good.
            if recording.ended, let ended = recording.endedAt {
                let limit = ended + 2 * configuration.missedBurstWindow
                recording.keepUntil = min(limit, max(recording.keepUntil ?? now, now + configuration.missedBurstWindow))
            }
            noteMissedDeadline(recording)
        }
    }

    /// A member being replayed bursts unsubscribed from some talkers (its first message after a join
    /// or a resume, often): their bursts are not replayed to it any more.
    func dropUnheardCatchUps(_ channel: ChannelState, slot: UInt16) {
        guard let listener = channel.members[slot], !listener.catchUp.isEmpty else { return }
        var kept: [CatchUpCursor] = []
        for cursor in listener.catchUp {
            if let talker = channel.members[cursor.recording.talker], !listener.hears(talker) {
                cursor.recording.readers -= 1
            } else {
                kept.append(cursor)
            }
        }
        guard kept.count != listener.catchUp.count else { return }
        channel.members[slot]?.catchUp = kept
        channel.recycleRecordings()
    }

    /// Ends a member's replay. A burst already over that only it was reading goes back to the spares
    /// now: on a quiet channel no later burst would recycle it, and it may hold megabytes.
    func stopCatchUp(_ member: inout Member, in channel: ChannelState) {
        guard !member.catchUp.isEmpty else { return }
        for cursor in member.catchUp { cursor.recording.readers -= 1 }
        member.catchUp.removeAll()
        channel.recycleRecordings()
    }

    /// Sends each late joiner its next catch-up packets; a joiner that reached the live edge of every
    /// recording goes back on the live fan-out list.
    func serveCatchUp(at time: HubTime, send: (UnsafeRawBufferPointer, Link) -> Bool) {
        var index = 0
        while index < catchingUp.count {
            let channel = catchingUp[index].channel, slot = catchingUp[index].slot
            guard var member = channel.members[slot], let link = member.link, !member.catchUp.isEmpty else {
                catchingUp.remove(at: index)
                continue
            }
            if member.mediaHeld {  // its handshake is not done: nothing sent would arrive
                index += 1
                continue
            }
            var budget = member.catchUp.allSatisfy({ $0.next == 0 }) ? configuration.catchUpInitialPackets
                                                                      : configuration.catchUpPacketsPerTick
            // Strictly in order: a later cursor is served only once every earlier one is at its end.
            // A cursor at the live edge of a burst still going is kept (and sent that burst's new
            // packets on later ticks) until every cursor is there: only then does the fan-out take
            // over, so neither a burst granted during the replay (empty until its first packet) nor
            // one already caught up with loses packets while the others are replayed.
            var cursorIndex = 0
            while cursorIndex < member.catchUp.count {
                let recording = member.catchUp[cursorIndex].recording
                while budget > 0, member.catchUp[cursorIndex].next < recording.count {
                    let length = recording.write(member.catchUp[cursorIndex].next, into: scratch)
                    if send(UnsafeRawBufferPointer(rebasing: scratch[..<length]), link) {
                        counters.catchUpPacketsOut &+= 1
                        counters.catchUpBytesOut &+= length
                    } else {
                        drop(.sendFailed)
                    }
                    member.catchUp[cursorIndex].next += 1
                    budget -= 1
                }
                if member.catchUp[cursorIndex].next < recording.count { break }
                if recording.ended {
                    recording.readers -= 1
                    member.catchUp.remove(at: cursorIndex)
                } else {
                    cursorIndex += 1
                }
            }
            if member.catchUp.allSatisfy({ $0.next >= $0.recording.count && !$0.recording.ended }) {
                for cursor in member.catchUp { cursor.recording.readers -= 1 }
                member.catchUp.removeAll()
            }
            channel.members[slot] = member
            if member.catchUp.isEmpty {
                catchingUp.remove(at: index)
                listenersChanged(channel)
                channel.recycleRecordings()
            } else {
                index += 1
            }
        }
        catchingUp.ticked(at: time.instant, interval: configuration.catchUpInterval)
    }

    /// A member heard again on the same session (a phone back from the background, resuming its
    /// connection rather than joining again) gets the bursts it was noted missing while silent, from
    /// their first packet, as a join would have. What reached it live meanwhile comes again, flagged
    /// catch-up, and the client drops what it already has.
    @discardableResult
    func replayOwed(_ channel: ChannelState, slot: UInt16, at time: HubTime, rebuild: Bool = true) -> Bool {
        guard let member = channel.members[slot], member.canListen, member.catchUp.isEmpty,
              channel.recordings.contains(where: { $0.missed.contains(slot) }) else { return false }
        startCatchUp(channel, slot: slot, at: time)
        if rebuild { listenersChanged(channel) }
        return true
    }
}
