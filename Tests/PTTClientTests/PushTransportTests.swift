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

/// Polls `condition` every 20 ms for up to `seconds`.
func until(seconds: Double = 10, _ condition: () -> Bool) async -> Bool {
    let deadline = Date().addingTimeInterval(seconds)
    while Date() < deadline {
        if condition() { return true }
        try? await Task.sleep(for: .milliseconds(20))
    }
    return condition()
}

/// A push channel that fails after its first registration, as the APNs simulator's device stream
/// does when the squelchd that embeds it restarts; registered again, it delivers. In-process because
/// the failure and its timing are the point: restarting a whole server on fixed ports to cut one
/// stream would test the ports, not the manager.
final class FlakyPushTransport: PushTransport {
    let environment = PushEnvironment.sandbox
    let registrations = NIOLockedValueBox<[Data?]>([])
    let live = NIOLockedValueBox<AsyncThrowingStream<IncomingPush, any Error>.Continuation?>(nil)
    struct Dropped: Error {}
    func register(token: Data?) async throws -> (token: Data, pushes: AsyncThrowingStream<IncomingPush, any Error>) {
        let (stream, sink) = AsyncThrowingStream.makeStream(of: IncomingPush.self)
        let first = registrations.withLockedValue { $0.append(token); return $0.count == 1 }
        if first { sink.finish(throwing: Dropped()) } else { live.withLockedValue { $0 = sink } }
        return (token ?? Data([9, 9, 9]), stream)
    }
    func unregister(token: Data) async {}
    func deliver(_ payload: [String: PushValue]) -> Bool {
        live.withLockedValue { $0 }.map { $0.yield(IncomingPush(payload: payload)); return true } ?? false
    }
}

@Suite(.serialized, .timeLimit(.minutes(2))) struct PushTransportTests {
    @Test func aPushChannelThatFailsIsRegisteredAgainWithTheSameToken() async throws {
        let fixture = try await ClientFixture(pushes: false)
        let id = fixture.channel.id
        let transport = FlakyPushTransport()
        let d = RecordingDelegate()
        let m = try await ChannelManager.channelManager(
            delegate: d, restorationDelegate: d,
            configuration: ChannelManagerConfiguration(stateDirectory: fixture.stateDirectory("flaky"), pushTransport: transport))
        let events = m.events
        let notices = NIOLockedValueBox<[String]>([])
        let watcher = Task { for await event in events { if case .notice(let text) = event { notices.withLockedValue { $0.append(text) } } } }
        defer { watcher.cancel() }
        m.requestJoinChannel(channelUUID: id, descriptor: ChannelDescriptor(name: "Ops"), credentials: fixture.credentials(try await fixture.token("ann")))
        #expect(await d.wait(for: .pushToken(3)))
        #expect(await until { transport.registrations.withLockedValue { $0.count } == 2 && m.canBeWokenByPush },
                "registered again after the failure")
        #expect(transport.registrations.withLockedValue { $0 } == [nil, Data([9, 9, 9])], "with the token it was given")
        #expect(d.all.filter { $0 == .pushToken(3) }.count == 1, "the same token is not announced again")
        #expect(notices.withLockedValue { $0 }.contains { $0.contains("push delivery lost") })
        #expect(await until { notices.withLockedValue { $0 }.contains { $0.contains("push delivery is back") } })
        #expect(transport.deliver(["activeSpeaker": .string("Bob"), "channel": .string(id.uuidString)]))
        #expect(await d.wait(for: .push("Bob")), "pushes arrive on the new registration")
        await m.invalidate()
        await fixture.stop()
    }

    @Test func servicePushesCountAgainstTheBudgetAndALeavePushLeaves() async throws {
        let fixture = try await ClientFixture(pushes: false)
        let id = fixture.channel.id
        let transport = LocalPushTransport()
        let d = RecordingDelegate()
        let m = try await ChannelManager.channelManager(
            delegate: d, restorationDelegate: d,
            configuration: ChannelManagerConfiguration(stateDirectory: fixture.stateDirectory("local"), pushTransport: transport))
        m.requestJoinChannel(channelUUID: id, descriptor: ChannelDescriptor(name: "Ops"), credentials: fixture.credentials(try await fixture.token("ann")))
        #expect(await d.wait(for: .pushToken(4)), "apps can plug in their own push transport")
        let update: [String: PushValue] = ["aps": .object(["ptt-push-type": .string("service-update")]), "note": .string("new roster")]
        for _ in 0..<7 { transport.deliver(update) }
        transport.deliver(update, highPriority: false)
        #expect(await d.wait(for: .serviceUpdate(true, 0), count: 2))
        // The low-priority one comes last (it spends no budget): wait for it too, not just the others.
        #expect(await d.wait(for: .serviceUpdate(false, 0)))
        #expect(d.all.compactMap { if case .serviceUpdate(let high, let left) = $0 { return high ? left : -1 } else { return nil } }
                == [5, 4, 3, 2, 1, 0, 0, -1])
        #expect(!d.all.contains(.push(nil)), "service updates don't go to incomingPushResult")
        // A push for a channel the device has left is not this channel's: nobody is shown, nothing left.
        let elsewhere = UUID()
        transport.deliver(["activeSpeaker": .string("Zed"), "channel": .string(elsewhere.uuidString)])
        transport.deliver(["channel": .string(elsewhere.uuidString)])
        // A push without a speaker: the app answers leave, and the channel is left.
        transport.deliver(["channel": .string(id.uuidString)])
        #expect(await d.wait(for: .didLeave(.developerRequest)))
        #expect(d.all.contains(.push(nil)) && m.activeChannelUUID == nil)
        #expect(!d.all.contains(.push("Zed")) && d.all.filter { $0 == .push(nil) }.count == 1, "\(d.all)")
        #expect(try RestorationStore(directory: fixture.stateDirectory("local")).load() == nil, "the record goes with the channel")
        await m.invalidate()
        await fixture.stop()
    }
}
