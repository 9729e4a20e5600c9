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

/// The channel manager end to end: real squelchd, real UDP, real Opus, WAV files as microphone and
/// speaker (paced in real time, as a sound card would be; this machine has none), and the APNs
/// simulator's real HTTP/2 delivery for pushes.
@Suite(.serialized, .timeLimit(.minutes(3))) struct ChannelManagerTests {
    func speech(_ seconds: Double) -> AudioConfiguration {
        let samples = TestSignal.speechLike(seconds: seconds)
        return AudioConfiguration(makeInput: { WAVFileSource(pipelineSamples: samples, pacer: RealTimePacer()) })
    }

    /// A delegate whose app, woken by a push, takes `seconds` to answer it (a cold start), then shows
    /// the push's speaker.
    func wokenDelegate(answeringAfter seconds: Double) -> RecordingDelegate {
        RecordingDelegate { payload in
            Thread.sleep(forTimeInterval: seconds)
            return .activeRemoteParticipant(try! Participant(name: payload["activeSpeaker"]?.stringValue ?? "?"))
        }
    }

    func recorder(_ path: String) -> AudioConfiguration {
        AudioConfiguration(makeOutput: { try WAVFileSink(path: path, pacer: RealTimePacer()) })
    }

    func manager(_ fixture: ClientFixture, _ name: String, _ delegate: RecordingDelegate, audio: AudioConfiguration = .none,
                 pushes: Bool = true, connection: ConnectionConfiguration = .client) async throws -> ChannelManager {
        try await ChannelManager.channelManager(
            delegate: delegate, restorationDelegate: delegate,
            configuration: ChannelManagerConfiguration(stateDirectory: fixture.stateDirectory(name), pushTransport: pushes ? fixture.pushTransport : nil,
                                                       audio: audio, connection: connection))
    }

    @Test func joinTalkAndListenWithEveryCallbackInOrder() async throws {
        let fixture = try await ClientFixture()
        let annDelegate = RecordingDelegate(), bobDelegate = RecordingDelegate()
        let heard = fixture.directory + "/bob.wav"
        let ann = try await manager(fixture, "ann", annDelegate, audio: speech(1.0))
        let bob = try await manager(fixture, "bob", bobDelegate, audio: recorder(heard))
        let bobEvents = EventLog(bob)
        let id = fixture.channel.id
        ann.requestJoinChannel(channelUUID: id, descriptor: ChannelDescriptor(name: "Ops"), credentials: fixture.credentials(try await fixture.token("ann")))
        bob.requestJoinChannel(channelUUID: id, descriptor: ChannelDescriptor(name: "Ops"), credentials: fixture.credentials(try await fixture.token("bob")))
        #expect(await annDelegate.wait(for: .didJoin(.developerRequest)))
        #expect(await bobDelegate.wait(for: .didJoin(.developerRequest)))
        #expect(await bobDelegate.wait(for: .pushToken(32)), "an ephemeral token on join")
        #expect(ann.activeChannelUUID == id && ann.serviceStatus == .ready)
        #expect(await eventually { bob.roster.map(\.userID).sorted() == ["ann", "bob"] })

        ann.requestBeginTransmitting(channelUUID: id)
        #expect(await annDelegate.wait(for: .didActivate))
        #expect(await bobDelegate.wait(for: .didActivate))
        #expect(bob.activeRemoteParticipant?.name == "Ann")
        try await Task.sleep(for: .seconds(1.2))
        ann.stopTransmitting(channelUUID: id)
        #expect(await annDelegate.wait(for: .didDeactivate))
        #expect(await bobDelegate.wait(for: .didDeactivate))
        #expect(annDelegate.all.filter { [.didBegin(.developerRequest), .didActivate, .didEnd(.developerRequest), .didDeactivate].contains($0) }
                == [.didBegin(.developerRequest), .didActivate, .didEnd(.developerRequest), .didDeactivate])
        #expect(bob.activeRemoteParticipant == nil)
        #expect(await eventually { !bobEvents.finishedBursts.isEmpty })
        let sent = await ann.statistics().framesSent
        let burst = try #require(bobEvents.finishedBursts.first)
        #expect(sent >= 45 && burst.played + burst.fec == sent && burst.lost == 0, "\(burst), sent \(sent)")

        bob.leaveChannel(channelUUID: id)
        #expect(await bobDelegate.wait(for: .didLeave(.developerRequest)))
        #expect(bob.activeChannelUUID == nil)
        await bob.invalidate()
        await ann.invalidate()
        // Bob's speaker file holds the speech: as many loud 10 ms periods as Ann's microphone had, give
        // or take the codec's edges.
        func loudPeriods(_ audio: [Int16]) -> Int {
            stride(from: 0, to: audio.count - 480, by: 480).filter { rms(audio[$0 ..< $0 + 480]) > 0.01 }.count
        }
        let spoken = loudPeriods(TestSignal.speechLike(seconds: 1.0))
        let played = loudPeriods(try WAVAudio.read(path: heard).pipelineSamples(resampler: Resampler()))
        #expect(spoken > 20 && played >= spoken * 9 / 10 && played <= spoken + 5, "spoken \(spoken), played \(played) loud periods")
        await fixture.stop()
    }

    /// A shift outlasts its token: the server warns, the app renews, and the session never drops. And
    /// a token left to expire ends the session but not the channel, which a new token brings back.
    @Test func aSessionOutlivesItsTokenWhenTheAppRenewsIt() async throws {
        let fixture = try await ClientFixture(pushes: false)
        let id = fixture.channel.id
        let d = RecordingDelegate()
        let m = try await manager(fixture, "renewal", d, pushes: false)
        let events = EventLog(m)
        func seen(_ match: (ChannelManagerEvent) -> Bool) -> Int { events.all.filter(match).count }
        let expiring: (ChannelManagerEvent) -> Bool = { if case .tokenExpiring = $0 { true } else { false } }
        let expired: (ChannelManagerEvent) -> Bool = { if case .tokenExpired = $0 { true } else { false } }
        let renewed: (ChannelManagerEvent) -> Bool = { if case .tokenRenewed = $0 { true } else { false } }

        m.requestJoinChannel(channelUUID: id, descriptor: ChannelDescriptor(name: "Ops"),
                             credentials: fixture.credentials(try await fixture.token("ann", ttl: 3)))
        #expect(await d.wait(for: .didJoin(.developerRequest)))
        // Less than the notice period left: the server says so with the join.
        #expect(await eventually { seen(expiring) == 1 })
        // Left to expire: the session ends; the channel stays, unavailable.
        #expect(await eventually(seconds: 8) { seen(expired) == 1 })
        #expect(m.activeChannelUUID == id && m.serviceStatus == .unavailable)
        #expect(!d.all.contains { if case .didLeave = $0 { true } else { false } })
        // A new token brings it back, without a second didJoin.
        try await m.renewToken(try await fixture.token("ann", ttl: 8), channelUUID: id)
        #expect(await eventually { m.serviceStatus == .ready })
        #expect(await eventually { seen(expiring) == 2 })
        // This time renewed in the session, before its end: it carries on past the old token's expiry.
        let long = try await fixture.token("ann", ttl: 3600)
        try await m.renewToken(long, channelUUID: id)
        #expect(await eventually { seen(renewed) == 1 })
        #expect(try RestorationStore(directory: m.stateDirectory).load()?.credentials.token == long)
        try await Task.sleep(for: .seconds(9))
        #expect(seen(expired) == 1 && m.serviceStatus == .ready)
        m.requestBeginTransmitting(channelUUID: id)
        #expect(await d.wait(for: .didBegin(.developerRequest)))
        m.stopTransmitting(channelUUID: id)
        #expect(await d.wait(for: .didEnd(.developerRequest)))
        // Another user's token is refused before it is offered, and the session goes on.
        let bobs = try await fixture.token("bob", ttl: 3600)
        await #expect(throws: ChannelError.self) { try await m.renewToken(bobs, channelUUID: id) }
        #expect(m.serviceStatus == .ready)
        #expect(try RestorationStore(directory: m.stateDirectory).load()?.credentials.token == long)
        #expect(d.all.filter { $0 == .didJoin(.developerRequest) }.count == 1)
        await m.invalidate()
        // An invalidated manager's setters fail at once (they used to wait for ever).
        await #expect(throws: ChannelError.self) { try await m.setServiceStatus(.ready, channelUUID: id) }
        await fixture.stop()
    }

    @Test func everyErrorPathAgainstARealServer() async throws {
        let fixture = try await ClientFixture(pushes: false)
        let id = fixture.channel.id
        let d = RecordingDelegate()
        var quick = ConnectionConfiguration.client
        quick.handshakeTimeout = 3_000_000_000
        let m = try await manager(fixture, "errors", d, pushes: false, connection: quick)
        let descriptor = ChannelDescriptor(name: "Ops")

        // Refusals: expired, wrong channel, untrusted CA, nobody listening.
        m.requestJoinChannel(channelUUID: id, descriptor: descriptor, credentials: fixture.credentials(try await fixture.token("ann", ttl: -60)))
        #expect(await d.wait(for: .failedToJoin(.unknown)))
        #expect(d.errors.withLockedValue { $0.last?.refusal } == .tokenExpired)
        #expect(m.activeChannelUUID == nil)
        let other = UUID()
        m.requestJoinChannel(channelUUID: other, descriptor: descriptor, credentials: fixture.credentials(try await fixture.token("ann")))
        #expect(await d.wait(for: .failedToJoin(.channelNotFound)))
        let strangerCA = fixture.directory + "/stranger.pem"
        try TestPKI(name: "Stranger CA").ca.serializeAsPEM().pemString.write(toFile: strangerCA, atomically: true, encoding: .utf8)
        m.requestJoinChannel(channelUUID: id, descriptor: descriptor, credentials: fixture.credentials(try await fixture.token("ann"), caPath: strangerCA))
        #expect(await d.wait(for: .failedToJoin(.unknown), count: 2))
        let caMessage = d.errors.withLockedValue { $0.last?.message ?? "" }
        #expect(caMessage.contains("certificate"), "\(caMessage)")
        m.requestJoinChannel(channelUUID: id, descriptor: descriptor,
                             credentials: ChannelCredentials(host: "127.0.0.1", port: 9, caPath: fixture.caPath, token: "x"))
        #expect(await d.wait(for: .failedToJoin(.unknown), count: 3))
        #expect(d.errors.withLockedValue { $0.last?.message.contains("check that it runs") } == true)
        m.setAppState(.background)
        m.requestJoinChannel(channelUUID: id, descriptor: descriptor, credentials: fixture.credentials(try await fixture.token("ann")))
        #expect(await d.wait(for: .failedToJoin(.appNotForeground)))
        m.setAppState(.foreground)

        // Joined: the transmit errors.
        m.requestJoinChannel(channelUUID: id, descriptor: descriptor, credentials: fixture.credentials(try await fixture.token("ann")))
        #expect(await d.wait(for: .didJoin(.developerRequest)))
        m.requestJoinChannel(channelUUID: UUID(), descriptor: descriptor, credentials: fixture.credentials(try await fixture.token("ann")))
        #expect(await d.wait(for: .failedToJoin(.channelLimitReached)))
        m.stopTransmitting(channelUUID: id)
        #expect(await d.wait(for: .failedToStop(.transmissionNotFound)))
        m.leaveChannel(channelUUID: UUID())
        #expect(await d.wait(for: .failedToLeave(.channelNotFound)))
        m.requestBeginTransmitting(channelUUID: UUID())
        #expect(await d.wait(for: .failedToBegin(.channelNotFound)))
        m.setSystemCallActive(true)
        m.requestBeginTransmitting(channelUUID: id)
        #expect(await d.wait(for: .failedToBegin(.callActive)))
        m.setSystemCallActive(false)
        m.setAppState(.background)
        m.requestBeginTransmitting(channelUUID: id)
        #expect(await d.wait(for: .failedToBegin(.appNotForeground)))
        // An accessory button may start a transmission from the background.
        m.accessoryButton(pressed: true, channelUUID: id)
        #expect(await d.wait(for: .didBegin(.handsfreeButton)))
        m.accessoryButton(pressed: false, channelUUID: id)
        #expect(await d.wait(for: .didEnd(.handsfreeButton)))
        m.setAppState(.foreground)
        try await m.setTransmissionMode(.listenOnly, channelUUID: id)
        m.requestBeginTransmitting(channelUUID: id)
        #expect(await d.wait(for: .failedToBegin(.transmissionNotAllowed)))
        try await m.setTransmissionMode(.halfDuplex, channelUUID: id)
        await #expect(throws: ChannelError.self) { try await m.setServiceStatus(.ready, channelUUID: UUID()) }

        // Someone else holds the floor: busy.
        let bobDelegate = RecordingDelegate()
        let bob = try await manager(fixture, "bob-errors", bobDelegate, pushes: false)
        bob.requestJoinChannel(channelUUID: id, descriptor: descriptor, credentials: fixture.credentials(try await fixture.token("bob")))
        #expect(await bobDelegate.wait(for: .didJoin(.developerRequest)))
        bob.requestBeginTransmitting(channelUUID: id)
        #expect(await bobDelegate.wait(for: .didBegin(.developerRequest)))
        #expect(await eventually { m.activeRemoteParticipant?.name == "Bob" })
        await #expect(throws: ChannelError.self) { try await bob.setActiveRemoteParticipant(try Participant(name: "X"), channelUUID: id) }
        // Asking while Bob talks queues (MCPTT); his release grants it. (A refusal for "busy" maps to
        // transmissionInProgress, checked in ChannelSessionTests, as this server queues instead.)
        let events = EventLog(m)
        m.requestBeginTransmitting(channelUUID: id)
        #expect(await eventually { events.all.contains(.floorQueued(position: 1)) })
        bob.stopTransmitting(channelUUID: id)
        #expect(await d.wait(for: .didBegin(.developerRequest)))
        m.requestBeginTransmitting(channelUUID: id)
        #expect(await d.wait(for: .failedToBegin(.transmissionInProgress)), "already transmitting")
        m.stopTransmitting(channelUUID: id)
        #expect(await d.wait(for: .didEnd(.developerRequest)))

        // A listen-only token is listen-only mode.
        let carol = RecordingDelegate()
        let c = try await manager(fixture, "carol", carol, pushes: false)
        c.requestJoinChannel(channelUUID: id, descriptor: descriptor, credentials: fixture.credentials(try await fixture.token("carol", capabilities: [.listen])))
        #expect(await carol.wait(for: .didJoin(.developerRequest)))
        #expect(c.transmissionMode == .listenOnly)
        c.requestBeginTransmitting(channelUUID: id)
        #expect(await carol.wait(for: .failedToBegin(.transmissionNotAllowed)))

        // The completion-handler form reports the same errors.
        let (stream, done) = AsyncStream.makeStream(of: String.self)
        c.setChannelDescriptor(descriptor, channelUUID: UUID()) { error in
            done.yield((error as? ChannelError)?.code == .channelNotFound ? "channelNotFound" : "\(String(describing: error))")
        }
        var iterator = stream.makeAsyncIterator()
        #expect(await iterator.next() == "channelNotFound")

        for manager in [m, bob, c] { await manager.invalidate() }
        await fixture.stop()
    }

    @Test func oneManagerPerAppAndAConcurrentCallIsRefused() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("ptt-instance-\(UUID())").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        // A record without a descriptor makes the factory ask the restoration delegate, which blocks
        // here until the second call has been refused: the first call is then surely in progress.
        try RestorationStore(directory: directory).save(RestorationRecord(
            channel: UUID(), descriptor: nil, credentials: ChannelCredentials(host: "127.0.0.1", port: 9, caPath: "/nonexistent", token: "t"),
            pushToken: nil))
        let gate = DispatchSemaphore(value: 0)
        let blocking = BlockingRestorationDelegate(gate: gate)
        let configuration = ChannelManagerConfiguration(stateDirectory: directory)
        let first = Task { try await ChannelManager.channelManager(delegate: blocking, restorationDelegate: blocking, configuration: configuration) }
        while !blocking.asked.withLockedValue({ $0 }) { try await Task.sleep(for: .milliseconds(5)) }
        do {
            _ = try await ChannelManager.channelManager(delegate: blocking, restorationDelegate: blocking, configuration: configuration)
            Issue.record("a second, concurrent call got a manager")
        } catch {
            #expect(error.code == .instantiationAlreadyInProgress)
        }
        gate.signal()
        let manager = try await first.value
        let again = try await ChannelManager.channelManager(delegate: blocking, restorationDelegate: blocking, configuration: configuration)
        #expect(manager === again)
        #expect(manager.activeChannelUUID != nil, "the record's channel is being restored")
        await manager.invalidate()
    }

    @Test func aCorruptRestorationFileIsSetAsideWithAClearError() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("ptt-corrupt-\(UUID())").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        try Data("{\"channel\": 12, garbage".utf8).write(to: URL(fileURLWithPath: directory + "/channel.json"))
        let d = RecordingDelegate()
        let manager = try await ChannelManager.channelManager(delegate: d, restorationDelegate: d,
                                                              configuration: ChannelManagerConfiguration(stateDirectory: directory))
        guard case .corrupt(.channel, _, let aside, let why)? = manager.restorationError else {
            Issue.record("no restoration error: \(String(describing: manager.restorationError))")
            return
        }
        #expect(FileManager.default.fileExists(atPath: aside) && !FileManager.default.fileExists(atPath: directory + "/channel.json"))
        #expect(why.contains("JSON"))
        #expect(manager.activeChannelUUID == nil)
        await manager.invalidate()
    }

    @Test func pushWakesASuspendedListenerWhoHearsTheBurstFromItsFirstFrame() async throws {
        let fixture = try await ClientFixture()
        let annDelegate = RecordingDelegate()
        // The woken app takes 400 ms to answer (a cold start), so the burst has begun without Bob.
        let bobDelegate = wokenDelegate(answeringAfter: 0.4)
        let ann = try await manager(fixture, "wake-ann", annDelegate, audio: speech(1.0))
        let bob = try await manager(fixture, "wake-bob", bobDelegate, audio: recorder(fixture.directory + "/woken.wav"))
        let bobEvents = EventLog(bob)
        let id = fixture.channel.id
        ann.requestJoinChannel(channelUUID: id, descriptor: ChannelDescriptor(name: "Ops"), credentials: fixture.credentials(try await fixture.token("ann")))
        bob.requestJoinChannel(channelUUID: id, descriptor: ChannelDescriptor(name: "Ops"), credentials: fixture.credentials(try await fixture.token("bob")))
        #expect(await annDelegate.wait(for: .didJoin(.developerRequest)))
        #expect(await bobDelegate.wait(for: .pushToken(32)))
        let simulator = try #require(fixture.listening.apnsSimulator)
        // The server has Bob's token once it said so; then Bob goes to sleep.
        try await Task.sleep(for: .milliseconds(300))
        bob.suspend()
        #expect(await eventually { ann.roster.first { $0.userID == "bob" }?.connection != .connected })
        #expect(bob.isSuspended && bob.activeChannelUUID == id)

        ann.requestBeginTransmitting(channelUUID: id)
        #expect(await bobDelegate.wait(for: .push("Ann")), "the pushtotalk push reached the device")
        #expect(await bobDelegate.wait(for: .didActivate))
        #expect(simulator.acceptedPushes().count == 1)
        try await Task.sleep(for: .seconds(1.2))
        ann.stopTransmitting(channelUUID: id)
        let finished = await eventually { !bobEvents.finishedBursts.isEmpty }
        let bobNow = await bob.statistics()
        #expect(finished, "bob: \(bobDelegate.all) \(bobEvents.all.suffix(12)) \(bobNow)")
        let sent = await ann.statistics().framesSent
        let burst = try #require(bobEvents.finishedBursts.first)
        #expect(burst.catchUp > 0, "the start of the burst came as catch-up")
        if !(burst.lost == 0 && burst.played == sent) {
            // This failed intermittently under the full suite's load while audio reached the jitter
            // buffer through a task on the shared cooperative pool (the delegate's sleep below holds one
            // of its two threads). If it comes back, say where the frames went; the server's counters
            // are published once a second, so they may lag.
            let metrics = (try? await URLSession.shared.data(from: URL(string: "http://127.0.0.1:\(fixture.listening.adminPort)/metrics")!))
                .map { String(decoding: $0.0, as: UTF8.self) } ?? ""
            let relevant = metrics.split(separator: "\n").filter {
                !$0.hasPrefix("#") && ($0.contains("drop") || $0.contains("packets") || $0.contains("catch") || $0.contains("connections"))
            }
            Issue.record("every frame from the first: \(burst), sent \(sent); bob: \(bobEvents.all.suffix(20)); server: \(relevant)")
        }
        #expect(!bob.isSuspended && bob.serviceStatus == .ready)
        await ann.invalidate()
        await bob.invalidate()
        await fixture.stop()
    }

    /// A first join (no push, no restoration) in the middle of a burst hears it from its first frame:
    /// the server's catch-up follows `joined` at once, and playout must already be taking it.
    /// (Playout used to start at `didJoin`, after the restoration record's write, and lost the first
    /// of the catch-up packets.)
    @Test func aFirstJoinMidBurstHearsItFromItsFirstFrame() async throws {
        let fixture = try await ClientFixture()
        let annDelegate = RecordingDelegate(), bobDelegate = RecordingDelegate()
        var annAudio = speech(1.5)
        annAudio.endTransmissionWhenInputEnds = true
        let ann = try await manager(fixture, "first-ann", annDelegate, audio: annAudio)
        let bob = try await manager(fixture, "first-bob", bobDelegate, audio: recorder(fixture.directory + "/first.wav"))
        let bobEvents = EventLog(bob)
        let id = fixture.channel.id
        ann.requestJoinChannel(channelUUID: id, descriptor: ChannelDescriptor(name: "Ops"), credentials: fixture.credentials(try await fixture.token("ann")))
        #expect(await annDelegate.wait(for: .didJoin(.developerRequest)))
        ann.requestBeginTransmitting(channelUUID: id)
        #expect(await annDelegate.wait(for: .didBegin(.developerRequest)))
        try await Task.sleep(for: .milliseconds(600))
        bob.requestJoinChannel(channelUUID: id, descriptor: ChannelDescriptor(name: "Ops"), credentials: fixture.credentials(try await fixture.token("bob")))
        #expect(await bobDelegate.wait(for: .didJoin(.developerRequest)))
        #expect(await annDelegate.wait(for: .didEnd(.developerRequest)), "the 1.5 s file ended the burst")
        let finished = await eventually { !bobEvents.finishedBursts.isEmpty }
        #expect(finished, "bob: \(bobDelegate.all) \(bobEvents.all.suffix(12))")
        let sent = await ann.statistics().framesSent
        let burst = try #require(bobEvents.finishedBursts.first)
        #expect(burst.catchUp > 20 && burst.played + burst.fec >= sent - 1, "\(burst), sent \(sent)")
        await ann.invalidate()
        await bob.invalidate()
        await fixture.stop()
    }

    /// A short burst is over before the woken phone has joined: the server replays it, the listener
    /// hears every frame of it, and shows its talker while it plays (not the blank a join finding
    /// nobody talking would leave), then nobody.
    @Test func aWokenListenerHearsAndShowsAShortBurstThatEndedBeforeItJoined() async throws {
        let fixture = try await ClientFixture()
        let annDelegate = RecordingDelegate()
        // The woken app takes 1.2 s to answer (a cold start): Ann's 0.5 s burst is over by then.
        let bobDelegate = wokenDelegate(answeringAfter: 1.2)
        var annAudio = speech(0.5)
        annAudio.endTransmissionWhenInputEnds = true
        let ann = try await manager(fixture, "short-ann", annDelegate, audio: annAudio)
        let bob = try await manager(fixture, "short-bob", bobDelegate, audio: recorder(fixture.directory + "/short.wav"))
        let bobEvents = EventLog(bob)
        let id = fixture.channel.id
        ann.requestJoinChannel(channelUUID: id, descriptor: ChannelDescriptor(name: "Ops"), credentials: fixture.credentials(try await fixture.token("ann")))
        bob.requestJoinChannel(channelUUID: id, descriptor: ChannelDescriptor(name: "Ops"), credentials: fixture.credentials(try await fixture.token("bob")))
        #expect(await annDelegate.wait(for: .didJoin(.developerRequest)))
        #expect(await bobDelegate.wait(for: .pushToken(32)))
        try await Task.sleep(for: .milliseconds(300))
        bob.suspend()
        #expect(await eventually { ann.roster.first { $0.userID == "bob" }?.connection != .connected })

        ann.requestBeginTransmitting(channelUUID: id)
        #expect(await annDelegate.wait(for: .didEnd(.developerRequest)), "the 0.5 s file ended the burst")
        #expect(await bobDelegate.wait(for: .push("Ann")), "the pushtotalk push reached the device")
        let finished = await eventually { !bobEvents.finishedBursts.isEmpty }
        #expect(finished, "bob: \(bobDelegate.all) \(bobEvents.all.suffix(12))")
        let sent = await ann.statistics().framesSent
        let burst = try #require(bobEvents.finishedBursts.first)
        #expect(burst.catchUp > 0 && burst.played + burst.fec >= sent - 1, "\(burst), sent \(sent)")
        // Ann is shown while the replay plays: the speaker goes to nobody only once it has played. (Ann
        // may be shown throughout, from the push on, or the join may clear her for the moment before
        // the replay starts; either way, the last change comes after the burst finished playing. A
        // client that only trusted the join cleared her before the replay played.)
        #expect(await eventually { bob.activeRemoteParticipant == nil })
        let events = bobEvents.all
        let speakers = events.compactMap { if case .activeRemoteParticipant(let p) = $0 { return p?.name ?? "-" } else { return nil } }
        let lastCleared = try #require(events.lastIndex(of: .activeRemoteParticipant(nil)), "\(speakers)")
        let played = try #require(events.firstIndex { if case .burstFinished = $0 { true } else { false } })
        #expect(lastCleared > played, "cleared before the replay had played: \(speakers)")
        #expect(speakers.dropLast().last == "Ann", "\(speakers)")
        await ann.invalidate()
        await bob.invalidate()
        await fixture.stop()
    }

    /// Full duplex: two members talk at once and a listener hears both, mixed. Ann speaks a 440 Hz
    /// tone, Cy a 1,000 Hz one from 300 ms later; each must be heard for most of its second and a
    /// half. (A single jitter buffer switched to whichever talker's packet came last and dropped the
    /// other's as late: Ann's tone was then heard for 300 ms.)
    @Test func aListenerHearsTwoTalkersAtOnceInFullDuplex() async throws {
        let fixture = try await ClientFixture(mode: .fullDuplex, pushes: false)
        let id = fixture.channel.id
        func tone(_ frequency: Double) -> AudioConfiguration {
            let samples = (0..<72_000).map { Int16(8_000 * sin(2 * .pi * frequency * Double($0) / 48_000)) }
            return AudioConfiguration(makeInput: { WAVFileSource(pipelineSamples: samples, pacer: RealTimePacer()) })
        }
        let heard = fixture.directory + "/duplex.wav"
        let annDelegate = RecordingDelegate(), cyDelegate = RecordingDelegate(), bobDelegate = RecordingDelegate()
        let ann = try await manager(fixture, "fd-ann", annDelegate, audio: tone(440), pushes: false)
        let cy = try await manager(fixture, "fd-cy", cyDelegate, audio: tone(1_000), pushes: false)
        let bob = try await manager(fixture, "fd-bob", bobDelegate, audio: recorder(heard), pushes: false)
        let bobEvents = EventLog(bob)
        for (name, member, delegate) in [("ann", ann, annDelegate), ("cy", cy, cyDelegate), ("bob", bob, bobDelegate)] {
            member.requestJoinChannel(channelUUID: id, descriptor: ChannelDescriptor(name: "Ops"), credentials: fixture.credentials(try await fixture.token(name)))
            #expect(await delegate.wait(for: .didJoin(.developerRequest)))
        }
        #expect(await eventually { bob.roster.count == 3 })
        ann.requestBeginTransmitting(channelUUID: id)
        #expect(await annDelegate.wait(for: .didBegin(.developerRequest)))
        try await Task.sleep(for: .milliseconds(300))
        cy.requestBeginTransmitting(channelUUID: id)
        #expect(await cyDelegate.wait(for: .didBegin(.developerRequest)), "full duplex grants a second talker")
        try await Task.sleep(for: .seconds(1.8))
        ann.stopTransmitting(channelUUID: id)
        cy.stopTransmitting(channelUUID: id)
        #expect(await eventually { bobEvents.finishedBursts.count == 2 })
        await ann.invalidate()
        await cy.invalidate()
        await bob.invalidate()
        // 20 ms windows in which each tone is present (a one-bin DFT at its frequency).
        let audio = try WAVAudio.read(path: heard).pipelineSamples(resampler: Resampler())
        func windows(_ frequency: Double) -> [Int] {
            stride(from: 0, to: audio.count - 960, by: 960).filter { start in
                var re = 0.0, im = 0.0
                for i in 0..<960 {
                    let phase = 2 * .pi * frequency * Double(i) / 48_000
                    re += Double(audio[start + i]) * cos(phase)
                    im -= Double(audio[start + i]) * sin(phase)
                }
                return (re * re + im * im).squareRoot() * 2 / 960 > 2_000
            }
        }
        let annWindows = windows(440), cyWindows = windows(1_000)
        #expect(annWindows.count >= 55 && cyWindows.count >= 55, "ann's tone in \(annWindows.count) windows, cy's in \(cyWindows.count) (75 each spoken)")
        // Mixed, not one after the other: both at once for most of the 1.2 s they overlapped.
        let both = Set(annWindows).intersection(cyWindows).count
        #expect(both >= 40, "both tones in \(both) windows (about 60 overlap)")
        await fixture.stop()
    }

    /// A WAV file as the microphone: when it runs out, the transmission it fed ends by itself (the
    /// floor is released at once, not taken back by the server 5 s later).
    @Test func aTransmissionEndsWithItsInputFile() async throws {
        let fixture = try await ClientFixture(pushes: false)
        let id = fixture.channel.id
        let annDelegate = RecordingDelegate(), bobDelegate = RecordingDelegate()
        var audio = speech(0.6)
        audio.endTransmissionWhenInputEnds = true
        let ann = try await manager(fixture, "eof-ann", annDelegate, audio: audio, pushes: false)
        let bob = try await manager(fixture, "eof-bob", bobDelegate, pushes: false)
        let annEvents = EventLog(ann)
        for (name, member, delegate) in [("ann", ann, annDelegate), ("bob", bob, bobDelegate)] {
            member.requestJoinChannel(channelUUID: id, descriptor: ChannelDescriptor(name: "Ops"), credentials: fixture.credentials(try await fixture.token(name)))
            #expect(await delegate.wait(for: .didJoin(.developerRequest)))
        }
        let began = ContinuousClock.now
        ann.requestBeginTransmitting(channelUUID: id)
        #expect(await annDelegate.wait(for: .didBegin(.developerRequest)))
        #expect(await eventually { bob.activeRemoteParticipant?.name == "Ann" })
        #expect(await annDelegate.wait(for: .didEnd(.developerRequest)), "the file's end ended it")
        #expect(ContinuousClock.now - began < .seconds(3), "well before the server's 5 s silence limit")
        #expect(await eventually { bob.activeRemoteParticipant == nil }, "the floor was released")
        #expect(annEvents.all.contains(.inputEnded))
        #expect(!annEvents.all.contains { if case .transmissionRevoked = $0 { true } else { false } })
        await ann.invalidate()
        await bob.invalidate()
        await fixture.stop()
    }

    @Test func aMemberWhoMutesTheChannelShowsAsMutedToEveryone() async throws {
        let fixture = try await ClientFixture(pushes: false)
        let id = fixture.channel.id
        let annDelegate = RecordingDelegate(), bobDelegate = RecordingDelegate()
        let ann = try await manager(fixture, "mute-ann", annDelegate, pushes: false)
        let bob = try await manager(fixture, "mute-bob", bobDelegate, pushes: false)
        ann.requestJoinChannel(channelUUID: id, descriptor: ChannelDescriptor(name: "Ops"), credentials: fixture.credentials(try await fixture.token("ann")))
        bob.requestJoinChannel(channelUUID: id, descriptor: ChannelDescriptor(name: "Ops"), credentials: fixture.credentials(try await fixture.token("bob")))
        #expect(await annDelegate.wait(for: .didJoin(.developerRequest)))
        #expect(await bobDelegate.wait(for: .didJoin(.developerRequest)))
        #expect(await eventually { bob.roster.first { $0.userID == "ann" }?.muted == false })
        ann.setPlaybackMuted(true)
        #expect(await eventually { bob.roster.first { $0.userID == "ann" }?.muted == true }, "Bob sees that Ann will not hear him")
        #expect(await eventually { ann.roster.first { $0.userID == "ann" }?.muted == true })
        ann.setPlaybackMuted(false)
        #expect(await eventually { bob.roster.first { $0.userID == "ann" }?.muted == false })
        await ann.invalidate()
        await bob.invalidate()
        await fixture.stop()
    }

    @Test func theSubscriptionStrategyKeepsUnwantedTalkersOffTheWire() async throws {
        let fixture = try await ClientFixture(pushes: false)
        let id = fixture.channel.id
        let annDelegate = RecordingDelegate(), bobDelegate = RecordingDelegate()
        let ann = try await manager(fixture, "sub-ann", annDelegate, audio: speech(0.5), pushes: false)
        let bob = try await manager(fixture, "sub-bob", bobDelegate, audio: recorder(fixture.directory + "/sub.wav"), pushes: false)
        let bobEvents = EventLog(bob)
        bob.setSubscriptionStrategy(IgnoreRole(role: "dispatcher"))
        ann.requestJoinChannel(channelUUID: id, descriptor: ChannelDescriptor(name: "Ops"),
                               credentials: fixture.credentials(try await fixture.token("ann", role: "dispatcher")))
        bob.requestJoinChannel(channelUUID: id, descriptor: ChannelDescriptor(name: "Ops"), credentials: fixture.credentials(try await fixture.token("bob")))
        #expect(await bobDelegate.wait(for: .didJoin(.developerRequest)))
        #expect(await annDelegate.wait(for: .didJoin(.developerRequest)))
        #expect(await eventually { bob.roster.first { $0.userID == "ann" }?.subscribe == SubscribeType.none })
        ann.requestBeginTransmitting(channelUUID: id)
        #expect(await annDelegate.wait(for: .didBegin(.developerRequest)))
        try await Task.sleep(for: .seconds(0.8))
        ann.stopTransmitting(channelUUID: id)
        try await Task.sleep(for: .milliseconds(300))
        #expect(bobEvents.finishedBursts.isEmpty, "nothing from Ann reached Bob")
        #expect(!bobDelegate.all.contains(.didActivate))
        // Changing the strategy and refreshing lets her through.
        bob.setSubscriptionStrategy(SubscribeToAll())
        #expect(await eventually { bob.roster.first { $0.userID == "ann" }?.subscribe == .audio })
        ann.requestBeginTransmitting(channelUUID: id)
        #expect(await bobDelegate.wait(for: .didActivate))
        try await Task.sleep(for: .seconds(0.8))
        ann.stopTransmitting(channelUUID: id)
        #expect(await eventually { !bobEvents.finishedBursts.isEmpty })
        await ann.invalidate()
        await bob.invalidate()
        await fixture.stop()
    }
}

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

