import PTTClient
import TerminalUI

/// --suspend-after: the voice connection closes after a quiet spell, as a phone suspends a
/// push-to-talk app, and a push opens it again for the next call (`IdleSuspension`).
extension Interactive.Loop {
    func sleepWhenIdle(time: UInt64) {
        guard var timer = idle else { return }
        let requesting = shared.withLockedValue { $0.requesting || $0.buttonDown }
        // Reconnecting (not joined, not suspended) is no quiet: sleeping then would look like a fault.
        let busy = manager.isTransmitting || manager.activeRemoteParticipant != nil || requesting
            || keyboard.holdToTalk.transmitting || (!manager.isJoined && !manager.isSuspended)
        if timer.tick(now: time, busy: busy, suspended: manager.isSuspended, wakeable: manager.canBeWokenByPush) {
            manager.suspend()
            let seconds = Int((Double(timer.after) / 1e9).rounded())
            shared.withLockedValue { $0.status = .init("Asleep after \(seconds) s of quiet: a push wakes walkie when someone talks") }
        }
        idle = timer
    }
}
