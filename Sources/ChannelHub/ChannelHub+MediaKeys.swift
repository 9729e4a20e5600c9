import ChannelProtocol
import Foundation

/// The keys bursts are sealed with (docs/protocol.md §16.4.5). The talker seals each frame once with
/// its burst's key (SFrame), and the relay forwards the same bytes to every listener: the server
/// hands out the keys, so only members who may hear a burst can open it, and a member who leaves or
/// loses the right to listen mid-burst gets no key for what follows.
extension ChannelHub {
    /// A new key for `recording`'s burst, sent to every connected member who may hear it and, with
    /// `toTalker`, to the talker (a grant sends the talker its key itself, just before the grant).
    func newMediaKey(_ channel: ChannelState, for recording: BurstRecording, toTalker: Bool) {
        let key = MediaKey(slot: recording.talker, burst: recording.burst, keyID: nextMediaKeyID, key: configuration.newMediaKey())
        nextMediaKeyID = nextMediaKeyID == MediaKey.maxKeyID ? 1 : nextMediaKeyID + 1
        recording.keys.append(key)
        counters.mediaKeys &+= 1
        var links = channel.keyHolders(except: recording.talker)
        if toTalker, let talker = channel.members[recording.talker]?.link { links.append(talker) }
        if !links.isEmpty { outputs.append(.send(.mediaKey(key), to: links)) }
    }

    /// Every key of `recording`'s burst, to one member (one catching up on it, or its talker back).
    func sendMediaKeys(of recording: BurstRecording, to link: Link) {
        for key in recording.keys { outputs.append(.send(.mediaKey(key), to: [link])) }
    }

    /// After who may hear changed. If any member who held keys no longer may (left, removed,
    /// disconnected, lost the right), every burst still going gets a new key, sent to those who
    /// still may. A member who newly may (joined, or gained the right) gets the keys of the bursts
    /// going on that it hears (a joiner also gets them with its catch-up; a repeat is ignored).
    func keysFollowHearing(_ channel: ChannelState) {
        let holders = channel.keyHolderSlots
        defer { channel.keyHoldersTold = holders }
        let live = channel.recordings.filter { !$0.ended }
        guard !live.isEmpty else { return }
        if !channel.keyHoldersTold.isSubset(of: holders) {
            for recording in live { newMediaKey(channel, for: recording, toTalker: true) }
            return
        }
        for slot in holders.subtracting(channel.keyHoldersTold) {
            guard let member = channel.members[slot], let link = member.link else { continue }
            for recording in live where recording.talker != slot {
                if let talker = channel.members[recording.talker], !member.hears(talker) { continue }
                sendMediaKeys(of: recording, to: link)
            }
        }
    }
}

extension ChannelState {
    /// The members who get a burst's keys: connected and allowed to listen.
    var keyHolderSlots: Set<UInt16> {
        Set(members.values.lazy.filter { $0.canListen && $0.link != nil }.map(\.slot))
    }

    func keyHolders(except slot: UInt16) -> [Link] {
        members.values.compactMap { $0.canListen && $0.slot != slot ? $0.link : nil }
    }
}