@Suite struct CredentialsTests {
    /// The credentials are saved for restoration; an app restored from another directory (a service,
    /// a shell elsewhere) must still find its CA.
    @Test func aRelativeCAPathIsMadeAbsoluteAgainstTheCurrentDirectory() throws {
        let here = FileManager.default.currentDirectoryPath
        let relative = ChannelCredentials(host: "127.0.0.1", port: 7700, caPath: "certs/../certs/ca.pem", token: "t")
        #expect(relative.caPath == URL(fileURLWithPath: here).appendingPathComponent("certs/ca.pem").standardizedFileURL.path)
        #expect(relative.caPath.hasPrefix("/"))
        let absolute = ChannelCredentials(host: "127.0.0.1", port: 7700, caPath: "/etc/squelch/ca.pem", token: "t")
        #expect(absolute.caPath == "/etc/squelch/ca.pem")
        // Saved and read back as it was made.
        let saved = try JSONDecoder().decode(ChannelCredentials.self, from: JSONEncoder().encode(relative))
        #expect(saved == relative)
    }
}

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

/// The transport's promises under a bad link, through the seeded impairment proxy (real UDP): loss with
/// FEC and concealment, and a NAT rebinding in the middle of a burst, which the connection survives
/// by migrating to the new address without a new handshake.
@Suite(.serialized, .timeLimit(.minutes(2))) struct ImpairedLinkTests {
    /// The loop of §16.4.4 with real parts: a listener behind a lossy link measures its loss, reports
    /// it, the server tells the talker, and the talker's encoder turns FEC on within the burst, and
    /// starts its next burst with it.
    @Test func aLossyListenerGetsTheTalkerToAddFEC() async throws {
        let fixture = try await ClientFixture(pushes: false)
        let id = fixture.channel.id
        let (proxy, port) = try await fixture.proxy(clientToServer: Impairment(seed: 3), serverToClient: Impairment(lossPercent: 15, seed: 4))
        let annDelegate = RecordingDelegate(), bobDelegate = RecordingDelegate()
        let helpers = ChannelManagerTests()
        let ann = try await helpers.manager(fixture, "fec-ann", annDelegate, audio: helpers.speech(6), pushes: false)
        let bob = try await helpers.manager(fixture, "fec-bob", bobDelegate, audio: helpers.recorder(fixture.directory + "/fec.wav"), pushes: false)
        let annEvents = EventLog(ann), bobEvents = EventLog(bob)
        ann.requestJoinChannel(channelUUID: id, descriptor: ChannelDescriptor(name: "Ops"), credentials: fixture.credentials(try await fixture.token("ann")))
        var lossy = fixture.credentials(try await fixture.token("bob"))
        lossy.port = port
        bob.requestJoinChannel(channelUUID: id, descriptor: ChannelDescriptor(name: "Ops"), credentials: lossy)
        #expect(await annDelegate.wait(for: .didJoin(.developerRequest)))
        #expect(await bobDelegate.wait(for: .didJoin(.developerRequest)))
        #expect(await ann.statistics().encoder == nil, "no encoder before the first burst")
        ann.requestBeginTransmitting(channelUUID: id)
        #expect(await annDelegate.wait(for: .didBegin(.developerRequest)))
        #expect(await eventually { await ann.statistics().encoder == OpusConfiguration.pushToTalk }, "a clean start: no FEC")
        func toldLoss() -> [Int] { annEvents.all.compactMap { if case .listenerLoss(let p) = $0 { return p } else { return nil } } }
        // Bob's first window is 1 s of audio; the report, the server and Ann's next frame take a moment.
        #expect(await eventually(seconds: 6) { toldLoss().contains { $0 >= 5 } }, "told \(toldLoss())")
        // The capture thread reports what its encoder was reconfigured to, in the middle of the burst.
        func protected(_ c: OpusConfiguration?) -> Bool { c.map { $0.inbandFEC && $0.expectedPacketLossPercent >= 10 && $0.bitrate == 40_000 } ?? false }
        let adapted = await eventually(seconds: 2) { protected(await ann.statistics().encoder) }
        let now = await ann.statistics().encoder
        #expect(adapted, "encoder now: \(String(describing: now))")
        ann.stopTransmitting(channelUUID: id)
        #expect(await annDelegate.wait(for: .didEnd(.developerRequest)))
        #expect(await eventually { !bobEvents.finishedBursts.isEmpty })
        #expect(await eventually { await ann.statistics().encoder == nil })
        // The next burst's encoder is made protected: the figure outlives the burst.
        ann.requestBeginTransmitting(channelUUID: id)
        #expect(await eventually { await ann.statistics().encoder != nil })
        #expect(protected(await ann.statistics().encoder), "the next burst starts protected")
        ann.stopTransmitting(channelUUID: id)
        // Bob never hears his own figure: it is for talkers only.
        #expect(!bobEvents.all.contains { if case .listenerLoss = $0 { return true } else { return false } })
        await ann.invalidate()
        await bob.invalidate()
        await proxy.stop()
        await fixture.stop()
    }

    /// Ann's manager (state directory `state`, timers from `connection`), joined to the fixture's
    /// channel through the impairment proxy at `port` and ready.
    func joinAnn(_ fixture: ClientFixture, port: Int, state: String, connection: ConnectionConfiguration = .client)
        async throws -> (ChannelManager, RecordingDelegate, EventLog) {
        let delegate = RecordingDelegate()
        let ann = try await ChannelManager.channelManager(delegate: delegate, restorationDelegate: delegate, configuration: ChannelManagerConfiguration(
            stateDirectory: fixture.stateDirectory(state), connection: connection))
        let events = EventLog(ann)
        var credentials = fixture.credentials(try await fixture.token("ann"))
        credentials.port = port
        ann.requestJoinChannel(channelUUID: fixture.channel.id, descriptor: ChannelDescriptor(name: "Ops"), credentials: credentials)
        #expect(await delegate.wait(for: .didJoin(.developerRequest)))
        #expect(ann.serviceStatus == .ready)
        return (ann, delegate, events)
    }

    /// The client's keepalive and liveness shortened from 5 s and 20 s, so that a dead path is
    /// noticed, and given up, in seconds.
    static var quickLiveness: ConnectionConfiguration {
        var connection = ConnectionConfiguration.client
        connection.keepAliveInterval = 500_000_000
        connection.livenessTimeout = 1_500_000_000
        return connection
    }

    @Test func aServerThatStopsAnsweringShowsAsConnectingThenReadyAgain() async throws {
        let fixture = try await ClientFixture(pushes: false)
        let (proxy, port) = try await fixture.proxy()
        let (ann, delegate, events) = try await joinAnn(fixture, port: port, state: "liveness", connection: Self.quickLiveness)
        // The path dies for 3 s (a crashed server or a dead network look the same from here).
        await proxy.blackhole(for: .seconds(3))
        #expect(await eventually(seconds: 5) { ann.serviceStatus == .connecting }, "noticed long before the 300 s idle timeout")
        #expect(await eventually(seconds: 15) { ann.serviceStatus == .ready }, "back once the path is")
        // The snapshot is updated before the event reaches the log's reader: wait for the event too.
        func statusEvents() -> [PTTClient.ServiceStatus] { events.all.compactMap { if case .serviceStatus(let status) = $0 { return status } else { return nil } } }
        #expect(await eventually(seconds: 2) { statusEvents().last == .ready }, "\(statusEvents())")
        let statuses = statusEvents()
        // The client reconnects by itself: no detour through `unavailable` (which would also mean a
        // second connection opened after the backoff), and no second didJoin.
        #expect(!statuses.contains(.unavailable), "\(statuses)")
        #expect(statuses.suffix(2) == [.connecting, .ready], "\(statuses)")
        #expect(delegate.calls.withLockedValue { $0.filter { $0 == .didJoin(.developerRequest) }.count } == 1)
        await ann.invalidate()
        await proxy.stop()
        await fixture.stop()
    }

    /// squelchd shutting down (SIGTERM, a restart) closes with "going away": the client says that,
    /// not only, as before, the failures of its reconnecting ("no answer … check that it runs").
    @Test func aServerShuttingDownIsSaidAsSuch() async throws {
        let fixture = try await ClientFixture(pushes: false)
        let (ann, _, events) = try await joinAnn(fixture, port: fixture.listening.voicePort, state: "going-away")
        await fixture.stop()
        #expect(await eventually(seconds: 5) {
            events.all.contains { if case .notice(let text) = $0 { text.contains("is going away (server shutting down)") } else { false } }
        }, "\(events.all)")
        await ann.invalidate()
    }

    @Test func aPressWhileReconnectingTalksOnceTheChannelIsBack() async throws {
        let fixture = try await ClientFixture(pushes: false)
        let id = fixture.channel.id
        let (proxy, port) = try await fixture.proxy()
        // With quick liveness, the client gives the connection up and handshakes again (status
        // `connecting`) while the path is still dead.
        let (ann, delegate, _) = try await joinAnn(fixture, port: port, state: "press-reconnecting", connection: Self.quickLiveness)
        await proxy.blackhole(for: .seconds(30))
        #expect(await eventually(seconds: 5) { ann.serviceStatus == .connecting })
        // The user presses while the channel is being rejoined (as walkie does just back from the
        // background): held, and granted once rejoined, with no second press. The path comes back
        // right after the press, so the handshake's next resend (about a second on) gets through
        // well within the press's 4 s, however slow this machine is.
        ann.requestBeginTransmitting(channelUUID: id)
        await proxy.blackhole(for: .zero)
        #expect(await delegate.wait(for: .didBegin(.developerRequest), seconds: 8), "\(delegate.all)")
        #expect(!delegate.all.contains(.failedToBegin(.transmissionNotAllowed)), "\(delegate.errors.withLockedValue { $0 })")
        #expect(delegate.all.filter { $0 == .didJoin(.developerRequest) }.count == 1, "rejoined, not joined again")
        ann.stopTransmitting(channelUUID: id)
        #expect(await delegate.wait(for: .didEnd(.developerRequest)))
        await ann.invalidate()
        await proxy.stop()
        await fixture.stop()
    }

    @Test func aFloorRequestIntoASilentServerFailsInSecondsAndTheChannelCarriesOnWhenItAnswers() async throws {
        let fixture = try await ClientFixture(pushes: false)
        let id = fixture.channel.id
        let (proxy, port) = try await fixture.proxy()
        // The client's own timers: keepalive 5 s, stall 3 s, liveness 20 s.
        let (ann, delegate, events) = try await joinAnn(fixture, port: port, state: "stall")
        // The server stops answering (crashed, or the path died) just as Ann presses to talk.
        await proxy.blackhole(for: .seconds(7))
        let pressed = Date()
        ann.requestBeginTransmitting(channelUUID: id)
        #expect(await delegate.wait(for: .failedToBegin(.transmissionNotAllowed), seconds: 6), "\(delegate.all)")
        let told = Date().timeIntervalSince(pressed)
        #expect(told >= 2.9 && told < 5, "told after \(told) s, not at the 20 s liveness verdict")
        #expect(delegate.errors.withLockedValue { $0.last?.message.contains("did not answer") } == true)
        // The delegate hears first; the snapshot and the event log follow on their own tasks.
        #expect(await eventually(seconds: 2) { ann.serviceStatus == .connecting })
        #expect(await eventually(seconds: 2) {
            events.all.contains { if case .notice(let text) = $0 { return text.contains("stopped answering") } else { return false } }
        })
        // Meanwhile another press is refused at once, with the reason.
        ann.requestBeginTransmitting(channelUUID: id)
        #expect(await delegate.wait(for: .failedToBegin(.transmissionNotAllowed), count: 2, seconds: 1))
        #expect(delegate.errors.withLockedValue { $0.last?.message.contains("connecting") } == true)
        // The server answers again: the same session carries on (no rejoin, never `unavailable`), and
        // the withdrawn request left the floor free.
        #expect(await eventually(seconds: 10) { ann.serviceStatus == .ready })
        let statuses = events.all.compactMap { if case .serviceStatus(let status) = $0 { return status } else { return nil } }
        #expect(!statuses.contains(.unavailable), "\(statuses)")
        #expect(delegate.all.filter { $0 == .didJoin(.developerRequest) }.count == 1)
        ann.requestBeginTransmitting(channelUUID: id)
        #expect(await delegate.wait(for: .didBegin(.developerRequest)), "\(delegate.all)")
        ann.stopTransmitting(channelUUID: id)
        #expect(await delegate.wait(for: .didEnd(.developerRequest)))
        await ann.invalidate()
        await proxy.stop()
        await fixture.stop()
    }

    @Test func aLeaveLostOnTheWayIsSentAgainBeforeTheConnectionCloses() async throws {
        let fixture = try await ClientFixture(pushes: false)
        let id = fixture.channel.id
        let (proxy, port) = try await fixture.proxy()
        let annDelegate = RecordingDelegate(), bobDelegate = RecordingDelegate()
        let ann = try await ChannelManager.channelManager(delegate: annDelegate, restorationDelegate: annDelegate, configuration: ChannelManagerConfiguration(
            stateDirectory: fixture.stateDirectory("leave-ann")))
        let bob = try await ChannelManager.channelManager(delegate: bobDelegate, restorationDelegate: bobDelegate, configuration: ChannelManagerConfiguration(
            stateDirectory: fixture.stateDirectory("leave-bob")))
        var credentials = fixture.credentials(try await fixture.token("ann"))
        credentials.port = port
        ann.requestJoinChannel(channelUUID: id, descriptor: ChannelDescriptor(name: "Ops"), credentials: credentials)
        bob.requestJoinChannel(channelUUID: id, descriptor: ChannelDescriptor(name: "Ops"), credentials: fixture.credentials(try await fixture.token("bob")))
        #expect(await annDelegate.wait(for: .didJoin(.developerRequest)))
        #expect(await bobDelegate.wait(for: .didJoin(.developerRequest)))
        #expect(await eventually { bob.roster.contains { $0.userID == "ann" } })
        // Ann's leave, and anything else she sends for the next 300 ms, is lost; and her app exits at
        // once, as `walkie leave` does.
        await proxy.blackhole(for: .milliseconds(300))
        ann.leaveChannel(channelUUID: id)
        await ann.invalidate()
        #expect(annDelegate.all.contains(.didLeave(.developerRequest)))
        #expect(await eventually(seconds: 5) { !bob.roster.contains { $0.userID == "ann" } },
                "the server heard the leave: Ann is out of the roster, not a connected member with a dead connection")
        // And the channel is forgotten on disk: the next start does not rejoin it.
        let again = try await ChannelManager.channelManager(delegate: annDelegate, restorationDelegate: annDelegate, configuration: ChannelManagerConfiguration(
            stateDirectory: fixture.stateDirectory("leave-ann")))
        #expect(again.activeChannelUUID == nil)
        await again.invalidate()
        await bob.invalidate()
        await proxy.stop()
        await fixture.stop()
    }

    @Test func aListenerBehindALossyRebindingNATStillHearsTheBurst() async throws {
        let fixture = try await ClientFixture(pushes: false)
        let id = fixture.channel.id
        let lossy = Impairment(lossPercent: 10, delayMilliseconds: 10, jitterMilliseconds: 10, seed: 7)
        let (proxy, port) = try await fixture.proxy(clientToServer: lossy, serverToClient: lossy)
        let annDelegate = RecordingDelegate(), bobDelegate = RecordingDelegate()
        let samples = TestSignal.speechLike(seconds: 2)
        let ann = try await ChannelManager.channelManager(delegate: annDelegate, restorationDelegate: annDelegate, configuration: ChannelManagerConfiguration(
            stateDirectory: fixture.stateDirectory("nat-ann"),
            audio: AudioConfiguration(makeInput: { WAVFileSource(pipelineSamples: samples, pacer: RealTimePacer()) })))
        let bob = try await ChannelManager.channelManager(delegate: bobDelegate, restorationDelegate: bobDelegate, configuration: ChannelManagerConfiguration(
            stateDirectory: fixture.stateDirectory("nat-bob"),
            audio: AudioConfiguration(makeOutput: { try WAVFileSink(path: fixture.directory + "/nat.wav", pacer: RealTimePacer()) })))
        let bobEvents = EventLog(bob)
        ann.requestJoinChannel(channelUUID: id, descriptor: ChannelDescriptor(name: "Ops"), credentials: fixture.credentials(try await fixture.token("ann")))
        var behindNAT = fixture.credentials(try await fixture.token("bob"))
        behindNAT.port = port
        bob.requestJoinChannel(channelUUID: id, descriptor: ChannelDescriptor(name: "Ops"), credentials: behindNAT)
        #expect(await annDelegate.wait(for: .didJoin(.developerRequest)))
        #expect(await bobDelegate.wait(for: .didJoin(.developerRequest)), "the handshake and join get through 10 % loss")
        ann.requestBeginTransmitting(channelUUID: id)
        #expect(await bobDelegate.wait(for: .didActivate))
        try await Task.sleep(for: .seconds(0.8))
        let rebound = await proxy.rebindAll()
        #expect(rebound == 1, "Bob's NAT mapping moved to a new port mid-burst")
        try await Task.sleep(for: .seconds(1.4))
        ann.stopTransmitting(channelUUID: id)
        #expect(await eventually { !bobEvents.finishedBursts.isEmpty })
        let sent = await ann.statistics().framesSent
        let burst = try #require(bobEvents.finishedBursts.first)
        // About 10 % of frames are lost on the way, FEC and concealment fill them, and the burst goes on
        // after the rebinding instead of timing out. What the server sends to the old port until it sees
        // the listener's new address is lost too: a few frames on an idle machine, up to about a second
        // under the full test suite's load, so the bound here is "most of the burst", not "all but 10 %".
        #expect(burst.played + burst.fec >= sent / 3 && burst.lost < sent / 2, "\(burst), sent \(sent)")
        #expect(burst.lost > 0, "the link lost frames: \(burst)")
        #expect(bob.serviceStatus == .ready, "no reconnect was needed")
        let stats = await proxy.stats()
        #expect(stats.rebinds == 1)
        await ann.invalidate()
        await bob.invalidate()
        await proxy.stop()
        await fixture.stop()
    }
}

