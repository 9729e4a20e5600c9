import ArgumentParser
import Audio
import ChannelProtocol
import Foundation
import JitterBuffer
import ParticipantTokens
import NIOConcurrencyHelpers
import PTTClient
import SquelchInfo

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
        audio.tones = "off"  // a recording holds what was said, as a radio logger's does
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
        if oneShot.leave, early == nil { manager.userLeftChannel(channelUUID: channel) }
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
