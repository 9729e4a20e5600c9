import ChannelProtocol
import ChannelStore
import FloorControl
import Foundation
import Wire

/// One member of a live channel: who it is (from its token), how it is connected, and what it is doing.
struct Member {
    var slot: UInt16
    var userID: String
    var name: String
    var role: String?
    var priority: UInt8
    var canTalk: Bool
    var canListen: Bool
    var joinedAt: Date
    var link: Link?
    var connection: ConnectionState
    /// While `.reconnecting`: when the member counts as offline.
    var reconnectingUntil: WireInstant?
    /// While its connection is open but silent (the liveness sweep marked it): since when, for
    /// `HubConfiguration.silentOffline`.
    var silentSince: WireInstant?
    var talking = false
    var muted = false
    /// The number of the newest `floorRequest` from this member (nil: it sent none, or an unnumbered
    /// one). Every answer about its place at the floor names it, including a grant from the queue
    /// long after the request, so that its client tells them from the answers to requests it withdrew.
    var floorRequest: UInt32?
    /// When the member was last connected, as far as this server knows: stored, or the last join
    /// or close here (nil: connected since the server started, not yet closed).
    var lastSeen: Date?
    var pushToken: String?
    var pushEnvironment: PushEnvironment?
    var pushRegisteredAt: Date?
    /// When this server last wrote the token to the store (nil: not since it started).
    var pushTokenWrittenAt: Date?
    /// Bursts this member is being replayed; it gets no live audio until they are done.
    var catchUp: [CatchUpCursor] = []
    /// When the current burst started (wall clock), for the transmission log.
    var burstStartedAt: Date?
    /// When the current burst's length was last written to the log (`ChannelHub.logBurstProgress`).
    var burstProgressAt: Date?
    /// User ids this member chose not to hear (`setSubscriptions`).
    var unheard: Set<String> = []
    /// The token it last joined with, so that revoking that token, or removing the member from another
    /// process, reaches its session, or its stored membership while it is offline. Nil only for members
    /// stored before the store kept tokens (schema v3) that have not joined since.
    var token: (id: String, issuedAt: Date, expiresAt: Date)?
    /// What is left of the member's audio budget when its last burst ended. The next burst starts
    /// from it (refilled for the time between), so releasing and requesting the floor again doesn't
    /// buy a full bucket.
    var audioPace: TokenBucket?
    /// The share of audio (percent) this member last reported missing (`receptionReport`), this session.
    var receptionLoss = 0
    /// The worst listener loss this member was last told while talking (`receptionLoss`), this session.
    var listenerLossTold = 0

    /// Whether this member takes audio from `talker` at all: it may listen and has not unsubscribed.
    func hears(_ talker: Member) -> Bool { canListen && !unheard.contains(talker.userID) }

    var participant: Participant {
        Participant(slot: slot, userID: userID, name: name, role: role, priority: priority, canTalk: canTalk,
                    canListen: canListen, connection: connection, talking: talking, muted: muted)
    }

    func record(channel: UUID, lastSeen: Date) -> MemberRecord {
        MemberRecord(channelID: channel, userID: userID, displayName: name, joinedAt: joinedAt, lastSeen: lastSeen,
                     pushToken: pushToken, pushEnvironment: pushEnvironment, pushRegisteredAt: pushRegisteredAt,
                     grant: token.map { MemberGrant(canTalk: canTalk, canListen: canListen, role: role, priority: priority,
                                                    tokenID: $0.id, tokenIssuedAt: $0.issuedAt, tokenExpiresAt: $0.expiresAt) },
                     unheard: unheard.sorted())
    }
}

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
    /// Finished recordings, kept for their buffers' capacity.
    var spareRecordings: [BurstRecording] = []
    /// A recycled recording holding more than this gives its memory back.
    let spareRecordingCapacity: Int
    /// Why a talker's burst is ending, noted from `revoked` for the `ended` event that follows.
    var endReasons: [UInt16: String] = [:]

    init(record: ChannelRecord, configuration: HubConfiguration) {
        self.record = record
        spareRecordingCapacity = configuration.spareRecordingCapacity
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

    func links(except slot: UInt16) -> [Link] { members.values.compactMap { $0.slot == slot ? nil : $0.link } }

    var roster: [Participant] { members.values.map(\.participant).sorted { $0.slot < $1.slot } }

    var talkers: [Talker] {
        floor.currentTalkers.compactMap { slot in floor.burst(of: slot).map { Talker(slot: slot, burst: UInt16(truncatingIfNeeded: $0)) } }
    }

    func rebuildListeners() {
        listeners.removeAll(keepingCapacity: true)
        for member in members.values where member.canListen && member.catchUp.isEmpty {
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
