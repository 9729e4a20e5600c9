import ChannelProtocol
import ChannelStore
import FloorControl
import Foundation
import Wire

extension ChannelHub {
    /// Runs each channel's floor timers that are due (maximum burst, disconnect grace, silence).
    func floorTimersDue(at time: HubTime) {
        for channel in channels.values {
            if let due = channel.floor.nextDeadline, due <= time.instant.nanoseconds {
                channel.floor.handleTimeout(now: time.instant.nanoseconds)
                applyFloorEvents(channel, at: time)
            }
        }
    }

    func applyFloorEvents(_ channel: ChannelState, at time: HubTime) {
        var granted = false
        defer { if granted { updateListenerLoss(channel) } }
        for event in channel.floor.takeEvents() {
            switch event {
            case .granted(let slot, let burst, let until):
                let burst16 = UInt16(truncatingIfNeeded: burst)
                counters.floorGrants += 1
                counters.bursts += 1
                channel.members[slot]?.talking = true
                channel.members[slot]?.burstStartedAt = time.date
                // Logged as it starts, so that a crash during it leaves it in the log (`interrupted`
                // at the next start); its end replaces this record.
                if let member = channel.members[slot] {
                    outputs.append(.store(.logTransmission(TransmissionRecord(
                        channelID: channel.record.id, userID: member.userID, startedAt: time.date,
                        durationMilliseconds: 0, endReason: TransmissionRecord.inProgress))))
                }
                let pace = channel.members[slot]?.audioPace
                    ?? TokenBucket(tokens: Double(configuration.audioPacketBurst), refilledAt: time.instant)
                channel.startRecording(talker: slot, burst: burst16, pace: pace)
                // The burst's key goes before anything that announces the burst; the talker's goes
                // with its grant (`sendGrant`).
                if let recording = channel.recording(of: slot) { newMediaKey(channel, for: recording, toTalker: false) }
                noteMissing(channel, talker: slot, at: time)
                addToCatchUps(channel, talker: slot)
                sendGrant(channel, slot: slot, burst: burst16, until: until, at: time)
                chargeGrant(channel, slot: slot, at: time.instant)
                granted = true
            case .confirmed(let slot, let burst, let until):
                sendGrant(channel, slot: slot, burst: UInt16(truncatingIfNeeded: burst), until: until, at: time)
                granted = true
            case .taken(let slot, let burst, _):
                guard channel.members[slot] != nil else { break }
                outputs.append(.send(.floor(FloorEvent(kind: .taken, slot: slot, burst: UInt16(truncatingIfNeeded: burst))),
                                     to: channel.links(except: slot)))
                announce(channel, slot: slot, at: time.instant)
                // Its wake pushes wait for its first audio (`wakeListeners`).
                if configuration.wakesByPush { channel.recording(of: slot)?.wakeOwed = time }
            case .denied(let slot, let reason):
                counters.floorDenials += 1
                let cause: FloorCause
                let text: String
                switch reason {
                case .busy: cause = .busy; text = "someone else is talking"
                case .listenOnly: cause = .notAllowed; text = "your token allows listening only"
                case .queueFull: cause = .queueFull; text = "too many members are waiting to talk"
                case .outranked: cause = .queueFull; text = "your place in the full queue went to a member with a higher priority"
                }
                if let member = channel.members[slot], let link = member.link {
                    outputs.append(.send(.floor(FloorEvent(kind: .denied, slot: slot, cause: cause, reason: text,
                                                           request: member.floorRequest)), to: [link]))
                }
            case .queued(let slot, let position):
                if let member = channel.members[slot], let link = member.link {
                    outputs.append(.send(.floor(FloorEvent(kind: .queued, slot: slot, position: position,
                                                           request: member.floorRequest)), to: [link]))
                }
            case .revoked(let slot, let reason):
                counters.floorRevocations += 1
                let cause: FloorCause
                let text: String
                switch reason {
                case .preempted(let by, _):
                    cause = .preempted
                    text = "\(channel.members[by]?.name ?? "someone") has priority"
                    channel.endReasons[slot] = "preempted"
                case .maxBurstReached:
                    cause = .maxBurstReached
                    text = "the maximum talk time of \(channel.record.maxBurstSeconds) s was reached"
                    channel.endReasons[slot] = "maxBurst"
                case .disconnected:
                    cause = .disconnected
                    text = "the connection was lost"
                    channel.endReasons[slot] = "disconnected"
                case .notAllowed:
                    cause = .notAllowed
                    text = "your new participant token allows listening only"
                    channel.endReasons[slot] = "notAllowed"
                case .channelChanged:
                    cause = .channelChanged
                    text = "the channel was switched to \(channel.record.mode == .halfDuplex ? "half duplex" : "fewer simultaneous talkers"); someone else kept the floor"
                    channel.endReasons[slot] = "channelChanged"
                case .silent:
                    // The wire's `disconnected`: to the talker (if it still hears us) the outcome is the
                    // same, and a client that predates `silent` understands it.
                    cause = .disconnected
                    text = "no audio arrived from you for \((configuration.talkerSilenceLimit / 1_000_000_000).formatted()) s"
                    channel.endReasons[slot] = "silent"
                }
                if let link = channel.members[slot]?.link {
                    outputs.append(.send(.floor(FloorEvent(kind: .revoked, slot: slot, cause: cause, reason: text)), to: [link]))
                }
            case .ended(let slot, let burst, _):
                let reason = channel.endReasons.removeValue(forKey: slot) ?? "released"
                logBurstEnd(channel, slot: slot, reason: reason, at: time)
                if let ended = channel.endRecording(talker: slot, at: time.instant, keepAtMost: configuration.maxMissedBursts,
                                                    window: configuration.missedBurstWindow) {
                    noteMissedDeadline(ended)
                }
                outputs.append(.send(.floor(FloorEvent(kind: .ended, slot: slot, burst: UInt16(truncatingIfNeeded: burst))),
                                     to: channel.connectedLinks))
                if var member = channel.members[slot] {
                    member.talking = false
                    member.burstStartedAt = nil
                    member.burstProgressAt = nil
                    channel.members[slot] = member
                    announce(channel, slot: slot, at: time.instant)
                }
            case .idle:
                outputs.append(.send(.floor(FloorEvent(kind: .idle)), to: channel.connectedLinks))
            }
        }
    }

