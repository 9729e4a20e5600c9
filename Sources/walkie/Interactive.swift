import ArgumentParser
import ChannelProtocol
import Foundation
import NIOConcurrencyHelpers
import PTTClient

import TerminalUI

struct InteractiveOptions: ParsableArguments {
    @Option(help: "The push-to-talk key: space, or a letter, or a key name like f1.")
    var key: String = "space"
    @Option(parsing: .unconditional, help: "The longest transmission, in seconds; the key is released for you after it.")
    var maxTransmit: Double = 60
    @Flag(help: "Start with the voice connection closed, waiting for a push to wake it (once the push channel works; never without one).")
    var background = false
    @Option(help: ArgumentHelp("A hardware push-to-talk button: a Linux input device such as /dev/input/event5 (see 'walkie devices').",
                               discussion: "USB PTT switches, foot pedals and headset buttons give exact press and release, whatever window has the focus and with walkie in the background. Reading it takes membership of the group that owns it, usually input."))
    var pttDevice: String?
    @Option(help: "The button's key on --ptt-device: a kernel key name (KEY_F13, BTN_0, playpause), a code, or any.")
    var pttKey: String = "any"
    @Option(help: ArgumentHelp("Close the voice connection after this many quiet seconds, and again after each call a push woke walkie for (default: off; \(Int(Self.backgroundSuspendAfter)) with --background).",
                               discussion: "As a phone suspends a push-to-talk app: an idle walkie then costs the server nothing but its push token. Only when a push can wake it."))
    var suspendAfter: Double?

    /// --background's quiet time before it goes back to sleep: long enough to answer a call.
    static let backgroundSuspendAfter = 15.0
    var effectiveSuspendAfter: Double? { suspendAfter ?? (background ? Self.backgroundSuspendAfter : nil) }
}

struct Join: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Join a channel in a full-screen walkie-talkie: hold the key to talk.",
        discussion: """
        Keys: Space (or --key) talks while held; where the terminal can't report key releases, a tap \
        latches and the next press stops. b closes the voice connection and waits for pushes (and \
        reopens it); m mutes the speaker; q or Ctrl-C quits (so do SIGTERM and SIGHUP, with the output file completed), keeping the channel for 'walkie' to restore.
        """)

    @OptionGroup var server: ServerOptions
    @OptionGroup var audio: AudioOptions
    @OptionGroup var interactive: InteractiveOptions
    @OptionGroup var state: StateOptions

    func run() async throws {
        do {
            let (credentials, channel) = try server.credentials()
            let configuration = try audio.configuration(capture: true, playback: true, probeMicrophone: mayTalk(credentials.token))
            try Interactive.preflight(interactive)
            let delegate = WalkieDelegate()
            let manager = try await makeManager(delegate: delegate, stateDirectory: state.stateDir, push: server.pushTransport(), audio: configuration)
            if let active = manager.activeChannelUUID, active != channel {
                // The saved channel is another one: leave it first, as one device is in one channel.
                manager.leaveChannel(channelUUID: active)
                try? await Task.sleep(for: .milliseconds(300))
            }
            if manager.activeChannelUUID == nil {
                manager.requestJoinChannel(channelUUID: channel, descriptor: ChannelDescriptor(name: "Channel"), credentials: credentials)
            } else if (try? RestorationStore(directory: manager.stateDirectory).load())??.credentials.token != credentials.token {
                // The saved channel is this one and is being restored with the saved token, which may
                // have run out: the token given now is offered (and tried if the saved one is refused).
                do throws(ChannelError) { try await manager.renewToken(credentials.token, channelUUID: channel) } catch {
                    throw WalkieFailure.token("\(error.message); or 'walkie leave' first to join as someone else")
                }
            }
            // The screen starts once joined; until then (up to 20 s for a server that doesn't answer)
            // say what is happening and how to give up.
            say("joining at \(server.server)… (Ctrl-C to give up)")
            try await awaitJoin(delegate, server: server.server)
            let tokenFile = server.tokenFile.map { URL(fileURLWithPath: $0).standardizedFileURL.path }
            if let problem = SavedSettings(push: server.pushChoice, tokenFile: tokenFile).save(in: manager.stateDirectory) { say(problem) }
            let shared = Interactive.SharedBox()
            let renewals = server.tokenFile.map { path in
                watchTokenFile(path, current: credentials.token, manager: manager, channel: channel) { text in shared.report(text) }
            }
            defer { renewals?.cancel() }
            try await Interactive.run(manager: manager, delegate: delegate, options: interactive, tokenFile: server.tokenFile,
                                      pushes: server.pushChoice.isOn, shared: shared)
        } catch let failure as WalkieFailure {
            fail(failure)
        }
    }
}

