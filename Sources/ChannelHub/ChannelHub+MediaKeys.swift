import ChannelProtocol
import Foundation

/// The keys bursts are sealed with (docs/protocol.md §16.4.5). The talker seals each frame once with
/// its burst's key (SFrame), and the relay forwards the same bytes to every listener: the server
/// hands out the keys, so only members who may hear a burst can open it, and a member who leaves or
/// loses the right to listen mid-burst gets no key for what follows.
extension ChannelHub {
    /// A new key for `recording`'s burst, sent to every connected member who may hear it and, with
    /// `toTalker`, to the talker (a grant sends the talker its key itself, just before the grant).
    /// A burst keeps its newest `maxKeysPerBurst` keys: the relay takes frames under any of them.
    func newMediaKey(_ channel: ChannelState, for recording: BurstRecording, toTalker: Bool) {
        let key = MediaKey(slot: recording.talker, burst: recording.burst, keyID: nextMediaKeyID, key: configuration.newMediaKey())
        nextMediaKeyID = nextMediaKeyID == MediaKey.maxKeyID ? 1 : nextMediaKeyID + 1
        recording.keys.append(key)
        if recording.keys.count > Self.maxKeysPerBurst { recording.keys.removeFirst() }
        counters.mediaKeys &+= 1
        var links = channel.keyHolders(except: recording.talker)
        if toTalker, let talker = channel.members[recording.talker]?.link { links.append(talker) }
        if !links.isEmpty { outputs.append(.send(.mediaKey(key), to: links)) }
    }

    /// Keys a burst keeps (one per member who left during it, at most).
    static let maxKeysPerBurst = 16

    /// Every key of `recording`'s burst, to one member (one catching up on it, or its talker back).
    func sendMediaKeys(of recording: BurstRecording, to link: Link) {
        for key in recording.keys { outputs.append(.send(.mediaKey(key), to: [link])) }
    }

    /// A member joined (or came back): the keys of every burst going on, its own included (a talker
    /// back within its grace seals on with them), unless it may not listen. Ended bursts' keys come
    /// with their catch-up.
    func sendLiveMediaKeys(_ channel: ChannelState, to slot: UInt16, link: Link) {
        guard let member = channel.members[slot] else { return }
        for recording in channel.recordings where !recording.ended && (member.canListen || recording.talker == slot) {
            sendMediaKeys(of: recording, to: link)
        }
        if member.canListen { channel.keyHoldersTold.insert(slot) }
    }

    /// After who may hear changed. If a member who held keys no longer may (it left, was removed,
    /// lost the right to listen), every burst going on gets a new key, sent to those who still may.
    /// A disconnection changes nothing: the member stays one, and gets the keys again when it is
    /// back. A member who newly may hear (gained the right) gets the keys of the bursts going on.
    func keysFollowHearing(_ channel: ChannelState) {
        let holders = channel.keyHolderSlots
        defer { channel.keyHoldersTold = holders }
        let live = channel.recordings.filter { !$0.ended }
        guard !live.isEmpty else { return }
        if !channel.keyHoldersTold.isSubset(of: holders) {
            for recording in live { newMediaKey(channel, for: recording, toTalker: true) }
        }
        for slot in holders.subtracting(channel.keyHoldersTold) {
            guard let link = channel.members[slot]?.link else { continue }
            for recording in live where recording.talker != slot { sendMediaKeys(of: recording, to: link) }
        }
    }
}

extension ChannelState {
    /// The members who may hold a burst's keys: those allowed to listen, connected or not.
    var keyHolderSlots: Set<UInt16> {
        Set(members.values.lazy.filter(\.canListen).map(\.slot))
    }

    func keyHolders(except slot: UInt16) -> [Link] {
        members.values.compactMap { $0.canListen && $0.slot != slot ? $0.link : nil }
    }
}
