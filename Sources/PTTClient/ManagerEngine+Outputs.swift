import Audio
import ChannelProtocol
import Foundation
import JitterBuffer
import NIOConcurrencyHelpers
import NIOCore
import Wire
import WireNIO

// Outputs: carrying out the session's decisions, and the delegate calls.
extension ManagerEngine {
    func perform() async {
        // The snapshot is current before any delegate call, so a delegate (or a test) reading the
        // manager's state from inside a callback sees what caused it.
        updateSnapshot()
        while true {
            let outputs = session.takeOutputs()
            if outputs.isEmpty { break }
            for output in outputs { await perform(output) }
        }
        // A channel that ended without a push token to invalidate (none was issued yet, or a
        // restored one was refused) still stops its push task.
        if session.channel == nil, pushTask != nil { stopPushes() }
        updateSnapshot()
    }

    func updateSnapshot() {
        let s = session
        snapshot.withLockedValue { snap in
            snap.activeChannelUUID = s.channel
            snap.serviceStatus = s.serviceStatus
            snap.transmissionMode = s.transmissionMode
            snap.activeRemoteParticipant = s.activeRemoteParticipant
            snap.roster = s.rosterEntries
            if case .active = s.transmit { snap.isTransmitting = true } else { snap.isTransmitting = false }
            snap.isSuspended = s.link == .suspended
            snap.isJoined = s.link == .joined
            snap.tokenExpired = s.tokenExpired
            snap.channelInfo = s.serverInfo
            // Where the voice connection goes (a cluster's home node), which is where the channel's
            // pushes are sent from.
            snap.credentials = s.credentials.map(s.route.credentials(for:))
            snap.entryCredentials = s.credentials
        }
    }

    func perform(_ output: SessionOutput) async {
        switch output {
        case .delegate(let call):
            deliver(call)
        case .connect(let credentials, let cluster, let pass):
            // Audio is taken before the join is answered: the server's catch-up of a burst in progress
            // follows `joined` at once (25 packets, then 10 every 10 ms). Taken only from `didJoin`,
            // after the event and command hops and the restoration record's write, the start of the
            // burst a late joiner came for was lost. The output opens at `didJoin`.
            receiver.arm()
            followChannelServer(to: credentials)
            await openConnection(credentials, cluster: cluster, pass: pass)
        case .disconnect:
            await closeConnection()
        case .send(let message):
            guard let client else { return }
            do {
                try await client.send(control: MessageCodec().encode(message))
            } catch {
                eventSink.yield(.notice("could not send \(message): \(error)"))
            }
        case .startSending(let burst):
            guard let client else { return }
            transmitter.start(burst: burst, client: client)
        case .stopSending:
            await transmitter.stop()
        case .adaptToListenerLoss(let percent):
            transmitter.setListenerLoss(percent)
        case .mutePlayback(let muted):
            receiver.setMuted(muted || playbackMuted)
        case .tone(let tone):
            receiver.play(tone)
        case .flushPlayback:
            await receiver.stop()
            receiver.discardAll()
        case .scheduleReconnect(let milliseconds):
            let sink = commandSink
            reconnectTask?.cancel()
            let wait = Backoff.jittered(milliseconds)
            reconnectTask = Task {
                try? await Task.sleep(for: .milliseconds(wait))
                if !Task.isCancelled { sink.yield(.reconnectDue) }
            }
        case .scheduleTransmitWait(let milliseconds, let request):
            let sink = commandSink
            Task {
                try? await Task.sleep(for: .milliseconds(milliseconds))
                sink.yield(.transmitWaitDue(request))
            }
        case .scheduleRosterSettle(let milliseconds, let generation):
            let sink = commandSink
            Task {
                try? await Task.sleep(for: .milliseconds(milliseconds))
                sink.yield(.rosterSettleDue(generation))
            }
        case .scheduleResync(let milliseconds):
            let sink = commandSink
            Task {
                try? await Task.sleep(for: .milliseconds(milliseconds))
                sink.yield(.resyncDue)
            }
        case .requestPushToken(let channel):
            startPushes(token: nil, channel: channel)
        case .invalidatePushToken(let token):
            stopPushes()
            if let transport = configuration.pushTransport { await transport.unregister(token: token) }
        case .save(let record):
            do { try store.save(record) } catch { eventSink.yield(.notice(error.description)) }
        case .forgetRestoration:
            store.remove()
        case .oweLeave(let channel, let credentials):
            startLeaveDelivery(OwedLeave(channel: channel, credentials: credentials, leftAt: Date()))
            saveOwedLeaves()
        case .event(let event):
            eventSink.yield(event)
        }
    }

    func deliver(_ call: DelegateCall) {
        guard let delegate, let manager else { return }
        switch call {
        case .didJoin(let uuid, let reason):
            receiver.start()
            delegate.channelManager(manager, didJoinChannel: uuid, reason: reason)
        case .didLeave(let uuid, let reason): delegate.channelManager(manager, didLeaveChannel: uuid, reason: reason)
        case .didBeginTransmitting(let uuid, let source): delegate.channelManager(manager, channelUUID: uuid, didBeginTransmittingFrom: source)
        case .didEndTransmitting(let uuid, let source): delegate.channelManager(manager, channelUUID: uuid, didEndTransmittingFrom: source)
        case .receivedPushToken(let token): delegate.channelManager(manager, receivedEphemeralPushToken: token)
        case .didActivate(let audio): delegate.channelManager(manager, didActivate: audio)
        case .didDeactivate(let audio): delegate.channelManager(manager, didDeactivate: audio)
        case .failedToJoin(let uuid, let error): delegate.channelManager(manager, failedToJoinChannel: uuid, error: error)
        case .failedToLeave(let uuid, let error): delegate.channelManager(manager, failedToLeaveChannel: uuid, error: error)
        case .failedToBegin(let uuid, let error): delegate.channelManager(manager, failedToBeginTransmittingInChannel: uuid, error: error)
        case .failedToStop(let uuid, let error): delegate.channelManager(manager, failedToStopTransmittingInChannel: uuid, error: error)
        }
    }
}