/// `walkie` with no command: rejoin the saved channel (reason `channelRestoration`).
struct Resume: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "resume", abstract: "Rejoin the last channel (what 'walkie' with no command does).")

    @OptionGroup var audio: AudioOptions
    @OptionGroup var interactive: InteractiveOptions
    @OptionGroup var state: StateOptions
    @Option(help: "Where wake-up pushes come from: device, simulator or off (default: what 'walkie join' was given, else device).")
    var push: PushSource?
    @Option(help: "The push port, as for 'walkie join' (0: no pushes; default: the one 'walkie join' was given).")
    var pushPort: Int?
    @Option(help: "Renew the session whenever this file holds a new participant token (as 'walkie join --token-file'; default: the one 'walkie join' was given).")
    var tokenFile: String?

    func run() async throws {
        do {
            let directory = state.stateDir ?? RestorationStore.defaultDirectory(app: "walkie")
            let saved = try? RestorationStore(directory: directory).load()
            guard saved != nil || FileManager.default.fileExists(atPath: directory + "/channel.json") else {
                throw WalkieFailure.usage("no channel to restore; join one with 'walkie join --server HOST:PORT --token T'")
            }
            let settings = SavedSettings.load(from: directory)
            // A flag given here replaces its part of what was saved: --push another source (with
            // its own default port), --push-port the port.
            let savedPush = settings?.pushChoice.saved
            let source = push ?? savedPush?.source
            let port = pushPort ?? (push == nil || push == savedPush?.source ? savedPush?.port : nil)
            let pushChoice = PushChoice(source: source, port: port)
            let tokenFile = self.tokenFile ?? settings?.tokenFile
            // The token to be restored with: a newer one in the token file, else the saved one.
            let token = tokenFile.flatMap { try? readTokenFile($0) } ?? saved?.credentials.token
            let configuration = try audio.configuration(capture: true, playback: true, probeMicrophone: token.map(mayTalk) ?? true)
            try Interactive.preflight(interactive)
            let transport = pushChoice.transport(host: saved?.credentials.host ?? "127.0.0.1")
            let delegate = WalkieDelegate()
            let manager = try await makeManager(delegate: delegate, stateDirectory: directory, push: transport, audio: configuration)
            if let problem = manager.restorationError { throw WalkieFailure.other(problem.description) }
            guard manager.activeChannelUUID != nil, let saved else {
                throw WalkieFailure.usage("no channel to restore; join one with 'walkie join --server HOST:PORT --token T'")
            }
            // A token put in the file while walkie was stopped is handed over at once: the saved one
            // may have expired meanwhile.
            let shared = Interactive.SharedBox()
            let renewals = tokenFile.map { path in
                watchTokenFile(path, current: saved.credentials.token, manager: manager, channel: saved.channel) { text in shared.report(text) }
            }
            defer { renewals?.cancel() }
            say("rejoining at \(saved.credentials.address)… (Ctrl-C to give up)")
            try await awaitJoin(delegate, manager: manager, tokenFile: tokenFile, server: saved.credentials.address)
            try await Interactive.run(manager: manager, delegate: delegate, options: interactive, tokenFile: tokenFile,
                                      pushes: transport != nil, shared: shared)
        } catch let failure as WalkieFailure {
            fail(failure)
        }
    }
}

