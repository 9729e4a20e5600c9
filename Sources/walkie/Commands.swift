import ArgumentParser
import Audio
import ChannelProtocol
import Foundation
import JitterBuffer
import ParticipantTokens
import NIOConcurrencyHelpers
import PTTClient
import SquelchInfo

/// A one-shot client (talk, listen) keeps its manager in a directory of its own, so that it never
/// disturbs the interactive walkie's saved channel. When done it closes its connection rather than
/// leave: a `leave` would end the user's membership on the server, and with it the push token of the
/// user's own walkie or phone, which the one-shot's join only pushed aside (`replaced`).
func temporaryState() -> String {
    FileManager.default.temporaryDirectory.appendingPathComponent("walkie-\(ProcessInfo.processInfo.processIdentifier)-\(UUID().uuidString.prefix(8))").path
}

struct Talk: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Join, take the floor, send a WAV file in real time, release and exit.",
        discussion: "Exits 0 once the whole file is sent and squelchd has confirmed the release; 6 if the floor is busy or taken; 3 if the connection dropped during the file; 130 (Ctrl-C), 143 (SIGTERM) or 129 (SIGHUP) if stopped, after letting go of the floor (see 'walkie --help' for the other codes). Without --wait the request does not queue: a busy floor fails at once.")

    @OptionGroup var server: ServerOptions
    @Option(help: "The WAV file to send (any rate; 16-bit or float PCM).")
    var file: String
    // `.unconditional` on the numbers: "--wait -1" reaches the check that says what to give, rather than
    // ArgumentParser's "missing value" (it takes "-1" for an option).
    @Option(parsing: .unconditional, help: "Wait this long in the floor queue when someone else is talking (0: don't queue; fail at once).")
    var wait: Double = 0
    @OptionGroup var oneShot: OneShotOptions

    func run() async throws {
        do { try await talk() } catch let failure as WalkieFailure { fail(failure) }
    }

    func talk() async throws {
        let (credentials, channel) = try server.credentials()
        guard wait.isFinite, (0...CommandLimits.longestWait).contains(wait) else {
            throw WalkieFailure.usage("--wait \(wait) is not a number of seconds from 0 to \(Int(CommandLimits.longestWait)) (a day)")
        }
        var audio = AudioOptions()
        audio.inputFile = file
        let samples = try AudioOptions.readInput(file)
        let configuration = try audio.configuration(capture: true, playback: false, inputSamples: samples)
        let frames = samples.count
        guard frames > 0 else { throw WalkieFailure.audio("\(file) holds no audio (no samples); give a WAV file with speech in it") }
        let state = temporaryState()
        defer { try? FileManager.default.removeItem(atPath: state) }
        let delegate = WalkieDelegate()
        // Without --wait the request is not queued at all: one that would give up at once must not
        // take a place in a full queue from a member who waits (squelchd gives the last place to a
        // higher priority).
        let manager = try await makeManager(delegate: delegate, stateDirectory: state, push: nil, audio: configuration, waitsForFloor: wait > 0)
        let events = manager.events
        manager.requestJoinChannel(channelUUID: channel, descriptor: ChannelDescriptor(name: "walkie talk"), credentials: credentials)
        try await awaitJoin(delegate, server: server.server)
        // Ctrl-C, SIGTERM or SIGHUP from here on let go of the floor before walkie exits: killed
        // outright, it left the floor held in silence until squelchd's 5 s silence limit, with the
        // queue waiting behind it.
        let interruption = NIOLockedValueBox<Int32?>(nil)
        let stopSources = [SIGINT, SIGTERM, SIGHUP].flatMap { number in
            takeStopSignals([number]) {
                interruption.withLockedValue { if $0 == nil { $0 = number } }
                manager.stopTransmitting(channelUUID: channel, source: .userRequest)
            }
        }
        defer { for source in stopSources { source.cancel() } }

        // One reader of the manager's events for the whole command (a stream has one consumer, and
        // ends for good when a reader is cancelled): whether the request was queued, and whether
        // squelchd has shown this member talking and then, on the same connection, not talking,
        // which confirms the release. Events, not samples: a short file's whole talking spell may
        // fall between two looks, and only the events' order says which connection a roster came
        // from (a squelchd restarted after the file's end shows the member not talking too, having
        // never heard the burst's end).
        let seen = NIOLockedValueBox(TalkSpell())
        let waitLimit = wait
        let watcher = Task {
            for await event in events {
                seen.withLockedValue { $0.note(event) }
                // Waiting in the queue is seconds of nothing on the terminal otherwise.
                if case .floorQueued(let position) = event, waitLimit > 0 {
                    say("queued: number \(position) for the floor (\(Self.busyWith(manager))); waiting up to \(Self.seconds(waitLimit))")
                }
            }
        }
        defer { watcher.cancel() }
        manager.requestBeginTransmitting(channelUUID: channel, source: .userRequest)
        let began = await withTaskGroup(of: WalkieFailure?.self) { group -> WalkieFailure? in
            group.addTask {
                for await event in delegate.stream {
                    switch event {
                    case .began: return nil
                    case .failedToBegin(let error):
                        if let number = interruption.withLockedValue({ $0 }) { return Self.interrupted(number, "before the floor was granted; nothing was sent") }
                        guard error.code == .transmissionInProgress else { return .floor("can't talk: \(error.message)") }
                        let busy = Self.busyWith(manager)
                        // A full queue is busy too, but --wait can't help: say so rather than suggest it.
                        if error.floorCause == .queueFull {
                            return .floor("the floor is busy: \(busy), and \(error.message); try again later")
                        }
                        // Asked to wait and refused at once: squelchd keeps no queue here.
                        if wait > 0, !seen.withLockedValue({ $0.queued }) {
                            return .floor("the floor is busy: \(busy), and squelchd keeps no queue to wait in (its maxQueue is 0); try again when the channel is clear")
                        }
                        return .floor("the floor is busy: \(busy); try again, or pass --wait 30 to queue")
                    default: continue
                    }
                }
                return .other("the channel manager stopped")
            }
            group.addTask {
                // Queued behind someone: wait as long as asked, then give up.
                while !Task.isCancelled {
                    if seen.withLockedValue({ $0.queued }) {
                        // Queued without --wait: a squelchd older than `queue: false` queues anyway;
                        // the request is withdrawn at once (below), as busy.
                        if wait == 0 { return .floor("the floor is busy: \(Self.busyWith(manager)); try again, or pass --wait 30 to queue") }
                        try? await Task.sleep(for: .seconds(wait))
                        if Task.isCancelled { return nil }
                        return .floor("waited \(Self.seconds(wait)) in the floor queue and the floor is still busy (\(Self.busyWith(manager))); try again, or pass a longer --wait")
                    }
                    try? await Task.sleep(for: .milliseconds(20))
                }
                return nil
            }
            group.addTask {
                // Interrupted while waiting: the request is withdrawn (the handler stopped it).
                while !Task.isCancelled {
                    if let number = interruption.withLockedValue({ $0 }) { return Self.interrupted(number, "before the floor was granted; nothing was sent") }
                    try? await Task.sleep(for: .milliseconds(20))
                }
                return nil
            }
            let first = await group.next() ?? nil
            group.cancelAll()
            return first
        }
        if let began {
            manager.stopTransmitting(channelUUID: channel, source: .userRequest)
            try? await Task.sleep(for: .milliseconds(200))
            await finish(manager, channel: channel)
            throw began
        }
        // The file plays in real time, and its end ends the transmission (`endTransmissionWhenInputEnds`).
        // Should that not come, a stop after the file's length and some slack.
        let seconds = Double(frames) / Double(PipelineAudio.sampleRate)
        // A long announcement is seconds of silence on the terminal otherwise: say it is on air.
        say("sending \(file): \(String(format: "%.1f", seconds)) s")
        let sendingSince = ContinuousClock.now
        // The file's end stops it with the source that began it (.userRequest); a revoked floor or a
        // lost connection ends it with .unknown, before the file was sent.
        let ending = await withTaskGroup(of: ChannelTransmitRequestSource?.self) { group -> ChannelTransmitRequestSource? in
            group.addTask {
                for await event in delegate.stream { if case .ended(let source) = event { return source } }
                return nil
            }
            group.addTask {
                try? await Task.sleep(for: .seconds(seconds + 2))
                return nil
            }
            let first = await group.next() ?? nil
            group.cancelAll()
            return first
        }
        // A signal that came once the file was all sent stopped nothing: the file's end reports as usual.
        let allSent = await manager.statistics().framesSent >= frames / (2 * PipelineAudio.periodFrames) - 1  // 20 ms frames
        if let number = interruption.withLockedValue({ $0 }), !allSent {
            // The handler stopped the transmission; squelchd confirms the release, as at a file's end.
            let sent = (ContinuousClock.now - sendingSince) / .seconds(1)
            let released = await releaseConfirmed({ seen.withLockedValue { $0.release } }, within: .seconds(2))
            await finish(manager, channel: channel)
            throw Self.interrupted(number, "after \(String(format: "%.1f", min(sent, seconds))) s of \(file)'s \(String(format: "%.1f", seconds)) s, so the channel heard only its start; "
                                   + (released ? "the floor is released" : "squelchd did not confirm the release; it frees the floor within 5 s of silence"))
        }
        guard let ending, ending == .userRequest else {
            let connected = manager.serviceStatus == .ready
            let pushedAside = manager.isSuspended
            // Removed from the channel, or the channel deleted: the session is over, and sending the
            // file again can't work until an administrator lets this user back in.
            let left = manager.activeChannelUUID == nil
            if ending == nil { manager.stopTransmitting(channelUUID: channel, source: .userRequest) }
            try? await Task.sleep(for: .milliseconds(300))
            // squelchd says why it took the floor back; without that, the connection went, or
            // another member's stronger claim showed first. Read after the pause: the revocation
            // comes on the manager's events, which the watcher may not have read when `.ended` came.
            let revoked = seen.withLockedValue { $0.revoked }
            let why = revoked?.reason ?? manager.activeRemoteParticipant.map { "\($0.name) took the floor" } ?? "the floor was taken back or the connection dropped"
            await finish(manager, channel: channel)
            if pushedAside { throw WalkieFailure.floor(Self.pushedAside(file)) }
            if left {
                let why = seen.withLockedValue { $0.notice } ?? "the session ended"
                throw WalkieFailure.token("\(why); the channel did not hear all of \(file), and sending it again needs a new token or membership from the channel's administrator")
            }
            guard connected else {
                if seen.withLockedValue({ $0.serverWentAway }) { throw WalkieFailure.unreachable(Self.serverShutDown(file)) }
                throw WalkieFailure.unreachable("the connection to squelchd dropped while \(file) was being sent, so the channel did not hear all of it; check that squelchd runs, then send it again")
            }
            let overLimit = revoked.map { $0.cause == .maxBurstReached } ?? (seconds > Double(manager.channelInfo?.maxBurstSeconds ?? .max))
            let again: String
            switch revoked?.cause {
            case _ where overLimit: again = "the channel's bursts last at most \(manager.channelInfo?.maxBurstSeconds ?? 0) s: send it in shorter parts"
            case .preempted?: again = "send it again when they are done"
            case .notAllowed?: again = "this token can't talk; ask the channel's administrator for one that can"
            default: again = "send it again"
            }
            throw WalkieFailure.floor("the transmission ended before all of \(file) was sent (\(why)); \(again)")
        }
        // The file's end is only this side's: squelchd confirms the release (this member no longer
        // talking, on a connection that is up) once it has seen it, so a server that died or a
        // network that went away mid-file is not reported as a delivered announcement.
        let confirmed = await releaseConfirmed({ seen.withLockedValue { $0.release } }, within: .seconds(3))
        let sent = await manager.statistics().framesSent
        let pushedAside = manager.isSuspended
        await finish(manager, channel: channel)
        if !confirmed, pushedAside { throw WalkieFailure.floor(Self.pushedAside(file)) }
        guard confirmed else {
            if seen.withLockedValue({ $0.serverWentAway }) { throw WalkieFailure.unreachable(Self.serverShutDown(file)) }
            throw WalkieFailure.unreachable("sent \(file) (\(sent) frames), but squelchd did not confirm the end of the transmission: the connection dropped or stalled during it, so the channel may not have heard all of it; check that squelchd runs, then send it again")
        }
        say("sent \(file): \(String(format: "%.1f", seconds)) s in \(sent) frames")
    }

    /// Who holds the floor, as the roster shows it: every talker of a full-duplex channel, not the
    /// one the speaker line shows.
    static func busyWith(_ manager: ChannelManager) -> String {
        let names = manager.roster.filter { $0.talking && !$0.isLocal }.map(\.name)
        switch names.count {
        case 0: return manager.activeRemoteParticipant.map { "\($0.name) is talking" } ?? "someone else is talking"
        case 1: return "\(names[0]) is talking"
        default: return "\(names.dropLast().joined(separator: ", ")) and \(names.last!) are talking"
        }
    }

    /// Who a slot (as `BurstStatistics` names a talker) is in the roster, or was when last seen
    /// there: a burst outlives its talker's membership when the talker is removed or revoked while
    /// talking, and its summary still names them.
    struct SlotNames {
        private var names: [UInt16: String] = [:]

        /// Notes everyone in the roster now; called on every event, so a talker is noted while talking.
        mutating func note(_ manager: ChannelManager) {
            for entry in manager.roster { names[entry.slot] = entry.name }
        }

        func name(ofSlot slot: UInt16) -> String? { names[slot] }
    }

    static func seconds(_ value: Double) -> String { "\(SquelchInfo.plainNumber((value * 10).rounded() / 10)) s" }

    /// How a heard burst went: "300 frames, 2 lost", and the frames this end received but could not
    /// play in time (an overloaded or stalled machine), which are not the network's loss.
    static func burstSummary(_ statistics: BurstStatistics) -> String {
        "\(statistics.framesDue) frames, \(statistics.lost) lost"
            + (statistics.skipped > 0 ? ", \(statistics.skipped) skipped (this end fell behind)" : "")
    }

    /// Stopped by a signal (the shell's 128 + its number, as a killed process would exit), having
    /// let go of the floor first.
    static func interrupted(_ number: Int32, _ what: String) -> WalkieFailure {
        let name = [SIGINT: "Ctrl-C", SIGTERM: "SIGTERM", SIGHUP: "SIGHUP"][number] ?? "signal \(number)"
        return WalkieFailure(code: 128 + number, message: "interrupted (\(name)) \(what)")
    }

    /// squelchd said it was going away (SIGTERM: a restart or an upgrade) during the file: nothing to
    /// check on this side, only to wait.
    static func serverShutDown(_ file: String) -> String {
        "squelchd shut down (it said it was going away: a restart or an upgrade, most likely) while \(file) was being sent, so the channel did not hear all of it; send it again once squelchd is back"
    }

    /// Another connection of the same user (the user's own walkie or phone, taking the channel back)
    /// replaced this one: not squelchd's doing.
    static func pushedAside(_ file: String) -> String {
        "another connection of this user (a walkie or phone of theirs) joined the channel while \(file) was being sent, so the channel did not hear all of it; send it when that one is done, or as another user"
    }

    /// Closes the connection, leaving the channel first only if asked to (`--leave`).
    func finish(_ manager: ChannelManager, channel: UUID) async {
        if oneShot.leave { manager.leaveChannel(channelUUID: channel) }
        await manager.invalidate()
    }
}

