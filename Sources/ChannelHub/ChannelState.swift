import ChannelProtocol
import ChannelStore
import FloorControl
import Foundation
import Wire

/// The live state of one channel. A class, so that a session can point at its channel and the relay
/// finds it without a lookup.
final class ChannelState {
    var record: ChannelRecord
    var floor: FloorArbiter<UInt16>
    var members: [UInt16: Member] = [:]
    var slotsByUser: [String: UInt16] = [:]
    var nextSlot: UInt16 = 1
    /// Connected members who may listen and are not catching up: the relay's fan-out list, rebuilt
    /// whenever membership changes (rare) so that forwarding a packet is one pass over an array.
    /// `unheard` holds the slots of talkers the listener unsubscribed from; it is empty for nearly
    /// everyone, so the per-packet check is one `isEmpty` in the common case.
    var listeners: [(link: Link, slot: UInt16, unheard: [UInt16])] = []
    /// Recordings of bursts in progress (and ended ones still being replayed), by talker.
    var recordings: [BurstRecording] = []
    /// The members who held the media keys at the last change of who hears (`keysFollowHearing`).
    var keyHoldersTold: Set<UInt16> = []
    /// Finished recordings, kept for their buffers' capacity.
    var spareRecordings: [BurstRecording] = []
    /// A recycled recording holding more than this gives its memory back.
    let spareRecordingCapacity: Int
    /// Why a talker's burst is ending, noted from `revoked` for the `ended` event that follows.
    var endReasons: [UInt16: String] = [:]
    /// Until when this node may serve the channel (ChannelHub+Tenure.swift).
    var tenure: Tenure

    init(record: ChannelRecord, configuration: HubConfiguration) {
        self.record = record
        spareRecordingCapacity = configuration.spareRecordingCapacity
        tenure = configuration.clustered ? .until(WireInstant(nanoseconds: 0)) : .unlimited
        floor = FloorArbiter(configuration: Self.floorConfiguration(record, configuration), firstBurst: configuration.firstBurst(record.id))
    }

    static func floorConfiguration(_ record: ChannelRecord, _ configuration: HubConfiguration) -> FloorArbiter<UInt16>.Configuration {
        FloorArbiter<UInt16>.Configuration(
            maxTalkers: record.mode == .halfDuplex ? 1 : configuration.fullDuplexMaxTalkers,
            maxBurst: UInt64(record.maxBurstSeconds) * 1_000_000_000,
            disconnectGrace: configuration.disconnectGrace,
            maxQueue: configuration.maxQueue,
            silenceLimit: configuration.talkerSilenceLimit,
            firstAudioLimit: configuration.talkerFirstAudioLimit)
    }

    var info: ChannelInfo {
        ChannelInfo(id: record.id, name: record.name, image: record.image, mode: record.mode,
                    maxBurstSeconds: record.maxBurstSeconds)
    }

    var connectedLinks: [Link] { members.values.compactMap(\.link) }

    /// The member in `slot`, which the caller has just found there (or put there) on this event
    /// loop: every change to a slot happens here, so it cannot have emptied since. The one place
    /// the hub reads a slot it knows is filled; elsewhere `members[slot]` stays an optional.
    func member(_ slot: UInt16) -> Member {
        guard let member = members[slot] else { preconditionFailure("slot \(slot) of channel \(record.id) is empty") }
        return member
    }

    func links(except slot: UInt16) -> [Link] { members.values.compactMap { $0.slot == slot ? nil : $0.link } }

    var roster: [RosterMember] { members.values.map(\.participant).sorted { $0.slot < $1.slot } }

    var talkers: [Talker] {
        floor.currentTalkers.compactMap { slot in floor.burst(of: slot).map { Talker(slot: slot, burst: UInt16(truncatingIfNeeded: $0)) } }
    }

    func rebuildListeners() {
        listeners.removeAll(keepingCapacity: true)
        for member in members.values where member.canListen && member.catchUp.isEmpty && !member.mediaHeld {
            guard let link = member.link else { continue }
            listeners.append((link, member.slot, member.unheard.compactMap { slotsByUser[$0] }))
        }
    }

    func recording(of talker: UInt16) -> BurstRecording? {
        for recording in recordings where recording.talker == talker && !recording.ended { return recording }
        return nil
    }

    func startRecording(talker: UInt16, burst: UInt16, pace: TokenBucket) {
        let recording = spareRecordings.popLast() ?? BurstRecording()
        recording.start(talker: talker, burst: burst, pace: pace)
        recordings.append(recording)
    }

    /// Ends `talker`'s recording; returns it if it is kept for members who missed it.
    func endRecording(talker: UInt16, at now: WireInstant, keepAtMost: Int, window: UInt64) -> BurstRecording? {
        let ended = recording(of: talker)
        if let ended {
            members[talker]?.audioPace = ended.pace
            ended.end(at: now)
            ended.keepUntil = now + window
        }
        // Ended bursts kept for members who missed them: the oldest go first past the limit.
        var kept = recordings.filter { $0.ended && !$0.missed.isEmpty }
        while kept.count > keepAtMost { kept.removeFirst().missed.removeAll() }
        recycleRecordings()
        return ended.flatMap { $0.missed.isEmpty ? nil : $0 }
    }

    /// Lets go of ended bursts kept past the window for members who missed them.
    func expireMissedBursts(now: WireInstant) {
        var expired = false
        for recording in recordings where recording.ended && !recording.missed.isEmpty {
            if let until = recording.keepUntil, until <= now {
                recording.missed.removeAll()
                expired = true
            }
        }
        if expired { recycleRecordings() }
    }

    /// Returns ended recordings nobody reads, or is owed, any more to the spare list.
    func recycleRecordings() {
        var index = 0
        while index < recordings.count {
            if recordings[index].ended && recordings[index].readers == 0 && recordings[index].missed.isEmpty {
                let spare = recordings.remove(at: index)
                if spare.capacityBytes > spareRecordingCapacity { spare.releaseStorage() }
                spareRecordings.append(spare)
            } else {
                index += 1
            }
        }
    }
}