/// The full-screen loop. The terminal is a blocking file descriptor, so the loop runs on a thread of its
/// own; the manager is thread-safe and reports through its events and delegate, which update `Shared`.
enum Interactive {
    /// What the delegate and the event stream tell the screen.
    struct Shared: Sendable {
        var status: ScreenModel.StatusMessage?
        /// The service was not ready since the status line last said so: the next `ready` replaces
        /// whatever the line still shows (the connection error, most often).
        var wasDown = false
        /// `ready` was seen once: the `connecting` every session starts with is no outage.
        var everReady = false
        var requesting = false
        /// A press is held while the channel is away, and the line says so: the outage's own notices
        /// (connecting, push delivery down) don't replace it, or the press would look dropped. Its
        /// end (granted, failed, let go) clears or replaces the line.
        var holdsWaitingLine: Bool { requesting && status?.text.hasPrefix("Not connected") == true }
        var left: String?
        /// The server ended the membership (removed, revoked, channel deleted): exit 4, as for a token
        /// refused at the join, since the same token won't get back in.
        var removed = false
        /// The last push said leave: squelchd sends that when an administrator removed the member
        /// or deleted the channel, or it forgot a member away too long; a backgrounded walkie learns
        /// it no other way.
        var leavePushed = false
        /// The session's last notice and when (monotonic ns): squelchd's own words for a removal
        /// ("the channel was deleted by an administrator", "your participant token was revoked"),
        /// which come on the manager's event stream around the delegate's `didLeave`.
        var lastNotice: (text: String, at: UInt64)?
        var leftAt: UInt64?
        /// What the screen ends with: the removal in squelchd's words when they came with it.
        var leftMessage: String? {
            guard let left else { return nil }
            guard removed, !leavePushed, let notice = lastNotice, let leftAt,
                  max(notice.at, leftAt) - min(notice.at, leftAt) < 2_000_000_000 else { return left }
            return "\(notice.text); ask for a new token to join again"
        }
        var lastBurst: String?
        /// Since when a floor notice ("Floor busy", "Floor taken away") has stood over a quiet channel.
        var floorNoticeQuietSince: UInt64?
        /// SIGTERM or SIGHUP arrived: quit as `q` would, so that the output WAV is completed.
        var stopRequested = false
        /// The hardware button (`--ptt-device`) is down.
        var buttonDown = false
        /// `--max-transmit` ended the button's transmission while it is still down.
        var buttonCutOff = false
    }

    /// `Shared` behind its lock, made before the screen so that the token-file watcher can report to it.
    final class SharedBox: Sendable {
        let box = NIOLockedValueBox(Shared())
        func report(_ text: String) { box.withLockedValue { $0.status = .init(text, isError: true) } }
    }

    /// What the screen needs, checked before anything joins or is saved: a usage mistake must not
    /// leave a channel saved and a member (with a push token) on the server behind it.
    static func preflight(_ options: InteractiveOptions) throws(WalkieFailure) {
        guard Key(name: options.key) != nil else {
            throw .usage("--key \(options.key) is not a key name; try space, a letter, or f1-f12")
        }
        guard options.maxTransmit.isFinite, options.maxTransmit > 0, options.maxTransmit <= CommandLimits.longestTransmission else {
            throw .usage("--max-transmit \(options.maxTransmit) is not a number of seconds over 0 and at most \(Int(CommandLimits.longestTransmission)) (an hour)")
        }
        guard isatty(STDIN_FILENO) == 1, isatty(STDOUT_FILENO) == 1 else {
            throw .usage(TerminalError.notATerminal.description)
        }
        try checkButton(options)
        if let seconds = options.suspendAfter, !(seconds.isFinite && seconds > 0 && seconds <= 86_400) {
            throw .usage("--suspend-after \(seconds) is not a number of seconds over 0 and at most 86400 (a day)")
        }
    }

    /// Why `b` (or --background) leaves walkie in the foreground: suspended, nothing could wake it.
    static func stayingInForeground(pushes: Bool) -> ScreenModel.StatusMessage {
        let why = pushes ? "push delivery is down; press b once it is back" : "pushes are off (--push off)"
        return .init("Staying in the foreground: no push could wake walkie (\(why))", isError: true)
    }

