import Audio
import ChannelProtocol
import Foundation
import JitterBuffer
import NIOConcurrencyHelpers
import NIOCore
import Wire
import WireNIO

// Leaves owed to the server, delivered on connections of their own and kept on disk.
extension ManagerEngine {
    /// Starts delivering `leave` (replacing a delivery for the same channel).
    func startLeaveDelivery(_ leave: OwedLeave) {
        owedLeaves[leave.channel]?.task.cancel()
        nextLeaveID += 1
        let id = nextLeaveID
        let sink = commandSink
        let connection = configuration.connection
        let task = Task {
            var delivery = LeaveDelivery(leave)
            while true {
                let result = await Self.attemptLeave(delivery, connection: connection)
                if Task.isCancelled { return }
                switch delivery.ended(result) {
                case .finished(let outcome):
                    sink.yield(.leaveSettled(leave.channel, id: id, outcome))
                    return
                case .retry(let milliseconds):
                    do { try await Task.sleep(for: .milliseconds(Backoff.jittered(milliseconds))) } catch { return }
                }
            }
        }
        owedLeaves[leave.channel] = (leave, id, task)
        snapshot.withLockedValue { $0.owedLeaves = Set(owedLeaves.keys) }
    }

    /// The delivery `id` for `channel` ended with `outcome`; with `id` nil, whichever is under way
    /// gives way (the channel was joined again).
    func settleLeave(_ channel: UUID, id: Int?, _ outcome: OwedLeaveOutcome) {
        guard let owed = owedLeaves[channel], id == nil || id == owed.id else { return }
        owed.task.cancel()
        owedLeaves[channel] = nil
        snapshot.withLockedValue { $0.owedLeaves = Set(owedLeaves.keys) }
        saveOwedLeaves()
        switch outcome {
        case .delivered, .superseded: break
        case .nothingToLeave(let why):
            eventSink.yield(.notice("the server had no membership left to leave in channel \(channel): \(why)"))
        case .undeliverable(let why):
            eventSink.yield(.notice("the server could not be told that you left channel \(channel) (\(why)); it lists you there until an administrator removes you"))
        }
        eventSink.yield(.leaveSettled(channel, outcome))
    }

    func saveOwedLeaves() {
        do {
            try store.saveOwedLeaves(owedLeaves.values.map(\.leave).sorted { $0.leftAt < $1.leftAt })
        } catch {
            eventSink.yield(.notice(error.description))
        }
    }

    /// One attempt at an owed leave, on a connection of its own: `join`, then `leave` once joined,
    /// then close once the server acknowledged it. Gives up after `limit`.
    static func attemptLeave(_ delivery: LeaveDelivery, connection: ConnectionConfiguration,
                             limit: Duration = .seconds(15)) async -> LeaveDelivery.AttemptResult {
        let credentials = delivery.leave.credentials
        let client: WireClientChannel
        do throws(SetupProblem) { client = try makeClient(credentials, connection: connection, onDatagram: { _ in }) } catch {
            return .failed(error.message)
        }
        let codec = MessageCodec()
        // Closing the client ends its event stream, which ends the attempt: on time, or on cancellation.
        let deadline = Task {
            try? await Task.sleep(for: limit)
            await client.close(code: CloseCode.normal.rawValue, reason: "client closed")
        }
        let connecting = Task { try? await client.connect() }
        defer {
            deadline.cancel()
            connecting.cancel()
        }
        let result = await withTaskCancellationHandler { () async -> LeaveDelivery.AttemptResult in
            var attempt = delivery.attempt()
            for await event in client.events {
                switch event {
                case .connection(.connected):
                    try? await client.send(control: codec.encode(attempt.join))
                case .connection(.control(let bytes)):
                    guard let message = try? codec.decodeServerMessage(bytes), let action = attempt.received(message) else { continue }
                    switch action {
                    case .send(let message):
                        do { try await client.send(control: codec.encode(message)) } catch {
                            return .failed("could not send \(message): \(error)")
                        }
                    case .end(let ended):
                        return ended
                    }
                case .connection(.closed(let error)):
                    return attempt.closed(error)
                default:
                    break
                }
            }
            return .failed("no answer from squelchd at \(credentials.address) within \(limit)")
        } onCancel: {
            Task { await client.close(code: CloseCode.normal.rawValue, reason: "client closed") }
        }
        await client.close(code: CloseCode.normal.rawValue, reason: "client closed")
        return result
    }
}
