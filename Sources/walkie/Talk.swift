import ArgumentParser
import Audio
import ChannelProtocol
import Foundation
import JitterBuffer
import ParticipantTokens
import NIOConcurrencyHelpers
import PTTClient
import SquelchInfo

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
        if oneShot.leave { manager.userLeftChannel(channelUUID: channel) }
        await manager.invalidate()
    }
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