/// What the one-shot commands share.
struct OneShotOptions: ParsableArguments {
    @Flag(help: ArgumentHelp("Leave the channel when done: the user stops being a member.",
                             discussion: "For a user of its own, like an announcer run from cron. Without it the user stays a member, offline, as after any session; never use it with the user of someone's walkie or phone, which would lose the channel and its push token."))
    var leave = false
}

/// What `walkie talk` has seen of its own talking spell, from the manager's events in their order.
struct TalkSpell {
    var queued = false
    var notice: String?
    /// squelchd closed the connection saying it was going away (the channel manager's notice says
    /// so in words; `ChannelManagerTests` holds the library to that wording).
    private(set) var serverWentAway = false
    /// Why squelchd took the floor back, if it did.
    private(set) var revoked: (cause: FloorCause?, reason: String)?
    /// squelchd has shown this member talking.
    private(set) var talking = false
    /// Whether squelchd has confirmed the release: true once it shows this member not talking on
    /// the connection that showed it talking; false once that connection was lost (the service
    /// status left `ready`) first, whatever a later connection shows; nil while neither happened.
    private(set) var release: Bool?

    mutating func note(_ event: ChannelManagerEvent) {
        switch event {
        case .floorQueued: queued = true
        case .notice(let text):
            notice = text
            if text.contains("is going away (") { serverWentAway = true }
        case .transmissionRevoked(let cause, let reason): revoked = (cause, reason)
        case .serviceStatus(let status) where status != .ready:
            if talking, release == nil { release = false }
        case .roster(let entries):
            guard let you = entries.first(where: \.isLocal) else { return }
            if you.talking { talking = true } else if talking, release == nil { release = true }
        default: break
        }
    }
}

