import Audio
import ChannelProtocol
import Foundation
import NIOConcurrencyHelpers
import Opus
import ParticipantClaims
import ParticipantTokens
import PTTClient
import SimulatedPush

/// What walkie learns from the channel manager's delegate, kept for the commands and the screen.
final class WalkieDelegate: ChannelManagerDelegate, ChannelRestorationDelegate {
    enum Event: Sendable {
        case joined(ChannelJoinReason), left(ChannelLeaveReason)
        case began, ended(ChannelTransmitRequestSource)
        case failedToJoin(ChannelError), failedToBegin(ChannelError)
        case push(String?)
    }

    /// Each waiter gets a stream of its own that starts with everything so far (so an outcome that came
    /// before the waiter did is not missed); a cancelled waiter's stream ends without ending the others.
    private let state = NIOLockedValueBox(State())
    private struct State {
        var history: [Event] = []
        var subscribers: [UUID: AsyncStream<Event>.Continuation] = [:]
    }

    var stream: AsyncStream<Event> {
        let (stream, continuation) = AsyncStream.makeStream(of: Event.self)
        let id = UUID()
        state.withLockedValue { state in
            for event in state.history { continuation.yield(event) }
            state.subscribers[id] = continuation
        }
        continuation.onTermination = { [state] _ in state.withLockedValue { _ = $0.subscribers.removeValue(forKey: id) } }
        return stream
    }

    private func publish(_ event: Event) {
        let targets = state.withLockedValue { state -> [AsyncStream<Event>.Continuation] in
            state.history.append(event)
            if state.history.count > 64 { state.history.removeFirst() }  // a radio left on for days
            return Array(state.subscribers.values)
        }
        for continuation in targets { continuation.yield(event) }
    }

    func channelManager(_ m: ChannelManager, didJoinChannel id: UUID, reason: ChannelJoinReason) { publish(.joined(reason)) }
    func channelManager(_ m: ChannelManager, didLeaveChannel id: UUID, reason: ChannelLeaveReason) { publish(.left(reason)) }
    func channelManager(_ m: ChannelManager, channelUUID: UUID, didBeginTransmittingFrom source: ChannelTransmitRequestSource) { publish(.began) }
    func channelManager(_ m: ChannelManager, channelUUID: UUID, didEndTransmittingFrom source: ChannelTransmitRequestSource) { publish(.ended(source)) }
    func channelManager(_ m: ChannelManager, receivedEphemeralPushToken token: Data) {}
    func incomingPushResult(channelManager: ChannelManager, channelUUID: UUID, pushPayload: [String: PushValue]) -> PushResult {
        // Apple's rule: a push without a speaker means leave the channel (and so does one whose
        // speaker can't be shown). `.push(nil)` says it was a leave.
        let participant = pushPayload["activeSpeaker"]?.stringValue.flatMap { try? Participant(name: $0) }
        publish(.push(participant?.name))
        guard let participant else { return .leaveChannel }
        return .activeRemoteParticipant(participant)
    }
    func channelManager(_ m: ChannelManager, didActivate audioSession: AudioSession) {}
    func channelManager(_ m: ChannelManager, didDeactivate audioSession: AudioSession) {}
    func channelManager(_ m: ChannelManager, failedToJoinChannel id: UUID, error: ChannelError) { publish(.failedToJoin(error)) }
    func channelManager(_ m: ChannelManager, failedToBeginTransmittingInChannel id: UUID, error: ChannelError) { publish(.failedToBegin(error)) }
    func channelDescriptor(restoredChannelUUID id: UUID) -> ChannelDescriptor { ChannelDescriptor(name: "Channel") }
}

/// Whether the token lets its member talk. A listen-only member's walkie doesn't open the microphone
/// at start: a radio that only receives (a monitor on a machine without one) must not fail for want
/// of it, and a renewal that lets it talk still opens it at the first press. A token that can't be
/// read counts as talking; the join says what is wrong with it.
func mayTalk(_ token: String) -> Bool {
    (try? tokenClaims(token))?.capabilities.contains(.talk) ?? true
}