    static func run(manager: ChannelManager, delegate: WalkieDelegate, options: InteractiveOptions, tokenFile: String?,
                    pushes: Bool, shared sharedBox: SharedBox = SharedBox()) async throws {
        guard let key = Key(name: options.key) else {
            throw WalkieFailure.usage("--key \(options.key) is not a key name; try space, a letter, or f1-f12")
        }
        let session: TerminalSession
        do { session = try TerminalSession() } catch { throw WalkieFailure.usage("\(error)") }
        let shared = sharedBox.box
        let listener = Task {
            for await event in delegate.stream {
                shared.withLockedValue { state in
                    switch event {
                    case .failedToBegin(let error):
                        state.requesting = false
                        state.status = .init(error.code == .transmissionInProgress ? "Floor busy: \(Talk.busyWith(manager)); wait for the channel to clear"
                                                                                     : "Can't talk: \(error.message)", isError: true)
                    case .began:
                        state.requesting = false
                        // Granted after a wait: the queue line is history.
                        if let text = state.status?.text, text.hasPrefix("Waiting for the floor") || text.hasPrefix("Not connected") { state.status = nil }
                    case .joined:
                        // The stream replays what came before the screen (a saved channel left to
                        // join this one): what ended that one says nothing of this one.
                        state.left = nil
                        state.removed = false
                        state.leavePushed = false
                    case .left(.systemPolicy) where state.leavePushed:
                        // Also sent when squelchd forgets members away longer than it keeps them.
                        state.removed = true
                        state.left = "squelchd ended your membership: an administrator removed you or deleted the channel, or you were away longer than the server keeps members; join again with 'walkie join', with a new token if that one is refused"
                    case .left(let reason):
                        state.leftAt = monotonicNanoseconds()
                        state.removed = reason == .systemPolicy
                        state.left = state.removed ? "an administrator removed you from the channel, revoked your token or deleted the channel; ask for a new token to join again" : "the channel was left"
                    case .push(let speaker):
                        state.leavePushed = speaker == nil
                        state.status = .init("Woken by a push: \(speaker ?? "leave")")
                    default: break
                    }
                }
            }
        }
        // The saved channel's descriptor carries the server's name for it ('walkie status' shows it),
        // not the placeholder walkie joined with before it knew; kept current through renames.
        let named = { @Sendable (name: String) in
            if let channel = manager.activeChannelUUID { try? await manager.setChannelDescriptor(ChannelDescriptor(name: name), channelUUID: channel) }
        }
        if let name = manager.channelInfo?.name { await named(name) }
        let events = Task {
            var names = Talk.SlotNames()
            for await event in manager.events {
                names.note(manager)
                if case .channelInfo(let info) = event { await named(info.name) }
                shared.withLockedValue { state in
                    switch event {
                    case .floorQueued(let position): state.status = .init("Waiting for the floor: number \(position) in the queue")
                    case .transmitCancelled:
                        // Let go while the press waited for the channel or in the floor queue: nothing
                        // waits any more, and a line saying it does would stay after the floor is free.
                        if let text = state.status?.text, text.hasPrefix("Not connected") || text.hasPrefix("Waiting for the floor") {
                            state.status = nil
                        }
                    case .serviceStatus(.ready):
                        // Back after an outage: the line that said why it went (or anything from
                        // before) is over.
                        if state.wasDown, state.status != nil {
                            state.status = .init("Connected to squelchd again")
                        } else if !state.requesting, state.status?.text.hasPrefix("Not connected") == true {
                            state.status = nil
                        }
                        state.wasDown = false
                        state.everReady = true
                    case .serviceStatus(.connecting), .serviceStatus(.unavailable):
                        if state.everReady { state.wasDown = true }
                        guard !state.holdsWaitingLine else { break }
                        if let (line, isError) = describe(event, tokenFile: tokenFile) { state.status = .init(line, isError: isError) }
                    case .homeNode(let home?):
                        // A cluster sent the channel to another node: not a fault, only where it is now.
                        state.status = .init("Channel on node \(home)")
                    case .transmissionRevoked(_, let reason): state.status = .init("Floor taken away: \(reason)", isError: true)
                    case .notice(let text):
                        state.lastNotice = (text, monotonicNanoseconds())
                        guard !state.holdsWaitingLine else { break }
                        state.status = .init(text)
                    case .inputEnded:
                        // The manager ended the transmission with the file (`endTransmissionWhenInputEnds`).
                        state.status = .init("The input file ended: floor released; press again to send it again")
                    case .burstFinished(let s):
                        let who = names.name(ofSlot: s.slot).map { "\($0), " } ?? ""
                        state.lastBurst = who + Talk.burstSummary(s)
                    default:
                        if let (line, isError) = describe(event, tokenFile: tokenFile) { state.status = .init(line, isError: isError) }
                    }
                }
            }
        }
        // --background: to the background as soon as a push could wake walkie (the token's first
        // registration takes a moment); never without, or the first call would be missed.
        let backgrounding = Task {
            guard options.background else { return }
            for _ in 0 ..< 50 where !manager.canBeWokenByPush && pushes {
                try? await Task.sleep(for: .milliseconds(100))
            }
            if manager.canBeWokenByPush {
                manager.suspend()
            } else {
                shared.withLockedValue { $0.status = stayingInForeground(pushes: pushes) }
            }
        }
        defer { backgrounding.cancel() }
        let statistics = NIOLockedValueBox<ChannelStatistics?>(nil)
        let poller = Task {
            while !Task.isCancelled {
                let figures = await manager.statistics()
                statistics.withLockedValue { $0 = figures }
                try? await Task.sleep(for: .milliseconds(200))
            }
        }
        var bindings = KeyBindings()
        bindings.pushToTalk = key
        var hold = HoldToTalk.Configuration()
        hold.maximumTransmitDuration = UInt64(max(1, options.maxTransmit) * 1e9)
        let idle = options.effectiveSuspendAfter.map { IdleSuspension(after: UInt64($0 * 1e9), now: monotonicNanoseconds()) }
        let loop = Loop(session: session, manager: manager, shared: shared, statistics: statistics,
                        keyboard: KeyboardController(bindings: bindings, holdToTalk: hold), pushesOn: pushes, idle: idle)
        // SIGTERM (a service manager, `kill`) and SIGHUP (the terminal or ssh session went away) end
        // walkie the way `q` does, so that the output file gets its WAV sizes and the connection says
        // goodbye; by default they would kill it with a file that players read as empty. Ignored
        // before the screen starts, so TerminalSession leaves them alone, and taken here instead.
        let stopSources = takeStopSignals([SIGTERM, SIGHUP]) { shared.withLockedValue { $0.stopRequested = true } }
        defer { for source in stopSources { source.cancel() } }
        let button = startButton(options, manager: manager, shared: shared)
        defer { button?.stop() }
        let outcome: String? = await withCheckedContinuation { continuation in
            let thread = Thread { continuation.resume(returning: loop.run()) }
            thread.name = "walkie-terminal"
            thread.start()
        }
        listener.cancel()
        events.cancel()
        poller.cancel()
        await manager.invalidate()
        if let outcome { throw shared.withLockedValue(\.removed) ? WalkieFailure.token(outcome) : WalkieFailure.other(outcome) }
    }

