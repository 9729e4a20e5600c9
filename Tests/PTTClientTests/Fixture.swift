import APNsSimulatorEmbedding
import Audio
import ChannelProtocol
import ChannelStore
import ChannelStoreSQLite
import Foundation
import ImpairmentKit
import enum NIOCore.SocketAddress
import NIOConcurrencyHelpers
import ParticipantClaims
import ParticipantTokens
import PTTClient
import PTTServer
import ServerTesting
import SimulatedPush
import SquelchTesting
import Testing
import Wire
import WireTesting
import X509

/// squelchd in this process on 127.0.0.1 (real UDP, SQLite in a temporary directory, the embedded APNs
/// simulator over real HTTP/2 + TLS), and the files a client needs: the CA as PEM and participant tokens.
final class ClientFixture: Sendable {
    let pki: TestPKI
    let directory: String
    let dataDirectory: String
    let caPath: String
    let channel: ChannelRecord
    let server: Task<Void, any Error>
    let listening: SquelchServer.Listening

    init(mode: ChannelProtocol.TransmissionMode = .halfDuplex, pushes: Bool = true) async throws {
        pki = try TestPKI()
        directory = FileManager.default.temporaryDirectory.appendingPathComponent("pttclient-test-\(UUID())").path
        dataDirectory = directory + "/data"
        try FileManager.default.createDirectory(atPath: dataDirectory, withIntermediateDirectories: true)
        caPath = directory + "/ca.pem"
        try pki.ca.serializeAsPEM().pemString.write(toFile: caPath, atomically: true, encoding: .utf8)
        channel = ChannelRecord(name: "Ops", mode: mode, maxBurstSeconds: 60)
        let store = try SQLiteChannelStore(directory: dataDirectory)
        try await store.createChannel(channel)
        try await store.close()

        let configuration = TestServer.configuration(dataDirectory: dataDirectory,
                                                     pushCertificates: pushes ? DevCertificates.directory : nil)
        (server, listening) = try await TestServer.start(configuration, identity: try pki.identity())
    }

    func stop() async {
        server.cancel()
        _ = await server.result
        try? FileManager.default.removeItem(atPath: directory)
    }

    func token(_ user: String, capabilities: Set<Capability> = [.talk, .listen], priority: UInt8 = 0, channel: UUID? = nil,
               ttl: TimeInterval = 3600, role: String? = nil, image: String? = nil) async throws -> String {
        let authority = try await TokenAuthority.loadOrCreate(in: dataDirectory)
        return try await authority.issue(ParticipantClaims(
            userID: user, name: user.capitalized, channel: channel ?? self.channel.id, capabilities: capabilities, role: role,
            image: image, priority: priority, expiresAt: Date().addingTimeInterval(ttl)))
    }

    func credentials(_ token: String, caPath: String? = nil) -> ChannelCredentials {
        ChannelCredentials(host: "127.0.0.1", port: listening.voicePort, serverName: "localhost", caPath: caPath ?? self.caPath, token: token)
    }

    var pushTransport: SimulatedPushTransport? {
        listening.apnsSimulatorEndpoints.map { SimulatedPushTransport(host: "127.0.0.1", controlPort: $0.controlPort) }
    }

    /// A fresh state directory: one "device".
    func stateDirectory(_ name: String) -> String { directory + "/state-\(name)" }

    /// An impairing UDP proxy in front of this fixture's voice port, started; clients that go through it
    /// connect to `port`.
    func proxy(clientToServer: Impairment = Impairment(), serverToClient: Impairment = Impairment()) async throws -> (ImpairmentProxy, port: Int) {
        let proxy = ImpairmentProxy(upstream: try SocketAddress(ipAddress: "127.0.0.1", port: listening.voicePort),
                                    clientToServer: clientToServer, serverToClient: serverToClient)
        return (proxy, try await proxy.start())
    }
}

/// Records every delegate callback, in order, for the tests to wait on.
final class RecordingDelegate: ChannelManagerDelegate, ChannelRestorationDelegate, Sendable {
    enum Call: Equatable, Sendable {
        case didJoin(ChannelJoinReason), didLeave(ChannelLeaveReason)
        case didBegin(ChannelTransmitRequestSource), didEnd(ChannelTransmitRequestSource)
        case pushToken(Int), push(String?), didActivate, didDeactivate
        case failedToJoin(ChannelError.Code), failedToLeave(ChannelError.Code), failedToBegin(ChannelError.Code), failedToStop(ChannelError.Code)
        case serviceUpdate(Bool, Int)
        case restorationAsked
    }

