import Audio
import ChannelProtocol
import Foundation
import JitterBuffer
import NIOConcurrencyHelpers
import NIOCore
import Wire
import WireNIO

// Commands: what the app, the transport and the pushes ask, fed to the session in order.
extension ManagerEngine {
    func handle(_ command: Command) async {
        switch command {
        case .join(let uuid, let descriptor, let credentials):
            session.requestJoin(uuid, descriptor: descriptor, credentials: credentials, reason: .developerRequest)
            if session.channel == uuid { settleLeave(uuid, id: nil, .superseded) }
        case .restore(let record, let descriptor):
            let token = record.pushToken.map { Data($0) }
            session.requestJoin(record.channel, descriptor: descriptor, credentials: record.credentials, reason: .channelRestoration,
                                pushToken: token)
            // The device keeps the token it had: pushes sent while the app was dead still reach it.
            if let token, session.channel == record.channel { startPushes(token: token, channel: record.channel) }
            if session.channel == record.channel { settleLeave(record.channel, id: nil, .superseded) }
        case .leave(let uuid, let reason): session.leave(uuid, reason: reason)
        case .begin(let uuid, let source): session.beginTransmitting(uuid, source: source)
        case .stop(let uuid, let source): session.stopTransmitting(uuid, source: source)
        case .appState(let state): session.setAppState(state)
        case .systemCall(let active): session.setSystemCall(active: active)
        case .accessory(let pressed, let uuid): session.accessoryButton(pressed: pressed, uuid)
        case .suspend: session.suspend()
        case .resume: session.resume()
        case .setter(let body, let continuation):
            do {
                try body(&session)
                await perform()
                continuation.resume()
            } catch {
                await perform()
                continuation.resume(throwing: error)
            }
            return
        case .strategy(let strategy):
            self.strategy = strategy
            evaluateStrategy(all: true)
        case .refreshStrategy:
            evaluateStrategy(all: true)
        case .transportConnected(let g, let entered):
            guard g == generation else { return }
            session.transportConnected(entered: entered)
        case .transportFailed(let g, let message, let serverWentAway):
            guard g == generation else { return }
            session.transportFailed(message, serverWentAway: serverWentAway)
        case .transportReconnecting(let g):
            guard g == generation else { return }
            session.transportReconnecting()
        case .transportStalled(let g, let stalled):
            guard g == generation else { return }
            session.transportStalled(stalled)
        case .server(let g, let message):
            guard g == generation else { return }
            session.received(message)
            switch message {
            case .joined, .participant, .roster: evaluateStrategy(all: false)
            default: break
            }
        case .pushToken(let token, let uuid):
            session.pushTokenIssued(token, for: uuid)
        case .push(let push):
            handlePush(push)
        case .inputEnded(let burst):
            // Only the transmission the input was feeding: by now the app may have stopped it and
            // begun another, whose input is fresh.
            if configuration.audio.endTransmissionWhenInputEnds, let channel = session.channel,
               case .active(let source, burst) = session.transmit {
                session.stopTransmitting(channel, source: source)
            }
            eventSink.yield(.inputEnded)
        case .notice(let message):
            eventSink.yield(.notice(message))
        case .reconnectDue:
            session.reconnectDue()
        case .resyncDue:
            session.resyncDue()
        case .rosterSettleDue(let generation):
            session.rosterSettled(generation: generation)
        case .transmitWaitDue(let request):
            session.transmitWaitDue(request: request)
        case .playbackStopped:
            session.playbackStopped()
        case .playbackMuted(let muted):
            playbackMuted = muted
            receiver.setMuted(muted || session.callActive)
            session.setMuted(muted)
        case .receptionMeasured(let percent):
            session.receptionMeasured(percent)
        case .replayPlaying(let slot, let burst, let playing):
            if playing { session.replayStarted(slot: slot, burst: burst) } else { session.replayFinished(slot: slot, burst: burst) }
        case .leaveSettled(let channel, let id, let outcome):
            settleLeave(channel, id: id, outcome)
        }
        await perform()
    }

    func evaluateStrategy(all: Bool) {
        let entries = all ? session.rosterEntries.filter { !$0.isLocal } : session.undecidedEntries
        guard !entries.isEmpty || all else { return }
        var decisions = all ? [:] : session.decisions
        for entry in entries { decisions[entry.userID] = strategy.subscribeType(for: entry) }
        if decisions != session.decisions || all { session.applySubscriptions(decisions) }
    }

    func handlePush(_ push: IncomingPush) {
        // No channel, no wake: iOS drops pushtotalk pushes that arrive without an active channel.
        guard let channel = session.channel, let manager, let delegate else { return }
        // A push that names another channel was sent for one this device has left (it waited in
        // APNs, or in the command queue while the app left and joined another): answered now, its
        // speaker would show, or its leave be obeyed, in the wrong channel.
        if case .string(let named)? = push.payload["channel"], let other = UUID(uuidString: named), other != channel {
            eventSink.yield(.notice("ignored a push for channel \(other), which this device has left"))
            return
        }
        if push.isServiceUpdate {
            let remaining = serviceBudget.spend(highPriority: push.isHighPriority, at: push.receivedAt)
            delegate.incomingServiceUpdatePush(channelManager: manager, channelUUID: channel, pushPayload: push.payload,
                                               isHighPriority: push.isHighPriority, remainingHighPriorityBudget: remaining,
                                               completion: {})
            return
        }
        let result = delegate.incomingPushResult(channelManager: manager, channelUUID: channel, pushPayload: push.payload)
        // squelchd's leave push ("leave": true) is an administrator's removal or a deleted channel: the
        // leave it asks for has the reason the same news has when it comes live, `systemPolicy`.
        session.pushResult(result, channel, serverLeave: push.payload["leave"]?.boolValue == true)
    }
}