    /// The terminal loop (reference: Examples/TerminalUIDemo): wait for keys until the next deadline,
    /// act, redraw what changed.
    final class Loop: @unchecked Sendable {
        // @unchecked: the loop's mutable state (session, keyboard, previous frame) is touched only by the
        // one thread that calls `run()`; the shared parts are locks and the thread-safe manager.
        let session: TerminalSession
        let manager: ChannelManager
        let shared: NIOLockedValueBox<Shared>
        let statistics: NIOLockedValueBox<ChannelStatistics?>
        var keyboard: KeyboardController

        /// Whether walkie has a push transport at all (`--push` not off).
        let pushesOn: Bool
        /// --suspend-after: when to close the voice connection for quiet.
        var idle: IdleSuspension?

        init(session: TerminalSession, manager: ChannelManager, shared: NIOLockedValueBox<Shared>,
             statistics: NIOLockedValueBox<ChannelStatistics?>, keyboard: KeyboardController, pushesOn: Bool, idle: IdleSuspension?) {
            self.pushesOn = pushesOn
            self.idle = idle
            self.session = session
            self.manager = manager
            self.shared = shared
            self.statistics = statistics
            self.keyboard = keyboard
        }

        /// Runs until quit; returns a message when the channel ended under us.
        func run() -> String? {
            do { try session.start() } catch { return "\(error)" }
            defer { session.restore() }
            var previous: Frame?
            var muted = false
            var wasTransmitting = false
            var grantedAt: UInt64?
            while true {
                let now = monotonicNanoseconds()
                // Redraw 10 times a second for the meter, the speaker and the figures.
                let deadline = [keyboard.nextDeadline, now + 100_000_000].compactMap { $0 }.min()!
                let input = session.waitForInput(timeout: deadline > now ? deadline - now : 0)
                let time = monotonicNanoseconds()
                if shared.withLockedValue({ $0.stopRequested }) { return nil }
                guard let channel = manager.activeChannelUUID else {
                    // The manager's state says so before its delegate does: wait (briefly) for the
                    // listener to hear `didLeave`, whose reason decides the message and the exit code
                    // (read too early, a removal came out as "the channel was left", exit 1).
                    for _ in 0 ..< 100 where shared.withLockedValue({ $0.left == nil }) { usleep(10_000) }
                    // A removal's reason comes on the other stream: give it a moment too.
                    for _ in 0 ..< 20 where shared.withLockedValue({ $0.removed && $0.leftMessage == $0.left }) { usleep(10_000) }
                    return shared.withLockedValue { $0.leftMessage } ?? "the channel was left"
                }
                // The transmission the key started ended without it (the floor revoked or refused, the
                // input file over): unlatch, or the next tap would only unlatch what is already gone.
                // `requesting` first: it is cleared only after the manager's snapshot says the
                // transmission began, so once it reads false, `isTransmitting` is current.
                if keyboard.holdToTalk.transmitting, !shared.withLockedValue({ $0.requesting }), !manager.isTransmitting {
                    _ = keyboard.transmissionEnded(now: time)
                    // A transmission under way ended by the connection, not the floor or the file:
                    // said, or the latch only dropped to Idle once the connection was given up (20 s
                    // after squelchd died). Not a press that never got the floor: its own failure says why.
                    if wasTransmitting, manager.serviceStatus != .ready {
                        shared.withLockedValue {
                            $0.status = .init("Transmission cut: the connection to squelchd dropped; press again once the channel is back", isError: true)
                        }
                    }
                }
                // Granted (perhaps after a wait in the queue): --max-transmit counts from here.
                let transmittingNow = manager.isTransmitting
                if transmittingNow, !wasTransmitting {
                    keyboard.transmissionGranted(now: time)
                    grantedAt = time
                }
                wasTransmitting = transmittingNow
                enforceButtonLimit(time: time, grantedAt: transmittingNow ? grantedAt : nil, channel: channel)
                sleepWhenIdle(time: time)
                for action in keyboard.receive(input.bytes, now: time) + keyboard.tick(now: time) {
                    switch action {
                    case .startTransmit:
                        // Not `resume()` first: a session not connected (suspended or reconnecting)
                        // holds the request, reconnects and asks for the floor once joined, for up to
                        // `ChannelSession.transmitWaitMilliseconds`.
                        let waiting = !manager.isJoined
                        shared.withLockedValue {
                            $0.requesting = true
                            // Said, so that a press while reconnecting doesn't look ignored while it waits.
                            $0.status = waiting ? .init("Not connected: talking as soon as the channel is back (up to \(ChannelManager.heldPressWaitSeconds) s)") : nil
                        }
                        manager.requestBeginTransmitting(channelUUID: channel, source: .userRequest)
                    case .stopTransmit(let reason):
                        shared.withLockedValue { state in
                            state.requesting = false
                            if reason == .maxTransmitTime { state.status = .init("Released after the \(Int(keyboard.holdToTalk.configuration.maximumTransmitDuration / 1_000_000_000)) s limit") }
                        }
                        manager.stopTransmitting(channelUUID: channel, source: .userRequest)
                    case .enableKittyKeyboard:
                        session.enableKittyKeyboard()
                    case .command(.quit):
                        return nil
                    case .command(.background):
                        if manager.isSuspended {
                            manager.resume()
                            shared.withLockedValue { $0.status = .init("Voice connection reopened") }
                        } else if !manager.canBeWokenByPush {
                            // Suspended without a push channel, walkie would never wake: a missed call.
                            shared.withLockedValue { $0.status = stayingInForeground(pushes: pushesOn) }
                        } else {
                            manager.suspend()
                            shared.withLockedValue { $0.status = .init("In the background: a push wakes walkie when someone talks") }
                        }
                    case .command(.toggleMute):
                        muted.toggle()
                        manager.setPlaybackMuted(muted)
                    case .command(.suspend):
                        session.suspend()
                    case .command(.redraw):
                        previous = nil
                    case .command:
                        break
                    }
                }
                if input.endOfInput { return nil }
                if input.resized || input.resumed { previous = nil }
                let frame = render(time: time, muted: muted)
                if frame != previous {
                    session.write(Screen.ansi(frame, previous: previous))
                    previous = frame
                }
            }
        }

