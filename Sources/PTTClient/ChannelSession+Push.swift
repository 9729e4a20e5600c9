import ChannelProtocol
import Foundation

/// Pushes: the app's answer to a `pushtotalk` push, and the push token the server wakes this device with.
extension ChannelSession {
    /// The delegate's answer to a `pushtotalk` push.
    /// - Parameter serverLeave: the push is squelchd's leave push (a removal, a deleted channel).
    mutating func pushResult(_ result: PushResult, _ uuid: UUID, serverLeave: Bool = false) {
        guard channel == uuid else { return }
        switch result {
        case .leaveChannel:
            leave(uuid, reason: serverLeave ? .systemPolicy : .developerRequest)
        case .activeRemoteParticipant where token.isExpired:
            // Nothing can be heard until a new token comes: no speaker shown, no audio held.
            outputs.append(.event(.notice("a push says someone is talking, but the participant token expired; renewToken to hear the channel")))
        case .activeRemoteParticipant where link == .joined:
            // A push late from APNs (or held by the server's push schedule) for a burst this joined
            // client already hears live, or that already ended: the live floor state is the truth,
            // and a speaker shown from the push would stay after the burst's `ended`, which clears
            // only live talkers.
            break
        case .activeRemoteParticipant(let participant):
            showRemote(participant)
            if link == .suspended || link == .down { connect() }  // not while the token is expired: see `connect`
        }
    }

    mutating func pushTokenIssued(_ token: Data, for uuid: UUID) {
        guard channel == uuid, pushToken != token else { return }
        pushToken = token
        // On disk before the app hears of it: a crash right after the callback still restores this token.
        saveRecord()
        emit(.receivedPushToken(token))
        if link == .joined { registerToken() }
    }

    mutating func registerToken() {
        guard let pushToken else { return }
        outputs.append(.send(.registerPushToken(token: pushToken.map { String(format: "%02x", $0) }.joined(), environment: pushEnvironment)))
    }
}