    let calls = NIOLockedValueBox<[Call]>([])
    let errors = NIOLockedValueBox<[ChannelError]>([])
    let answer: @Sendable ([String: PushValue]) -> PushResult

    init(answer: @escaping @Sendable ([String: PushValue]) -> PushResult = { payload in
        (payload["activeSpeaker"]?.stringValue).flatMap { try? Participant(name: $0) }.map { .activeRemoteParticipant($0) } ?? .leaveChannel
    }) {
        self.answer = answer
    }

    func add(_ call: Call) { calls.withLockedValue { $0.append(call) } }
    var all: [Call] { calls.withLockedValue { $0 } }

    /// Waits until `call` has been seen `count` times.
    @discardableResult
    func wait(for call: Call, count: Int = 1, seconds: Double = 10) async -> Bool {
        let deadline = Date().addingTimeInterval(seconds)
        while Date() < deadline {
            if all.filter({ $0 == call }).count >= count { return true }
            try? await Task.sleep(for: .milliseconds(10))
        }
        return false
    }

    func channelManager(_ m: ChannelManager, didJoinChannel id: UUID, reason: ChannelJoinReason) { add(.didJoin(reason)) }
    func channelManager(_ m: ChannelManager, didLeaveChannel id: UUID, reason: ChannelLeaveReason) { add(.didLeave(reason)) }
    func channelManager(_ m: ChannelManager, channelUUID: UUID, didBeginTransmittingFrom source: ChannelTransmitRequestSource) { add(.didBegin(source)) }
    func channelManager(_ m: ChannelManager, channelUUID: UUID, didEndTransmittingFrom source: ChannelTransmitRequestSource) { add(.didEnd(source)) }
    func channelManager(_ m: ChannelManager, receivedEphemeralPushToken token: Data) { add(.pushToken(token.count)) }
    func incomingPushResult(channelManager: ChannelManager, channelUUID: UUID, pushPayload: [String: PushValue]) -> PushResult {
        add(.push(pushPayload["activeSpeaker"]?.stringValue))
        return answer(pushPayload)
    }
    func channelManager(_ m: ChannelManager, didActivate audioSession: AudioSession) { add(.didActivate) }
    func channelManager(_ m: ChannelManager, didDeactivate audioSession: AudioSession) { add(.didDeactivate) }
    func channelManager(_ m: ChannelManager, failedToJoinChannel id: UUID, error: ChannelError) {
        errors.withLockedValue { $0.append(error) }
        add(.failedToJoin(error.code))
    }
    func channelManager(_ m: ChannelManager, failedToLeaveChannel id: UUID, error: ChannelError) { add(.failedToLeave(error.code)) }
    func channelManager(_ m: ChannelManager, failedToBeginTransmittingInChannel id: UUID, error: ChannelError) {
        errors.withLockedValue { $0.append(error) }
        add(.failedToBegin(error.code))
    }
    func channelManager(_ m: ChannelManager, failedToStopTransmittingInChannel id: UUID, error: ChannelError) { add(.failedToStop(error.code)) }
    func incomingServiceUpdatePush(channelManager: ChannelManager, channelUUID: UUID, pushPayload: [String: PushValue],
                                   isHighPriority: Bool, remainingHighPriorityBudget: Int, completion: @escaping @Sendable () -> Void) {
        add(.serviceUpdate(isHighPriority, remainingHighPriorityBudget))
        completion()
    }
    func channelDescriptor(restoredChannelUUID id: UUID) -> ChannelDescriptor {
        add(.restorationAsked)
        return ChannelDescriptor(name: "From the delegate")
    }
}

/// Collects a manager's events.
final class EventLog: Sendable {
    let events = NIOLockedValueBox<[ChannelManagerEvent]>([])
    let task: Task<Void, Never>
    init(_ manager: ChannelManager) {
        let events = self.events
        task = Task { for await event in manager.events { events.withLockedValue { $0.append(event) } } }
    }
    var all: [ChannelManagerEvent] { events.withLockedValue { $0 } }
    var finishedBursts: [BurstStatisticsSummary] {
        all.compactMap { if case .burstFinished(let s) = $0 { return BurstStatisticsSummary(s) } else { return nil } }
    }
}

import JitterBuffer
struct BurstStatisticsSummary: Equatable {
    var played: Int, lost: Int, catchUp: Int, fec: Int, concealed: Int
    init(_ s: BurstStatistics) { played = s.played; lost = s.lost; catchUp = s.catchUpFrames; fec = s.fecRecovered; concealed = s.concealed }
}
