// A small app written against PTTClient's public API, the way an iOS app uses PushToTalk: it makes
// the channel manager at start (which restores the last channel), joins, talks, listens, and logs
// every delegate callback on its own line.
//
//   ptt-example --host 127.0.0.1 --port 7700 --ca certs/ca.pem --token "$TOKEN" --channel "$ID" \
//       [--talk-seconds 2] [--record heard.wav] [--run-seconds 10] [--push-control-port 2198]
//   ptt-example [--run-seconds 10]     # no channel given: restore the one from last time
//
// State lives in $XDG_STATE_HOME/squelch/ptt-example (or --state-dir).

import Audio
import Foundation
import PTTClient
import SimulatedPush
import Synchronization

let usage = """
    usage: ptt-example --channel ID --token T [--host 127.0.0.1] [--port 7700] [--ca certs/ca.pem]
                       [--talk-seconds S] [--record heard.wav] [--run-seconds 10] [--push-control-port 2198]
                       [--state-dir DIR] [--leave]
           ptt-example [--run-seconds 10] [--state-dir DIR]     restore the channel from last time
    Logs every delegate callback on its own line. Exits 1 if the join fails or no join comes within
    --run-seconds, 2 if there is nothing to restore, 64 if an option is wrong.
    """
if CommandLine.arguments.contains("--help") || CommandLine.arguments.contains("-h") {
    print(usage)
    exit(0)
}

// Every argument must be one of these: a misspelt option (`--chanel`) would otherwise be ignored and
// the app would restore or wait as if it had not been given.
let valued: Set<String> = ["--host", "--port", "--ca", "--token", "--channel", "--talk-seconds", "--record", "--run-seconds",
                           "--push-control-port", "--state-dir"]
do {
    var rest = CommandLine.arguments.dropFirst()
    while let argument = rest.popFirst() {
        if valued.contains(argument) {
            guard rest.popFirst() != nil else { usageError("\(argument) needs a value") }
        } else if argument != "--leave" {
            usageError("\(argument) is not an option of ptt-example")
        }
    }
}

final class Delegate: ChannelManagerDelegate, ChannelRestorationDelegate {
    /// Set when the join fails, so that the app doesn't wait to talk on a channel it never joined.
    let joinFailed = Mutex(false)
    /// Set at `didJoin`: a run that ends without it did nothing and must not exit 0.
    let joined = Mutex(false)

    func log(_ line: String) {
        // Unbuffered, so that a parent process reading the pipe sees each line at once. A reader
        // that went away (`| head -1`) is not a crash: `write(_:)` traps on EPIPE, this throws.
        try? FileHandle.standardOutput.write(contentsOf: Data((line + "\n").utf8))
    }
    func channelManager(_ m: ChannelManager, didJoinChannel id: UUID, reason: ChannelJoinReason) {
        log("didJoin \(id) reason=\(reason)")
        joined.withLock { $0 = true }
    }
    func channelManager(_ m: ChannelManager, didLeaveChannel id: UUID, reason: ChannelLeaveReason) { log("didLeave \(id) reason=\(reason)") }
    func channelManager(_ m: ChannelManager, channelUUID: UUID, didBeginTransmittingFrom source: ChannelTransmitRequestSource) {
        log("didBeginTransmitting source=\(source)")
    }
    func channelManager(_ m: ChannelManager, channelUUID: UUID, didEndTransmittingFrom source: ChannelTransmitRequestSource) {
        log("didEndTransmitting source=\(source)")
    }
    func channelManager(_ m: ChannelManager, receivedEphemeralPushToken token: Data) { log("pushToken \(token.count) bytes") }
    func incomingPushResult(channelManager: ChannelManager, channelUUID: UUID, pushPayload: [String: PushValue]) -> PushResult {
        log("push \(pushPayload["activeSpeaker"]?.stringValue ?? "-")")
        // Apple's sample: a push without a speaker means leave.
        guard let name = pushPayload["activeSpeaker"]?.stringValue, let speaker = try? Participant(name: name) else { return .leaveChannel }
        return .activeRemoteParticipant(speaker)
    }
    func channelManager(_ m: ChannelManager, didActivate audioSession: AudioSession) { log("didActivate") }
    func channelManager(_ m: ChannelManager, didDeactivate audioSession: AudioSession) { log("didDeactivate") }
    func channelManager(_ m: ChannelManager, failedToJoinChannel id: UUID, error: ChannelError) {
        log("failedToJoin code=\(error.code) \(error.message)")
        joinFailed.withLock { $0 = true }
    }
    func channelManager(_ m: ChannelManager, failedToBeginTransmittingInChannel id: UUID, error: ChannelError) {
        log("failedToBeginTransmitting code=\(error.code) \(error.message)")
    }
    func channelDescriptor(restoredChannelUUID id: UUID) -> ChannelDescriptor { ChannelDescriptor(name: "Restored channel") }
}

func option(_ name: String) -> String? {
    let args = CommandLine.arguments
    guard let i = args.firstIndex(of: name), i + 1 < args.count else { return nil }
    return args[i + 1]
}