/// Waits, at most `limit`, for `release` to settle (see `TalkSpell.release`); true if squelchd
/// confirmed the release.
func releaseConfirmed(_ release: @Sendable () -> Bool?, within limit: Duration) async -> Bool {
    let deadline = ContinuousClock.now + limit
    while ContinuousClock.now < deadline {
        if let settled = release() { return settled }
        try? await Task.sleep(for: .milliseconds(10))
    }
    return false
}

struct Listen: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Join and record what the channel says into a WAV file (48 kHz mono, real time, silence between bursts).",
        discussion: """
            Runs for --duration seconds, or until interrupted (Ctrl-C, SIGTERM, or SIGHUP when the terminal goes), then completes the file and exits 0. \
            A session that ends early (the member removed, the channel deleted, the token expired without \
            --token-file, another connection of the same user joining) completes the file and exits non-zero \
            at once; so does a recording whose connection to squelchd was down when it ended (3).
            """)

    @OptionGroup var server: ServerOptions
    @Option(help: "The WAV file to write.")
    var record: String
    @Option(parsing: .unconditional, help: "Seconds to listen (default: until interrupted).")
    var duration: Double?
    @OptionGroup var oneShot: OneShotOptions

    func run() async throws {
        do { try await listen() } catch let failure as WalkieFailure { fail(failure) }
    }

    func listen() async throws {
        if let duration, !(duration.isFinite && duration > 0 && duration <= CommandLimits.longestRecording) {
            throw WalkieFailure.usage("--duration \(duration) is not a number of seconds over 0 and at most \(Int(CommandLimits.longestRecording)) (12 hours, as much as a WAV file holds); or leave it out to listen until interrupted")
        }
        let (credentials, channel) = try server.credentials()
        var audio = AudioOptions()
        audio.outputFile = record
        let configuration = try audio.configuration(capture: false, playback: true, outputFlag: "--record")
        let state = temporaryState()
        defer { try? FileManager.default.removeItem(atPath: state) }
        let delegate = WalkieDelegate()
        let manager = try await makeManager(delegate: delegate, stateDirectory: state, push: nil, audio: configuration)
        manager.requestJoinChannel(channelUUID: channel, descriptor: ChannelDescriptor(name: "walkie listen"), credentials: credentials)
        try await awaitJoin(delegate, server: server.server)
        // Taken before "listening" is said: a stop that follows that line at once must complete the
        // file, not find the signal ignored with no source yet to take it.
        let (stops, stop) = AsyncStream.makeStream(of: Void.self)
        let stopSources = takeStopSignals([SIGINT, SIGTERM, SIGHUP]) { stop.yield() }
        defer { for source in stopSources { source.cancel() } }
        say("listening; recording into \(record)")
        let tokenFile = server.tokenFile
        let renewals = tokenFile.map { watchTokenFile($0, current: credentials.token, manager: manager, channel: channel, problem: say) }
        // What ends the recording early; when the channel stopped being heard (the connection lost or
        // being re-established, or the token expired), after it was first joined.
        let (endings, end) = AsyncStream.makeStream(of: WalkieFailure.self)
        struct Seen { var notice: String?; var joined = false; var downSince: Date?; var expiredSince: Date? }
        let seen = NIOLockedValueBox(Seen())
        let bursts = Task {
            var names = Talk.SlotNames()
            for await event in manager.events {
                names.note(manager)
                switch event {
                case .burstFinished(let s):
                    // Named: in full duplex several bursts end together.
                    let who = names.name(ofSlot: s.slot).map { " from \($0)" } ?? ""
                    say("heard a burst\(who): \(Talk.burstSummary(s))")
                case .notice(let text):
                    seen.withLockedValue { $0.notice = text }
                case .outputFailed(let reason):
                    // A full disk or a file gone bad: the recording can't go on, and must not say "saved".
                    end.yield(.audio("\(reason); \(record) holds only what was written before; free some space or record elsewhere"))
                case .serviceStatus(.ready):
                    let wasDown = seen.withLockedValue { state in
                        defer { state.joined = true; state.downSince = nil; state.expiredSince = nil }
                        return state.joined && state.downSince != nil
                    }
                    if wasDown { say("the channel is back") }
                case .serviceStatus:
                    // Connecting again after a drop, or unavailable: nothing is heard meanwhile. (The
                    // events start with the first join's own `connecting`.)
                    let first = seen.withLockedValue { state in
                        guard state.joined, state.downSince == nil else { return false }
                        state.downSince = Date()
                        return true
                    }
                    // (Not when pushed aside: that ends the recording, just below.)
                    if first, !manager.isSuspended { say("the channel is unavailable; the recording goes on, silent, until it is back") }
                case .suspended(true):
                    // Only another connection of this user puts a one-shot aside: it has no pushes.
                    end.yield(.other("another connection of this user joined the channel, so this recording stops here (one connection per user: record as another user, or stop the other)"))
                case .tokenExpired(let reason):
                    seen.withLockedValue { state in
                        state.expiredSince = state.expiredSince ?? Date()
                        state.downSince = nil  // the token's doing, not the connection's
                    }
                    if tokenFile == nil {
                        end.yield(.token("\(reason); the recording stops here; run again with a new token (--token-file renews without a break)"))
                    } else if let (line, _) = describe(event, tokenFile: tokenFile) {
                        say(line)
                    }
                default:
                    if let (line, _) = describe(event, tokenFile: tokenFile) { say(line) }
                }
            }
        }
        let leaves = Task {
            for await event in delegate.stream {
                guard case .left = event else { continue }
                // The session's notice (why) comes on the other stream; give it a moment.
                try? await Task.sleep(for: .milliseconds(100))
                let why = seen.withLockedValue { $0.notice } ?? "the session ended"
                end.yield(.token("\(why); the recording stops here"))
            }
        }
        let early = await withTaskGroup(of: WalkieFailure?.self) { group -> WalkieFailure? in
            group.addTask { await waitForEnd(seconds: duration, or: stops); return nil }
            group.addTask { for await failure in endings { return failure }; return nil }
            let first = await group.next() ?? nil
            group.cancelAll()
            return first
        }
        renewals?.cancel()
        bursts.cancel()
        leaves.cancel()
        // Invalidating stops playout, which completes the WAV header.
        if oneShot.leave, early == nil { manager.leaveChannel(channelUUID: channel) }
        await manager.invalidate()
        if let early {
            // An output that failed said what it kept in its own line.
            if early.code != WalkieFailure.audio("").code { say("saved \(record) (cut short)") }
            throw early
        }
        let clock = Date.FormatStyle(date: .omitted, time: .standard)
        let (down, expired) = seen.withLockedValue { ($0.downSince, $0.expiredSince) }
        if let expired {
            say("saved \(record)")
            throw WalkieFailure.token("the token expired at \(expired.formatted(clock)) and no new one came in \(tokenFile ?? "the token file"), so the end of \(record) is silence; put a new token in it")
        }
        if let down {
            say("saved \(record)")
            throw WalkieFailure.unreachable("the channel was unavailable from \(down.formatted(clock)) (the connection to squelchd lost), so the end of \(record) is silence that may have missed speech; check that squelchd runs and --server is right")
        }
        say("saved \(record)")
    }
}

