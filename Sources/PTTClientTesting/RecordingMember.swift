import Audio
import Foundation
import PTTClient
import SquelchTesting
import Synchronization

/// A channel member on PTTClient for tests and benchmarks that run squelchd as separate processes:
/// it talks half a second (or a second) of synthetic speech on demand, or records what it hears and
/// counts the bursts it played. Test support: never linked into squelchd or walkie.
public final class RecordingMember: ChannelManagerDelegate, ChannelRestorationDelegate, Sendable {
    private let heard = Mutex<[(at: Date, frames: Int)]>([])
    private let joins = Mutex(0)
    private let leaves = Mutex<[ChannelLeaveReason]>([])
    private let joinFailures = Mutex<[ChannelError]>([])
    /// The last events, for a failure's message.
    private let recent = Mutex<[String]>([])
    private let manager = Mutex<ChannelManager?>(nil)
    private let events = Mutex<Task<Void, Never>?>(nil)

    /// A member whose state (restoration record) lives in `directory/state-NAME`; a listener writes
    /// what it hears to `directory/NAME.wav`.
    public init(_ name: String, in directory: String, talkSeconds: Double? = nil) async throws {
        var audio = AudioConfiguration.none
        if let talkSeconds {
            let samples = TestSignal.speechLike(seconds: talkSeconds)
            audio = AudioConfiguration(makeInput: { WAVFileSource(pipelineSamples: samples, pacer: RealTimePacer()) })
            audio.endTransmissionWhenInputEnds = true
        } else {
            let path = directory + "/\(name).wav"
            audio = AudioConfiguration(makeOutput: { try WAVFileSink(path: path, pacer: RealTimePacer()) })
        }
        let manager = try await ChannelManager.channelManager(
            delegate: self, restorationDelegate: self,
            configuration: ChannelManagerConfiguration(stateDirectory: directory + "/state-\(name)", pushTransport: nil, audio: audio))
        self.manager.withLock { $0 = manager }
        let task = Task { [self] in
            for await event in manager.events {
                recent.withLock { $0 = Array(($0 + ["\(event)"]).suffix(12)) }
                if case .burstFinished(let statistics) = event, statistics.played > 5 {
                    heard.withLock { $0.append((Date(), statistics.played)) }
                }
            }
        }
        events.withLock { $0 = task }
    }

    public var client: ChannelManager { manager.withLock { $0! } }
    /// Bursts heard (more than 100 ms of them played).
    public var bursts: Int { heard.withLock { $0.count } }
    public var lastHeard: Date? { heard.withLock { $0.last?.at } }
    /// Frames (20 ms each) played of each burst heard.
    public var played: [Int] { heard.withLock { $0.map(\.frames) } }
    public var leaveReasons: [ChannelLeaveReason] { leaves.withLock { $0 } }
    public var recentEvents: [String] { recent.withLock { $0 } }

    /// Joins `channel` with `credentials`; fails if the join fails, or no `didJoin` comes within 15 s.
    public func join(_ channel: UUID, credentials: ChannelCredentials) async throws {
        let before = joins.withLock { $0 }, failedBefore = joinFailures.withLock { $0.count }
        client.requestJoinChannel(channelUUID: channel, descriptor: ChannelDescriptor(name: "Ops"), credentials: credentials)
        let settled = await eventually(seconds: 15) {
            self.joins.withLock { $0 } > before || self.joinFailures.withLock { $0.count } > failedBefore
        }
        if let failure = joinFailures.withLock({ $0.count > failedBefore ? $0.last : nil }) {
            throw NotJoined(description: "the join through \(credentials.address) failed: \(failure)")
        }
        guard settled else { throw NotJoined(description: "not joined through \(credentials.address): \(recentEvents)") }
    }

    public struct NotJoined: Error, CustomStringConvertible { public var description: String }

    /// Presses until a new burst goes out (the channel may still be finding its home), within
    /// `seconds`, once the last one has ended.
    public func talk(_ channel: UUID, within seconds: Double) async -> Bool {
        let client = self.client
        guard await eventually(seconds: seconds, every: .milliseconds(50), { !client.isTransmitting }) else { return false }
        return await eventually(seconds: seconds, every: .milliseconds(100)) {
            guard client.serviceStatus == .ready else { return false }
            client.requestBeginTransmitting(channelUUID: channel)
            return await eventually(seconds: 1) { client.isTransmitting }
        }
    }

    public func invalidate() async {
        events.withLock { $0?.cancel() }
        await client.invalidate()
    }

    public func channelManager(_ m: ChannelManager, didJoinChannel id: UUID, reason: ChannelJoinReason) { joins.withLock { $0 += 1 } }
    public func channelManager(_ m: ChannelManager, didLeaveChannel id: UUID, reason: ChannelLeaveReason) { leaves.withLock { $0.append(reason) } }
    public func channelManager(_ m: ChannelManager, failedToJoinChannel id: UUID, error: ChannelError) { joinFailures.withLock { $0.append(error) } }
    public func channelManager(_ m: ChannelManager, channelUUID: UUID, didBeginTransmittingFrom source: ChannelTransmitRequestSource) {}
    public func channelManager(_ m: ChannelManager, channelUUID: UUID, didEndTransmittingFrom source: ChannelTransmitRequestSource) {}
    public func channelManager(_ m: ChannelManager, receivedEphemeralPushToken token: Data) {}
    public func incomingPushResult(channelManager: ChannelManager, channelUUID: UUID, pushPayload: [String: PushValue]) -> PushResult { .leaveChannel }
    public func channelManager(_ m: ChannelManager, didActivate audioSession: AudioSession) {}
    public func channelManager(_ m: ChannelManager, didDeactivate audioSession: AudioSession) {}
    public func channelDescriptor(restoredChannelUUID id: UUID) -> ChannelDescriptor { ChannelDescriptor(name: "Ops") }
}
