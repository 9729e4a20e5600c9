import Audio
import ChannelProtocol
import DevicePush
import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import PTTClient
import PTTServer
import PushStream
import SquelchTesting
import Testing

/// squelchd's own device push service with real TLS streams: a Linux device's token of the `device`
/// kind is woken through it, beside an iPhone's token sent to APNs (the embedded simulator), by one
/// burst; and the stream refuses whoever may not have it.
@Suite(.serialized) struct DevicePushTests {
    func manager(_ fixture: ClientFixture, _ name: String, _ delegate: RecordingDelegate, push: (any PushTransport)?,
                 audio: AudioConfiguration = .none) async throws -> ChannelManager {
        try await ChannelManager.channelManager(
            delegate: delegate, restorationDelegate: delegate,
            configuration: ChannelManagerConfiguration(stateDirectory: fixture.stateDirectory(name), pushTransport: push, audio: audio))
    }

    func devices(_ fixture: ClientFixture) throws -> DevicePushTransport {
        let port: Int = try #require(fixture.listening.devicePushPort, "the device push service is on")
        return DevicePushTransport(port: port)
    }

    @Test func oneBurstWakesALinuxDeviceThroughSquelchdAndAnIPhoneThroughAPNs() async throws {
        let fixture = try await ClientFixture()
        let annDelegate = RecordingDelegate(), bobDelegate = RecordingDelegate(), catDelegate = RecordingDelegate()
        let speech = TestSignal.speechLike(seconds: 1)
        let ann = try await manager(fixture, "dp-ann", annDelegate, push: nil,
                                    audio: AudioConfiguration(makeInput: { WAVFileSource(pipelineSamples: speech, pacer: RealTimePacer()) }))
        let bob = try await manager(fixture, "dp-bob", bobDelegate, push: try devices(fixture))
        let cat = try await manager(fixture, "dp-cat", catDelegate, push: fixture.pushTransport)
        let id = fixture.channel.id
        for (manager, user) in [(ann, "ann"), (bob, "bob"), (cat, "cat")] {
            manager.requestJoinChannel(channelUUID: id, descriptor: ChannelDescriptor(name: "Ops"), credentials: fixture.credentials(try await fixture.token(user)))
        }
        #expect(await annDelegate.wait(for: .didJoin(.developerRequest)))
        #expect(await bobDelegate.wait(for: .pushToken(32)), "the device push stream opened and the token was handed out: \(bobDelegate.all)")
        #expect(await catDelegate.wait(for: .pushToken(32)))
        // The server has both tokens once they are announced; then both devices go to sleep.
        try await Task.sleep(for: .milliseconds(300))
        bob.suspend()
        cat.suspend()
        #expect(await eventually { ann.roster.filter { $0.userID != "ann" && $0.connection == .connected }.isEmpty })

        ann.requestBeginTransmitting(channelUUID: id)
        #expect(await annDelegate.wait(for: .didBegin(.developerRequest)), "\(annDelegate.all)")
        #expect(await bobDelegate.wait(for: .push("Ann")), "the device push service woke the Linux device: \(bobDelegate.all)")
        #expect(await catDelegate.wait(for: .push("Ann")), "APNs (the simulator) woke the iPhone: \(catDelegate.all)")
        // Only the iPhone's push went to APNs, as a pushtotalk push.
        let simulator = try #require(fixture.listening.apnsSimulator)
        let accepted = simulator.acceptedPushes()
        #expect(accepted.count == 1 && accepted.first?.pushType == "pushtotalk" && accepted.first?.priority == 10
                && accepted.first?.expiration == 0, "\(accepted)")
        #expect(accepted.first?.body.contains(#""activeSpeaker":"Ann""#) == true)
        ann.stopTransmitting(channelUUID: id)
        for manager in [ann, bob, cat] { await manager.invalidate() }
        await fixture.stop()
    }

    @Test func theStreamIsRefusedWithoutAGoodTokenAndToAnotherMembersPushToken() async throws {
        let fixture = try await ClientFixture(pushes: false)
        let transport = try devices(fixture)
        let id = fixture.channel.id
        func channel(_ token: String) -> PushChannel { PushChannel(id: id, credentials: fixture.credentials(token)) }

        // A forged participant token.
        let forged = await #expect(throws: DevicePushError.self) {
            _ = try await transport.register(token: nil, for: channel("eyJhbGciOiJFUzI1NiJ9.e30.AAAA"))
        }
        guard case .refused(401, let why)? = forged else {
            Issue.record("not refused as unauthorised: \(String(describing: forged))")
            return
        }
        #expect(!why.isEmpty)
        // Ann's stream holds a token; Bob, with a good token of his own, can't take it.
        let (token, annPushes) = try await transport.register(token: nil, for: channel(try await fixture.token("ann")))
        let bobs = try await fixture.token("bob")
        let port = try #require(fixture.listening.devicePushPort)
        let tls = try DevicePushTransport.tls(fixture.credentials(bobs))
        let hex = token.map { String(format: "%02x", $0) }.joined()
        let taken = await #expect(throws: LineStreamError.self) {
            _ = try await LineStream.open(LineStream.Request(host: "127.0.0.1", port: port, path: DevicePushProtocol.path(token: hex),
                                                             headers: [("authorization", "Bearer \(bobs)")], tls: tls))
        }
        guard case .refused(409, let message)? = taken, message.contains("another member") else {
            Issue.record("Bob was not refused Ann's push token: \(String(describing: taken))")
            return
        }
        // Bob's transport, refused so, makes a token of its own.
        let (bobsToken, _) = try await transport.register(token: token, for: channel(bobs))
        #expect(bobsToken != token && bobsToken.count == 32)
        // The operator sees the open stream.
        let metrics = try await URLSession.shared.data(from: try #require(URL(string: "http://127.0.0.1:\(fixture.listening.adminPort)/metrics")))
        #expect(String(decoding: metrics.0, as: UTF8.self).contains("squelch_device_push_streams 2"), "Ann's and Bob's")
        // A push token that isn't hex.
        let anns = try await fixture.token("ann")
        let notHex = await #expect(throws: LineStreamError.self) {
            _ = try await LineStream.open(LineStream.Request(host: "127.0.0.1", port: port, path: DevicePushProtocol.path(token: "zz"),
                                                             headers: [("authorization", "Bearer \(anns)")], tls: tls))
        }
        guard case .refused(400, let body)? = notHex, body.contains("not a push token") else {
            Issue.record("a push token that isn't hex was not refused: \(String(describing: notHex))")
            return
        }
        _ = annPushes
        await fixture.stop()
    }
}