/// Returns after `seconds`, or at the first of `stops` (SIGINT, SIGTERM or SIGHUP: an ssh session
/// that dropped), so that the WAV file is completed either way.
func waitForEnd(seconds: Double?, or stops: AsyncStream<Void>) async {
    await withTaskGroup(of: Void.self) { group in
        if let seconds { group.addTask { try? await Task.sleep(for: .seconds(seconds)) } }
        group.addTask { for await _ in stops { return } }
        await group.next()
        group.cancelAll()
    }
}

/// Takes `numbers` from their default action (which kills walkie with its output file unfinished) to
/// `handler`, through dispatch sources that the caller cancels when done. SIGHUP and SIGINT are left
/// ignored when walkie started with them ignored: under `nohup` it was asked to outlive its terminal,
/// and a shell runs a background job (`walkie talk … &` in a script) with SIGINT ignored so that the
/// terminal's Ctrl-C is not its.
func takeStopSignals(_ numbers: [Int32], handler: @escaping @Sendable () -> Void) -> [any DispatchSourceSignal] {
    numbers.compactMap { number in
        let previous = signal(number, SIG_IGN)
        // SIG_IGN is the handler value 1; C function pointers are not Equatable in Swift.
        if number == SIGHUP || number == SIGINT, previous.map({ unsafeBitCast($0, to: Int.self) == 1 }) ?? false { return nil }
        let source = DispatchSource.makeSignalSource(signal: number)
        source.setEventHandler(handler: handler)
        source.resume()
        return source
    }
}