/// Ends the app with status 64 (a usage error) and a line on standard error.
func usageError(_ text: String) -> Never {
    FileHandle.standardError.write(Data("ptt-example: \(text); see ptt-example --help\n".utf8))
    exit(64)
}

/// An option's number, checked: a typo is said, not replaced by the default, and a number too large
/// for Swift's durations (`--talk-seconds 1e300`) is an error rather than a crash.
func number(_ name: String, default value: Double, in range: ClosedRange<Double>) -> Double {
    guard let text = option(name) else { return value }
    guard let number = Double(text), number.isFinite, range.contains(number) else {
        usageError("\(name) \(text) is not a number from \(Int(range.lowerBound)) to \(Int(range.upperBound))")
    }
    return number
}

func port(_ name: String, default value: Int?) -> Int? {
    guard let text = option(name) else { return value }
    guard let port = Int(text), (1...65_535).contains(port) else { usageError("\(name) \(text) is not a port number (1-65535)") }
    return port
}

// Checked before the manager is made, which may already be restoring a saved channel.
if let text = option("--channel"), UUID(uuidString: text) == nil { usageError("--channel \(text) is not a channel id (a UUID)") }
if option("--channel") != nil, option("--token") == nil { usageError("--channel needs --token, the participant token for it") }
let delegate = Delegate()
let runSeconds = number("--run-seconds", default: 10, in: 0...86_400)
// The speech is made in memory before it is sent: an hour of it is 170 MB.
let talkSeconds = number("--talk-seconds", default: 0, in: 0...3_600)
let record = option("--record")
if let record {
    // The recording is opened when the first audio comes: a path that can't be written would only
    // show as a notice then, so it is checked now.
    let directory = URL(fileURLWithPath: record).deletingLastPathComponent().path
    guard FileManager.default.isWritableFile(atPath: directory) else {
        usageError("--record \(record): can't write in \(directory); give a path in a directory that exists and is writable")
    }
}
let pacer = RealTimePacer()
var audio = AudioConfiguration()
if talkSeconds > 0 {
    let speech = TestSignal.speechLike(seconds: talkSeconds)
    audio.makeInput = { WAVFileSource(pipelineSamples: speech, pacer: RealTimePacer()) }
}
if let record { audio.makeOutput = { try WAVFileSink(path: record, pacer: pacer) } }
var configuration = ChannelManagerConfiguration(appIdentifier: "ptt-example", stateDirectory: option("--state-dir"), audio: audio)
if let port = port("--push-control-port", default: nil) { configuration.pushTransport = SimulatedPushTransport(controlPort: port) }

let manager: ChannelManager
do {
    manager = try await ChannelManager.channelManager(delegate: delegate, restorationDelegate: delegate, configuration: configuration)
} catch {
    print("ptt-example: \(error)")
    exit(1)
}
if let problem = manager.restorationError { delegate.log("restoration: \(problem)") }

/// The server the run joins, for its last word if no join comes: the one given, or the saved one's.
var server = "the saved channel's server"
if let channel = option("--channel").flatMap(UUID.init(uuidString:)), let token = option("--token") {
    let credentials = ChannelCredentials(host: option("--host") ?? "127.0.0.1", port: port("--port", default: 7700)!,
                                         caPath: option("--ca") ?? "certs/ca.pem", token: token)
    server = credentials.address
    manager.requestJoinChannel(channelUUID: channel, descriptor: ChannelDescriptor(name: "Example"), credentials: credentials)
} else if manager.activeChannelUUID == nil {
    delegate.log("no channel to restore; pass --channel and --token to join one (ptt-example --help)")
    exit(2)
}

/// Ends the app with status 1 once the join has failed.
func exitIfTheJoinFailed() async {
    guard delegate.joinFailed.withLock({ $0 }) else { return }
    await manager.invalidate()
    delegate.log("exit")
    exit(1)
}

let deadline = Date().addingTimeInterval(runSeconds)
if talkSeconds > 0 {
    // Talk once the channel is ready, for as long as the input lasts.
    while manager.serviceStatus != .ready || manager.channelInfo == nil {
        await exitIfTheJoinFailed()
        try await Task.sleep(for: .milliseconds(20))
    }
    let channel = manager.activeChannelUUID!
    manager.requestBeginTransmitting(channelUUID: channel)
    try await Task.sleep(for: .seconds(talkSeconds + 0.2))
    manager.stopTransmitting(channelUUID: channel)
}
while Date() < deadline {
    await exitIfTheJoinFailed()
    try await Task.sleep(for: .milliseconds(50))
}
if CommandLine.arguments.contains("--leave"), let channel = manager.activeChannelUUID { manager.leaveChannel(channelUUID: channel) }
try await Task.sleep(for: .milliseconds(200))
await exitIfTheJoinFailed()
await manager.invalidate()
guard delegate.joined.withLock({ $0 }) else {
    // No answer within the run (squelchd not running, a wrong --port, a network in the way): the
    // manager was still trying. Exit 1 as for a failed join, saying so.
    delegate.log("not joined within \(runSeconds) s: no answer from \(server); check that squelchd runs there, or give a longer --run-seconds")
    delegate.log("exit")
    exit(1)
}
delegate.log("exit")
