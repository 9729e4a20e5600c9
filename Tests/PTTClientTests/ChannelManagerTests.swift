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

    func recorder(_ path: String, tones: ToneConfiguration = .standard) -> AudioConfiguration {
        var audio = AudioConfiguration(makeOutput: { try WAVFileSink(path: path, pacer: RealTimePacer()) })
        audio.tones = tones
        return audio
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
        // Without tones: the file is compared with the speech alone (ToneTests hears the tones).
        let bob = try await manager(fixture, "bob", bobDelegate, audio: recorder(heard, tones: .off))
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