struct Status: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Show the channel walkie would restore, without connecting (a running walkie keeps its connection).")

    @OptionGroup var state: StateOptions

    func run() async throws {
        let store = RestorationStore(directory: state.stateDir ?? RestorationStore.defaultDirectory(app: "walkie"))
        let record: RestorationRecord?
        do { record = try store.load() } catch { fail(.other(error.description)) }
        // Leaves the server has not heard yet, whatever the saved channel.
        let owed = (try? store.loadOwedLeaves()) ?? []
        for leave in owed {
            say("not yet heard by the server: the leave of channel \(leave.channel) at \(leave.leftAt.formatted(.iso8601)) (\(leave.credentials.address)); 'walkie leave' tries again")
        }
        guard let record else {
            say("no saved channel in \(store.directory); join one with 'walkie join --server HOST:PORT --token T'")
            throw ExitCode(2)
        }
        let claims = try? tokenClaims(record.credentials.token)
        say("channel   \(record.descriptor?.name ?? "?") (\(record.channel))")
        say("server    \(record.credentials.address), CA \(record.credentials.caPath)")
        if let claims {
            say("you       \(claims.name) (\(claims.userID))")
            say("token     " + (claims.expiresAt < Date() ? "expired " : "valid until ") + claims.expiresAt.formatted(.iso8601))
        }
        say("push      " + (record.pushToken == nil ? "no push token yet" : "registered (\(record.pushToken!.count)-byte token)"))
        // What to run next, for this directory: plain 'walkie' looks in the default one.
        // Quoted only when the shell needs it, and with double quotes: the command itself is shown in
        // single quotes.
        let directoryFlag = state.stateDir.map { dir in
            let plain = !dir.isEmpty && dir.allSatisfy { $0.isLetter || $0.isNumber || "/._-+:@%".contains($0) }
            let escaped = dir.replacingOccurrences(of: "\\", with: "\\\\").replacingOccurrences(of: "\"", with: "\\\"")
                .replacingOccurrences(of: "$", with: "\\$").replacingOccurrences(of: "`", with: "\\`")
            return " --state-dir " + (plain ? dir : "\"\(escaped)\"")
        } ?? ""
        if let holder = StateDirectoryLock.holder(of: store.directory) {
            say("open in a running walkie\(holder.map { " (pid \($0))" } ?? ""); leave from it, or quit it with q first")
        } else if let claims, claims.expiresAt < Date(), SavedSettings.load(from: store.directory)?.tokenFile == nil {
            // The saved token can't rejoin: 'walkie' would only be refused.
            say("the saved token has expired: rejoin with a new one, 'walkie join --server \(record.credentials.address) --token NEW\(directoryFlag)', or 'walkie leave\(directoryFlag)' to leave")
        } else {
            say("run 'walkie\(directoryFlag)' to rejoin, 'walkie leave\(directoryFlag)' to leave")
        }
    }
}