/// The claims walkie reads from a participant token, unverified (the server verifies): which channel
/// to join, and who we are, for messages.
func tokenClaims(_ token: String) throws(WalkieFailure) -> ParticipantClaims {
    do throws(TokenError) { return try TokenAuthority.unverifiedClaims(of: token) } catch {
        // "…is not a valid token (why); copy it again in full"
        throw .token(error.description)
    }
}

extension ServerOptions {
    /// The credentials for this server and token.
    func credentials() throws(WalkieFailure) -> (ChannelCredentials, UUID) {
        if token != nil && tokenFile != nil { throw .usage("give either --token or --token-file, not both") }
        let given: String? = if let tokenFile { try readTokenFile(tokenFile) } else if let token { try tokenFromArgument(token) } else { nil }
        guard let token = given else {
            throw .usage("give a token with --token or --token-file (from 'squelchd token issue')")
        }
        let claims = try tokenClaims(token)
        guard let colon = server.lastIndex(of: ":"), let port = Int(server[server.index(after: colon)...]) else {
            throw .usage("--server must be HOST:PORT, like 127.0.0.1:7700")
        }
        guard (1...65535).contains(port) else { throw .usage("--server \(server): the port must be 1-65535 (squelchd's default is 7700)") }
        let host = String(server[..<colon]).trimmingCharacters(in: CharacterSet(charactersIn: "[]"))
        guard FileManager.default.isReadableFile(atPath: ca) else {
            throw .certificate("can't read the CA file \(ca); pass the CA that signed the server's certificate with --ca (certs/ca.pem in development)")
        }
        // Absolute: the credentials are saved for restoring, which may run from another directory.
        let caPath = URL(fileURLWithPath: ca).standardizedFileURL.path
        return (ChannelCredentials(host: host, port: port, caPath: caPath, token: token), claims.channel)
    }

    func pushTransport() -> (any PushTransport)? {
        let host = server.lastIndex(of: ":").map { String(server[..<$0]).trimmingCharacters(in: CharacterSet(charactersIn: "[]")) } ?? "127.0.0.1"
        return pushChoice.transport(host: host)
    }
}

extension AudioOptions {
    /// The input file's audio at the pipeline's rate. Read once: a pipe or a FIFO
    /// (`--file /dev/stdin`, `<(…)`) can't be read a second time.
    static func readInput(_ file: String) throws(WalkieFailure) -> [Int16] {
        // "-" is standard input, as for most tools (`sox … -t wav - | walkie talk --file -`).
        let path = file == "-" ? "/dev/stdin" : file
        // AudioError names the path and says what to do.
        do { return try WAVAudio.read(path: path).pipelineSamples(resampler: Resampler()) } catch {
            let text = "\(error)"
            throw .audio(text.hasPrefix(file + ":") ? text : "can't use \(file) as input: \(text)")
        }
    }

    /// Opens the devices once up front, so that a missing one is reported before anything else.
    /// - Parameter inputSamples: the input file's audio, when the caller has read it already.
    /// `probeMicrophone` false opens the microphone only when a transmission starts, not now: for a
    /// listen-only member, whose walkie must run without one.
    func configuration(capture: Bool, playback: Bool, probeMicrophone: Bool = true, outputFlag: String = "--output-file",
                       inputSamples: [Int16]? = nil) throws(WalkieFailure) -> AudioConfiguration {
        var audio = AudioConfiguration()
        if capture {
            if let file = inputFile {
                let samples: [Int16]
                if let inputSamples { samples = inputSamples } else { samples = try Self.readInput(file) }
                audio.makeInput = { WAVFileSource(pipelineSamples: samples, pacer: RealTimePacer()) }
                // Each press sends the file from its start; its end releases the floor.
                audio.endTransmissionWhenInputEnds = true
            } else {
                let device = input
                ALSA.silenceErrorMessages()
                if probeMicrophone {
                    do { try ALSACapture(device: device).close() } catch {
                        throw .audio("can't open the microphone: \(error)")
                    }
                }
                audio.makeInput = { try ALSACapture(device: device) }
            }
        }
        if playback {
            if let file = outputFile {
                // Checked, not created: the sink truncates the file only once the channel is joined, so a
                // join that fails (a wrong token, squelchd down) leaves a file already there untouched.
                var status = stat()
                if stat(file, &status) == 0, status.st_mode & S_IFMT != S_IFREG, status.st_mode & S_IFMT != S_IFDIR {
                    throw .audio("\(file) is not a regular file (a pipe or a device); a WAV recording needs a file, since its sizes are written at its start as it grows; choose a file for \(outputFlag)")
                }
                guard !file.isEmpty, Self.canWrite(file) else {
                    throw .audio("can't write '\(file)'; choose a writable path for \(outputFlag)")
                }
                let pacer = RealTimePacer()
                audio.makeOutput = { try WAVFileSink(path: file, pacer: pacer) }
            } else {
                let device = output
                ALSA.silenceErrorMessages()
                do { _ = try ALSAPlayback(device: device) } catch {
                    throw .audio("can't open the speaker: \(error)")
                }
                audio.makeOutput = { try ALSAPlayback(device: device) }
            }
            audio.tones = try Self.tones(tones)
        }
        return audio
    }