        func render(time: UInt64, muted: Bool) -> Frame {
            // A floor notice says how the last press went; once the channel has been quiet for 5 s
            // after it, it is history (it used to stay over "Idle" until the next key).
            let quiet = manager.activeRemoteParticipant == nil && !manager.isTransmitting
            shared.withLockedValue { s in
                guard let text = s.status?.text, text.hasPrefix("Floor busy") || text.hasPrefix("Floor taken away"), quiet, !s.requesting else {
                    s.floorNoticeQuietSince = nil
                    return
                }
                guard let since = s.floorNoticeQuietSince else { s.floorNoticeQuietSince = time; return }
                if time - since >= 5_000_000_000 {
                    s.status = nil
                    s.floorNoticeQuietSince = nil
                }
            }
            let state = shared.withLockedValue { $0 }
            let figures = statistics.withLockedValue { $0 }
            let ptt = keyboard.holdToTalk
            let info = manager.channelInfo
            var model = ScreenModel(channelName: info?.name ?? "Channel")
            switch manager.serviceStatus {
            case .ready: model.serviceStatus = .ready
            case .connecting: model.serviceStatus = .connecting
            case .unavailable: model.serviceStatus = .unavailable
            }
            model.transmissionMode = switch manager.transmissionMode {
            case .fullDuplex: .fullDuplex
            case .listenOnly: .listenOnly
            case .halfDuplex: .halfDuplex
            }
            let remote = manager.activeRemoteParticipant
            if manager.isSuspended {
                model.localState = .background
            } else if manager.isTransmitting {
                model.localState = ptt.latched ? .latched : .transmitting
            } else if state.requesting {
                model.localState = .requestingFloor
            } else if remote != nil {
                model.localState = .receiving
            }
            // Everyone talking, as full duplex allows several (the manager's active participant is
            // one of them); only while connected, when the roster is current.
            var speakers = manager.serviceStatus == .ready ? manager.roster.filter { $0.talking && !$0.isLocal }.map(\.name) : []
            if let remote, !speakers.contains(remote.name) { speakers.insert(remote.name, at: 0) }
            if manager.isTransmitting { speakers.insert("you", at: 0) }
            model.activeSpeaker = speakers.isEmpty ? nil : speakers.joined(separator: ", ")
            model.roster = manager.roster
                .sorted { ($0.talking ? 0 : 1, $0.name) < ($1.talking ? 0 : 1, $1.name) }
                .map { entry in
                    let connection: ScreenModel.Connection
                    switch entry.connection {
                    case .connected: connection = .connected
                    case .reconnecting: connection = .reconnecting
                    case .offline: connection = .offline
                    }
                    // While this end is not connected the roster is what it was, not what it is: nobody
                    // is shown talking on a channel walkie can't hear.
                    return ScreenModel.Member(name: entry.name, role: entry.role, talking: entry.talking && manager.serviceStatus == .ready,
                                              muted: entry.muted, connection: connection, isSelf: entry.isLocal)
                }
            if manager.isTransmitting, let figures { model.inputLevel = .init(rms: figures.inputLevel, peak: figures.inputPeak) }
            model.muted = muted
            if let figures {
                let loss = figures.reception.map { $0.lossFraction * 100 }
                    ?? (figures.packetsSent > 0 ? Double(figures.packetsLost) / Double(figures.packetsSent) * 100 : 0)
                model.network = .init(roundTripMilliseconds: figures.roundTripMilliseconds ?? 0, lossPercent: loss,
                                      jitterBufferMilliseconds: Double(figures.jitterTargetMilliseconds))
            }
            model.keyboard = ptt.mode
            model.bindings = keyboard.bindings
            model.status = state.status ?? state.lastBurst.map { .init("Last burst: \($0)") }
            model.transmitElapsed = ptt.transmitStartedAt.map { time - $0 }
            // The channel's own limit, when shorter: squelchd ends the burst there.
            let channelLimit = info.map { UInt64(max(1, $0.maxBurstSeconds)) * 1_000_000_000 } ?? .max
            model.maximumTransmit = min(ptt.configuration.maximumTransmitDuration, channelLimit)
            let size = session.size()
            return Screen.render(model, width: size.columns, height: size.rows)
        }
    }
}