/// Leaves the server could not hear at the time (suspended, or the network gone): delivered on a
/// connection of their own, kept on disk across a restart, withdrawn by a rejoin.
@Suite(.serialized, .timeLimit(.minutes(2))) struct OwedLeaveTests {
    func manager(_ fixture: ClientFixture, _ name: String, _ delegate: RecordingDelegate) async throws -> ChannelManager {
        try await ChannelManager.channelManager(delegate: delegate, restorationDelegate: delegate,
                                                configuration: ChannelManagerConfiguration(stateDirectory: fixture.stateDirectory(name)))
    }

    /// Ann (through `port`, a proxy's, when given) and Bob joined; then Ann suspends, and Bob sees
    /// her connection gone.
    struct Pair {
        let ann: ChannelManager, bob: ChannelManager
        let annDelegate: RecordingDelegate
        let annEvents: EventLog
        let credentials: ChannelCredentials
    }

    func suspendedAnnAndBob(_ fixture: ClientFixture, _ name: String, port: Int? = nil) async throws -> Pair {
        let id = fixture.channel.id
        let annDelegate = RecordingDelegate(), bobDelegate = RecordingDelegate()
        let ann = try await manager(fixture, name + "-ann", annDelegate)
        let bob = try await manager(fixture, name + "-bob", bobDelegate)
        let annEvents = EventLog(ann)
        var credentials = fixture.credentials(try await fixture.token("ann"))
        if let port { credentials.port = port }
        ann.requestJoinChannel(channelUUID: id, descriptor: ChannelDescriptor(name: "Ops"), credentials: credentials)
        bob.requestJoinChannel(channelUUID: id, descriptor: ChannelDescriptor(name: "Ops"), credentials: fixture.credentials(try await fixture.token("bob")))
        #expect(await annDelegate.wait(for: .didJoin(.developerRequest)))
        #expect(await bobDelegate.wait(for: .didJoin(.developerRequest)))
        ann.suspend()
        // Suspending closes the connection on purpose: offline at once, not reconnecting first.
        #expect(await eventually { bob.roster.first { $0.userID == "ann" }?.connection == .offline })
        return Pair(ann: ann, bob: bob, annDelegate: annDelegate, annEvents: annEvents, credentials: credentials)
    }

    /// Leaving while suspended (Apple's usual case: the user leaves from the system UI with the app in
    /// the background) used to send nothing: the server kept the member, in everyone's roster and
    /// woken by push, for good. The leave now goes on a connection of its own.
    @Test func aLeaveWhileSuspendedReachesTheServer() async throws {
        let fixture = try await ClientFixture(pushes: false)
        let id = fixture.channel.id
        let p = try await suspendedAnnAndBob(fixture, "owed")
        p.ann.leaveChannel(channelUUID: id)
        #expect(await p.annDelegate.wait(for: .didLeave(.developerRequest)))
        #expect(p.ann.activeChannelUUID == nil, "the app is out of the channel at once, as on iOS")
        #expect(await eventually(seconds: 10) { !p.bob.roster.contains { $0.userID == "ann" } },
                "the server heard the leave: Ann is out of Bob's roster, not an offline member")
        #expect(await eventually { p.annEvents.all.contains(.leaveSettled(id, .delivered)) && p.ann.owedLeaves.isEmpty })
        #expect(!FileManager.default.fileExists(atPath: RestorationStore(directory: p.ann.stateDirectory).owedLeavesPath))
        await p.ann.invalidate()
        await p.bob.invalidate()
        await fixture.stop()
    }

    /// Ann and Bob as `suspendedAnnAndBob` has them, Ann behind a proxy that then drops everything
    /// for `outage`, during which she leaves: the leave the server can't hear yet.
    func annLeavesCutOff(_ fixture: ClientFixture, _ name: String,
                         for outage: Duration) async throws -> (Pair, ImpairmentProxy) {
        let (proxy, port) = try await fixture.proxy()
        let p = try await suspendedAnnAndBob(fixture, name, port: port)
        await proxy.blackhole(for: outage)
        p.ann.leaveChannel(channelUUID: fixture.channel.id)
        #expect(await p.annDelegate.wait(for: .didLeave(.developerRequest)))
        return (p, proxy)
    }

    /// A leave while the server can't be reached is kept on disk and delivered at the app's next start.
    @Test func aLeaveTheServerCouldNotHearIsDeliveredAtTheNextStart() async throws {
        let fixture = try await ClientFixture(pushes: false)
        let id = fixture.channel.id
        // Ann's network is gone while she leaves, and her app stops before it comes back.
        let (p, proxy) = try await annLeavesCutOff(fixture, "later", for: .seconds(3))
        try await Task.sleep(for: .milliseconds(500))
        #expect(p.ann.owedLeaves == [id])
        await p.ann.invalidate()
        let owed = try RestorationStore(directory: fixture.stateDirectory("later-ann")).loadOwedLeaves()
        #expect(owed.map(\.channel) == [id] && owed.first?.credentials == p.credentials, "kept on disk for the next start")
        #expect(p.bob.roster.contains { $0.userID == "ann" }, "the server has not heard it")

        try await Task.sleep(for: .seconds(3))
        let again = try await manager(fixture, "later-ann", p.annDelegate)
        let againEvents = EventLog(again)
        #expect(again.activeChannelUUID == nil, "the channel itself is not restored")
        #expect(await eventually(seconds: 10) { !p.bob.roster.contains { $0.userID == "ann" } }, "delivered after the restart")
        #expect(await eventually { againEvents.all.contains(.leaveSettled(id, .delivered)) && again.owedLeaves.isEmpty })
        #expect(try RestorationStore(directory: fixture.stateDirectory("later-ann")).loadOwedLeaves().isEmpty)
        await again.invalidate()
        await p.bob.invalidate()
        await proxy.stop()
        await fixture.stop()
    }

    /// Joining the channel again before an owed leave got through withdraws the leave: delivered
    /// later, it would end the new membership.
    @Test func joiningAgainWithdrawsAnOwedLeave() async throws {
        let fixture = try await ClientFixture(pushes: false)
        let id = fixture.channel.id
        let (p, proxy) = try await annLeavesCutOff(fixture, "rejoin", for: .seconds(2))
        #expect(p.ann.owedLeaves == [id])
        // Back in the channel directly (not through the dead network) before the leave got through.
        p.ann.requestJoinChannel(channelUUID: id, descriptor: ChannelDescriptor(name: "Ops"), credentials: fixture.credentials(p.credentials.token))
        #expect(await p.annDelegate.wait(for: .didJoin(.developerRequest), count: 2))
        #expect(await eventually { p.annEvents.all.contains(.leaveSettled(id, .superseded)) })
        #expect(p.ann.owedLeaves.isEmpty)
        // Well after the network is back, Ann is still a connected member.
        try await Task.sleep(for: .seconds(3))
        #expect(p.bob.roster.first { $0.userID == "ann" }?.connection == .connected)
        #expect(p.ann.activeChannelUUID == id && p.ann.serviceStatus == .ready)
        #expect(try RestorationStore(directory: p.ann.stateDirectory).loadOwedLeaves().isEmpty)
        await p.ann.invalidate()
        await p.bob.invalidate()
        await proxy.stop()
        await fixture.stop()
    }
}