    /// `--tones`: all, off, or a list of permit, busy, queued and end.
    static func tones(_ text: String) throws(WalkieFailure) -> ToneConfiguration {
        let names: [String: Tone] = ["permit": .talkPermit, "busy": .busy, "queued": .queued, "end": .endOfBurst]
        switch text.lowercased() {
        case "all": return .standard
        case "off", "none": return .off
        default:
            var enabled: Set<Tone> = []
            for word in text.lowercased().split(separator: ",") {
                guard let tone = names[word.trimmingCharacters(in: .whitespaces)] else {
                    throw .usage("--tones \(text): '\(word)' is not a tone; use all, off, or a list of permit, busy, queued, end (e.g. permit,end)")
                }
                enabled.insert(tone)
            }
            return ToneConfiguration(enabled: enabled)
        }
    }
}

extension AudioOptions {
    /// Whether `path` can be written: an existing file that is writable and not a directory, or a new
    /// name in a writable directory.
    static func canWrite(_ path: String) -> Bool {
        var isDirectory: ObjCBool = false
        if FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory) {
            return !isDirectory.boolValue && access(path, W_OK) == 0
        }
        let directory = (path as NSString).deletingLastPathComponent
        return access(directory.isEmpty ? "." : directory, W_OK) == 0
    }
}

/// Turns a failed join into walkie's exit code and a line that says what to do.
func failure(joining error: ChannelError, server: String) -> WalkieFailure {
    switch error.refusal {
    case .tokenExpired?, .tokenForged?, .tokenMalformed?, .tokenNotYetValid?, .tokenRevoked?:
        return .token(error.message)
    case .tokenWrongChannel?, .channelNotFound?:
        return .token("\(error.message)")
    default: break
    }
    if error.message.contains("certificate") || error.message.contains("CA") {
        // The transport's message may say what to do already (after a ';'): an expired certificate
        // is the operator's to renew, a wrong name the address's to fix; --ca fits neither.
        return .certificate(error.message.contains("--ca") || error.message.contains("pass the CA") || error.message.contains(";")
                            ? error.message : "\(error.message); pass the CA that signed squelchd's certificate with --ca")
    }
    if error.message.contains("no answer") || error.message.contains("can't reach") {
        return .unreachable(error.message)
    }
    return .other(error.message)
}

/// What `walkie join` was given that the channel manager's record does not keep, so that `walkie`
/// with no command, after a restart, wakes by push from the same service and renews from the same
/// token file rather than falling back to the defaults (pushes to a port nothing listens on would
/// leave it unable to go to the background, and a session without its token file ends at expiry).
struct SavedSettings: Codable, Equatable {
    /// Nil in a file from before `--push`: `pushPort` was then the simulator's.
    var push: PushSource?
    var pushPort: Int?
    var tokenFile: String?

    init(push: PushChoice, tokenFile: String?) {
        (self.push, self.pushPort) = push.saved
        self.tokenFile = tokenFile
    }

