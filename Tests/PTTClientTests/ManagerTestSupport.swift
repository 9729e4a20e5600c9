import APNsSimulatorEmbedding
import Audio
import ChannelProtocol
import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import ImpairmentKit
import JitterBuffer
import enum NIOCore.SocketAddress
import NIOConcurrencyHelpers
import Opus
import PTTClient
import SquelchTesting
import Testing
import Wire
import WireTesting
import X509

struct IgnoreRole: SubscriptionStrategy {
    var role: String
    func subscribeType(for participant: RosterEntry) -> SubscribeType { participant.role == role ? .none : .audio }
}

final class BlockingRestorationDelegate: ChannelManagerDelegate, ChannelRestorationDelegate, @unchecked Sendable {
    // @unchecked: `gate` is a DispatchSemaphore (thread-safe by design) and `asked` is lock-protected.
    let gate: DispatchSemaphore
    let asked = NIOLockedValueBox(false)
    init(gate: DispatchSemaphore) { self.gate = gate }
    func channelDescriptor(restoredChannelUUID id: UUID) -> ChannelDescriptor {
        asked.withLockedValue { $0 = true }
        gate.wait()
        return ChannelDescriptor(name: "Restored")
    }
    func channelManager(_ m: ChannelManager, didJoinChannel id: UUID, reason: ChannelJoinReason) {}
    func channelManager(_ m: ChannelManager, didLeaveChannel id: UUID, reason: ChannelLeaveReason) {}
    func channelManager(_ m: ChannelManager, channelUUID: UUID, didBeginTransmittingFrom source: ChannelTransmitRequestSource) {}
    func channelManager(_ m: ChannelManager, channelUUID: UUID, didEndTransmittingFrom source: ChannelTransmitRequestSource) {}
    func channelManager(_ m: ChannelManager, receivedEphemeralPushToken token: Data) {}
    func incomingPushResult(channelManager: ChannelManager, channelUUID: UUID, pushPayload: [String: PushValue]) -> PushResult { .leaveChannel }
    func channelManager(_ m: ChannelManager, didActivate audioSession: AudioSession) {}
    func channelManager(_ m: ChannelManager, didDeactivate audioSession: AudioSession) {}
}

func rms(_ samples: ArraySlice<Int16>) -> Double {
    var sum = 0.0
    for s in samples { let v = Double(s) / 32768; sum += v * v }
    return (sum / Double(max(1, samples.count))).squareRoot()
}

/// An in-process push transport: pushes the test hands it, the way an app with a local push channel
/// (Apple's `NEAppPushProvider.reportPushToTalkMessage`) delivers them without APNs.
final class LocalPushTransport: PushTransport {
    let environment = PushEnvironment.sandbox
    let stream: AsyncThrowingStream<IncomingPush, any Error>
    let sink: AsyncThrowingStream<IncomingPush, any Error>.Continuation
    init() { (stream, sink) = AsyncThrowingStream.makeStream(of: IncomingPush.self) }
    func register(token: Data?) async throws -> (token: Data, pushes: AsyncThrowingStream<IncomingPush, any Error>) {
        (token ?? Data([1, 2, 3, 4]), stream)
    }
    func unregister(token: Data) async { sink.finish() }
    func deliver(_ payload: [String: PushValue], highPriority: Bool = true) { sink.yield(IncomingPush(payload: payload, isHighPriority: highPriority)) }
}