    /// Who hears whom changed (a member came, went, changed rights or subscriptions): the relay's list
    /// is rebuilt, and talkers learn their listeners' worst loss if that moved.
    func listenersChanged(_ channel: ChannelState) {
        channel.rebuildListeners()
        keysFollowHearing(channel)
        updateListenerLoss(channel)
    }

    /// Tells each talker the worst loss reported by the connected members who hear it, where that
    /// differs from what it was last told. The talker's encoder adds FEC from it (docs/protocol.md
    /// §16.4.4), so one listener on a bad link is enough: FEC is for the worst link, and costs the
    /// others only a little of the clean quality. O(members × talkers), on reports and membership
    /// changes only, never per packet.
    func updateListenerLoss(_ channel: ChannelState) {
        for talker in channel.floor.currentTalkers {
            guard let member = channel.members[talker], let link = member.link else { continue }
            var worst = 0
            for other in channel.members.values where other.slot != talker && other.link != nil && other.hears(member) {
                worst = max(worst, other.receptionLoss)
            }
            guard worst != member.listenerLossTold else { continue }
            channel.members[talker]?.listenerLossTold = worst
            outputs.append(.send(.receptionLoss(lossPercent: worst), to: [link]))
        }
    }

    /// `granted` to the talker. `maxBurstSeconds` is the time left until the burst is revoked for
    /// length (TS 24.380's Floor Granted carries T2's remaining time): the whole limit for a new
    /// burst, less for a grant repeated to a member that already talks (a repeated request, a rejoin).
    func sendGrant(_ channel: ChannelState, slot: UInt16, burst: UInt16, until: UInt64?, at time: HubTime) {
        guard let member = channel.members[slot], let link = member.link else { return }
        // The key to seal with, first (again, on a talker's reconnection: its new session has none).
        if let recording = channel.recording(of: slot) { sendMediaKeys(of: recording, to: link) }
        let now = time.instant.nanoseconds
        let left = until.map { $0 > now ? Int(($0 - now + 999_999_999) / 1_000_000_000) : 0 } ?? channel.record.maxBurstSeconds
        outputs.append(.send(.floor(FloorEvent(kind: .granted, slot: slot, burst: burst, maxBurstSeconds: left,
                                               request: member.floorRequest)), to: [link]))
    }

    /// Writes the length so far of every burst going on: a second after it started, then every
    /// `burstProgressInterval` (the driver calls it about once a second). The record stays
    /// `inProgress`; its end replaces it. Without it, a burst the server was killed during stayed in
    /// the log with a length of 0 (`interrupted` at the next start), as if it had never been heard;
    /// the first write comes early because most bursts are over in a few seconds.
    public func logBurstProgress(at time: HubTime) {
        let interval = Double(configuration.burstProgressInterval) / 1e9
        guard interval > 0 else { return }
        for channel in channels.values {
            for slot in channel.floor.currentTalkers {
                guard let member = channel.members[slot], let started = member.burstStartedAt else { continue }
                let due = (member.burstProgressAt ?? started).addingTimeInterval(interval)
                guard time.date >= due else { continue }
                channel.members[slot]?.burstProgressAt = time.date
                outputs.append(.store(.logTransmission(TransmissionRecord(
                    channelID: channel.record.id, userID: member.userID, startedAt: started,
                    durationMilliseconds: max(1, Int(time.date.timeIntervalSince(started) * 1000)),
                    endReason: TransmissionRecord.inProgress))))
            }
        }
    }

    func logBurstEnd(_ channel: ChannelState, slot: UInt16, reason: String, at time: HubTime) {
        guard let member = channel.members[slot], let started = member.burstStartedAt else { return }
        channel.members[slot]?.burstStartedAt = nil
        channel.members[slot]?.burstProgressAt = nil
        // A burst ended for silence or a lost connection was over before the floor noticed: the
        // log's length ends at the last audio (or the disconnect), not after the wait that found it.
        let noticedAfter: UInt64 = switch reason {
        case "silent": configuration.talkerSilenceLimit
        case "disconnected": configuration.disconnectGrace
        default: 0
        }
        let milliseconds = max(0, Int(time.date.timeIntervalSince(started) * 1000) - Int(noticedAfter / 1_000_000))
        outputs.append(.store(.logTransmission(TransmissionRecord(
            channelID: channel.record.id, userID: member.userID, startedAt: started,
            durationMilliseconds: milliseconds, endReason: reason))))
    }
}