    /// The choice saved. A file from before `--push` always held a simulator port, 2198 unless one
    /// was given: the default then stands for today's default, the device push service.
    var pushChoice: PushChoice {
        if push == nil, pushPort == PushChoice.simulatorControlPort { return .device(port: nil) }
        return PushChoice(source: push, port: pushPort)
    }

    static let file = "walkie.json"

    /// The settings saved in `directory`; nil when there are none or they can't be read (a file from
    /// an older walkie, or damaged, is moved aside), which only costs the defaults.
    static func load(from directory: String) -> SavedSettings? {
        (try? RestorationStore(directory: directory).loadValue(SavedSettings.self, named: file)) ?? nil
    }

    /// Saves these beside the channel's record; a failure is said, not fatal: the channel is joined.
    func save(in directory: String) -> String? {
        do throws(RestorationError) {
            try RestorationStore(directory: directory).saveValue(self, named: Self.file)
            return nil
        } catch {
            let why = if case .unwritable(_, _, let why) = error { why } else { "\(error)" }
            return "could not save --push, --push-port and --token-file for the next start in \(directory) (\(why)); 'walkie' will use the defaults"
        }
    }
}

/// Makes the manager for `stateDirectory` (the default one when nil).
func makeManager(delegate: WalkieDelegate, stateDirectory: String?, push: (any PushTransport)?,
                 audio: AudioConfiguration, purpose: StateDirectoryLock.Purpose = .use, waitsForFloor: Bool = true) async throws(WalkieFailure) -> ChannelManager {
    try StateDirectoryLock.acquire(stateDirectory ?? RestorationStore.defaultDirectory(app: "walkie"), for: purpose)
    do {
        return try await ChannelManager.channelManager(
            delegate: delegate, restorationDelegate: delegate,
            configuration: ChannelManagerConfiguration(appIdentifier: "walkie", stateDirectory: stateDirectory, pushTransport: push, audio: audio,
                                                       waitsForFloor: waitsForFloor))
    } catch {
        throw .other(error.message)
    }
}

/// Waits for the join to succeed or fail. A restored channel whose saved token has expired is kept
/// by the manager, waiting for a new token (`needsNewToken`): without a `tokenFile` to bring one,
/// that is a token failure at once, not a server that did not answer.
func awaitJoin(_ delegate: WalkieDelegate, manager: ChannelManager? = nil, tokenFile: String? = nil, server: String,
               seconds: Double = 20) async throws(WalkieFailure) {
    let expired = "the saved participant token has expired; the channel stays saved: rejoin it with a new token ('walkie join --server \(server) --token …'), or run with --token-file"
    let outcome = await withTaskGroup(of: WalkieFailure?.self) { group -> WalkieFailure? in
        group.addTask {
            for await event in delegate.stream {
                switch event {
                case .joined: return nil
                case .failedToJoin(let error): return failure(joining: error, server: server)
                default: continue
                }
            }
            return .other("the channel manager stopped")
        }
        if let manager, tokenFile == nil {
            group.addTask {
                while !Task.isCancelled {
                    if manager.needsNewToken { return .token(expired) }
                    try? await Task.sleep(for: .milliseconds(100))
                }
                return nil
            }
        }
        group.addTask {
            try? await Task.sleep(for: .seconds(seconds))
            if let manager, manager.needsNewToken, let tokenFile {
                return .token("the saved participant token has expired and \(tokenFile) held no newer one within \(Int(seconds)) s; put a new token in it")
            }
            return .unreachable("no answer from squelchd at \(server) within \(Int(seconds)) s; check that it runs and --server is right")
        }
        let first = await group.next() ?? nil
        group.cancelAll()
        return first
    }
    if let outcome { throw outcome }
}