struct Leave: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Leave the saved channel: the server forgets you and your push token.")

    @OptionGroup var state: StateOptions

    func run() async throws {
        let delegate = WalkieDelegate()
        let manager: ChannelManager
        do { manager = try await makeManager(delegate: delegate, stateDirectory: state.stateDir, push: nil, audio: .none, purpose: .leave) } catch { fail(error) }
        if let problem = manager.restorationError { fail(.other(problem.description)) }
        // Collected from the start: a leave owed from an earlier run may settle while this one joins.
        let outcomes = NIOLockedValueBox<[UUID: OwedLeaveOutcome]>([:])
        let collecting = Task {
            for await event in manager.events {
                if case .leaveSettled(let channel, let outcome) = event { outcomes.withLockedValue { $0[channel] = outcome } }
            }
        }
        defer { collecting.cancel() }
        let earlier = manager.owedLeaves
        guard let channel = manager.activeChannelUUID else {
            guard !earlier.isEmpty else {
                say("no saved channel; nothing to leave")
                throw ExitCode(2)
            }
            // Channels left before while the server couldn't hear it: try telling it now.
            let code = await settle(manager, outcomes, earlier, within: .seconds(10))
            await manager.invalidate()
            if code != 0 { throw ExitCode(code) }
            return
        }
        // Rejoin (so the server hears the leave on the channel's own connection), then leave. Without
        // an answer the manager keeps the leave and delivers it on a connection of its own.
        let joined = await withTaskGroup(of: Bool.self) { group -> Bool in
            group.addTask { for await event in delegate.stream { if case .joined = event { return true } }; return false }
            group.addTask { try? await Task.sleep(for: .seconds(5)); return false }
            let first = await group.next() ?? false
            group.cancelAll()
            return first
        }
        manager.leaveChannel(channelUUID: channel)
        var code: Int32 = 0
        if joined {
            // The manager waits for the server's acknowledgement of the leave before it closes.
            await manager.invalidate()
            say("left the channel")
        } else {
            try? await Task.sleep(for: .milliseconds(300))
            // The server didn't answer the join for 5 s: a shorter wait for the leave's own try.
            code = await settle(manager, outcomes, manager.owedLeaves.union(earlier), within: .seconds(5))
            await manager.invalidate()
        }
        if code != 0 { throw ExitCode(code) }
    }

    /// Waits up to `limit` for the leaves in `channels` to settle and says how each did; the exit code.
    func settle(_ manager: ChannelManager, _ outcomes: NIOLockedValueBox<[UUID: OwedLeaveOutcome]>, _ channels: Set<UUID>,
                within limit: Duration) async -> Int32 {
        let deadline = ContinuousClock.now + limit
        while ContinuousClock.now < deadline, !manager.owedLeaves.isDisjoint(with: channels) {
            try? await Task.sleep(for: .milliseconds(100))
        }
        var code: Int32 = 0
        for channel in channels.sorted(by: { $0.uuidString < $1.uuidString }) {
            switch outcomes.withLockedValue({ $0[channel] }) {
            case .delivered?:
                say("left channel \(channel): the server heard it")
            case .nothingToLeave(let why)?:
                say("left channel \(channel): the server no longer had you there (\(why))")
            case .superseded?:
                break
            case .undeliverable(let why)?:
                say("left channel \(channel) here, but the server refused the token (\(why)); it lists you there, and may wake this device, until an administrator removes you (DELETE /v1/channels/\(channel)/members/<user>)")
                code = 4
            case nil:
                say("left channel \(channel) here, but the server did not answer; the leave is kept, and walkie tells the server the next time it runs (or run 'walkie leave' again)")
                code = 3
            }
        }
        return code
    }
}

/// One line on stdout, written at once: scripts and tests read walkie's progress through a pipe, where
/// `print` would hold it in a buffer until exit.
func say(_ line: String) {
    // `try?`: a reader that went away (`walkie listen … | head -1`) must not crash walkie before it
    // completes its file; `write(_:)` traps on EPIPE, `write(contentsOf:)` throws.
    try? FileHandle.standardOutput.write(contentsOf: Data((line + "\n").utf8))
}