/// The token in a `--token-file`: its content without surrounding whitespace (an editor's newline).
/// `--token`: `-` reads it from standard input; a token itself is taken, with a warning, since every
/// user of the machine can read a process's arguments (`ps`, /proc/PID/cmdline) and it is a bearer
/// credential.
func tokenFromArgument(_ argument: String) throws(WalkieFailure) -> String {
    guard argument == "-" else {
        FileHandle.standardError.write(Data("walkie: warning: a token on the command line can be read by every user of this machine (ps, /proc); use --token-file FILE, or --token - to read it from standard input\n".utf8))
        return argument
    }
    let token = (readLine(strippingNewline: true) ?? "").trimmingCharacters(in: .whitespacesAndNewlines)
    guard !token.isEmpty else { throw .token("--token - read no token from standard input; pipe in the output of 'squelchd token issue'") }
    return token
}

func readTokenFile(_ path: String) throws(WalkieFailure) -> String {
    guard let data = FileManager.default.contents(atPath: path) else {
        throw .usage("can't read the token file \(path); check the path and its permissions")
    }
    let token = String(decoding: data, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
    guard !token.isEmpty else { throw .token("the token file \(path) is empty; put the output of 'squelchd token issue' in it") }
    return token
}

/// Hands the manager every new token that appears in `path`, so that a session outlives its first
/// token (the server ends a session when its token expires). The file is read once a second: it is
/// replaced far less often than that, and polling works on any filesystem. An unreadable or
/// half-written file is skipped until the next read, but one that stays unusable (gone, empty, not a
/// token) for `unusableGrace` reads is said once, while the current token still works: otherwise the
/// first sign of a broken renewal job would be the session ending when that token expires. A token
/// the server refuses is reported by the manager (`tokenRenewalFailed`) and not sent again until the
/// file changes. `problem` hears of both, and of a token the manager won't even offer (another user's).
func watchTokenFile(_ path: String, current: String, manager: ChannelManager, channel: UUID,
                    problem: @escaping @Sendable (String) -> Void) -> Task<Void, Never> {
    Task {
        var last = current
        var unusableReads = 0
        while !Task.isCancelled {
            do throws(WalkieFailure) {
                let token = try readTokenFile(path)
                _ = try tokenClaims(token)
                if unusableReads >= tokenFileUnusableGrace, token == last {
                    // Said to be unusable, and now holds the token in use again: say that it is over
                    // (a new token says so itself, "token renewed").
                    problem("the token file \(path) holds the current token again")
                }
                unusableReads = 0
                if token != last {
                    last = token
                    do throws(ChannelError) { try await manager.renewToken(token, channelUUID: channel) } catch {
                        problem("the token in \(path) was not used: \(error.message)")
                    }
                }
            } catch {
                unusableReads += 1
                if unusableReads == tokenFileUnusableGrace {
                    let until = (try? tokenClaims(last)).map { " until \($0.expiresAt.formatted(date: .omitted, time: .shortened))" } ?? ""
                    problem("the token file can't be used (\(error.message)); the current token goes on\(until); put the output of 'squelchd token issue' in \(path)")
                }
            }
            try? await Task.sleep(for: .seconds(1))
        }
    }
}

/// Reads (a second apart) a token file may be unusable before it is said: a writer that truncates
/// and then writes takes far less.
let tokenFileUnusableGrace = 5

/// What a session event (the token's, the listeners' loss) means for the person at the terminal: a
/// line, and whether it is a problem.
func describe(_ event: ChannelManagerEvent, tokenFile: String?) -> (line: String, isError: Bool)? {
    let clock = Date.FormatStyle(date: .omitted, time: .standard)
    let renew = tokenFile.map { "put a new token in \($0)" } ?? "restart with a new token (use --token-file to renew without a break)"
    switch event {
    case .tokenExpiring(let at):
        return ("token expires at \(at.formatted(clock)); \(renew)", false)
    case .tokenRenewed(let at):
        return ("token renewed; valid until \(at.formatted(clock))", false)
    case .tokenRenewalFailed(_, let reason):
        return ("new token refused: \(reason); \(renew)", true)
    case .tokenExpired:
        return ("token expired and the server closed the session; \(renew)", true)
    case .listenerLoss(let percent) where percent >= OpusConfiguration.fecLossThreshold:
        return ("listeners are missing up to \(percent) % of your audio; sending it with error correction", false)
    case .listenerLoss:
        return ("no listener reports losing your audio now; error correction off", false)
    case .outputDevice(.lost(let why)):
        return ("Speaker lost: \(why); trying it again every second", true)
    case .outputDevice(.restored):
        return ("Speaker back", false)
    case .inputDevice(.lost(let why)):
        return ("Microphone lost: \(why); trying it again every second", true)
    case .inputDevice(.restored):
        return ("Microphone back", false)
    default:
        return nil
    }
}

/// One walkie per state directory. Two would share one saved channel and one membership: a `walkie
/// leave` beside a running walkie made the server forget the member, and the running one, which had
/// only stepped aside for the leave's connection, took the channel back at the next press and saved
/// it again, so the leave quietly came undone. The lock is `flock` on `walkie.lock` in the directory,
/// held until the process exits (the kernel lets go of it then, `kill -9` included, so a crashed
/// walkie never leaves a stale lock); the file holds the holder's pid for the message.
enum StateDirectoryLock {
    enum Purpose { case use, leave }

    static let fileName = "walkie.lock"

    /// Whether a walkie holds `directory` now (`.some`, with its pid when the file names a live
    /// process), without taking it: a shared lock, tried and let go at once, which two `status` runs
    /// can hold together. A filesystem without locks (some NFS or FUSE mounts) answers nil.
    static func holder(of directory: String) -> Int32?? {
        let path = (directory as NSString).appendingPathComponent(fileName)
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        guard flock(fd, LOCK_SH | LOCK_NB) != 0, errno == EWOULDBLOCK else { return nil }
        return .some(recordedPid(path))
    }

    /// The pid the lock file names, if that process is alive: a walkie that lost a race to start may
    /// read the file before the winner has written its own.
    static func recordedPid(_ path: String) -> Int32? {
        let text = (try? String(contentsOfFile: path, encoding: .utf8))?.trimmingCharacters(in: .whitespacesAndNewlines)
        guard let pid = text.flatMap({ Int32($0) }), pid > 0, kill(pid, 0) == 0 || errno == EPERM else { return nil }
        return pid
    }

    static func acquire(_ directory: String, for purpose: Purpose) throws(WalkieFailure) {
        do {
            try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true,
                                                    attributes: [.posixPermissions: 0o700])
        } catch {
            throw .other("can't create the state directory \(directory) (\(error.localizedDescription)); check its permissions or give another with --state-dir")
        }
        let path = (directory as NSString).appendingPathComponent(fileName)
        let fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
        guard fd >= 0 else {
            throw .other("can't open \(path) (\(String(cString: strerror(errno)))); check the state directory's permissions or give another with --state-dir")
        }
        // A `walkie status` looking at the same moment holds a shared lock for microseconds: tried a few
        // times over 100 ms before another walkie is taken to hold it.
        var attempts = 0
        while flock(fd, LOCK_EX | LOCK_NB) != 0 {
            guard errno == EWOULDBLOCK else {
                // No locks on this filesystem (ENOLCK, EOPNOTSUPP): go on unguarded rather than refuse
                // to run at all.
                FileHandle.standardError.write(Data("walkie: can't lock \(path) (\(String(cString: strerror(errno)))); running without the guard against a second walkie on this state directory\n".utf8))
                return
            }
            attempts += 1
            guard attempts >= 5 else {
                usleep(20_000)
                continue
            }
            close(fd)
            let who = recordedPid(path).map { "another walkie (pid \($0))" } ?? "another walkie"
            switch purpose {
            case .leave:
                throw .other("\(who) has this channel open (state directory \(directory)); leave from it: quit it with q, then run 'walkie leave' again")
            case .use:
                throw .other("\(who) is using the state directory \(directory); quit it with q first, or give this one its own --state-dir")
            }
        }
        let pid = Array("\(getpid())\n".utf8)
        _ = ftruncate(fd, 0)
        _ = pid.withUnsafeBytes { pwrite(fd, $0.baseAddress, $0.count, 0) }
        // The descriptor stays open, on purpose, for the rest of the process: closing it would let go of
        // the lock.
    }
}
