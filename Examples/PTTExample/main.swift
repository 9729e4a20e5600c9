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
import Synchronization

let usage = """
    usage: ptt-example --channel ID --token T [--host 127.0.0.1] [--port 7700] [--ca certs/ca.pem]
                       [--talk-seconds S] [--record heard.wav] [--run-seconds 10] [--push-control-port 2198]
                       [--state-dir DIR] [--leave]
           ptt-example [--run-seconds 10] [--state-dir DIR]     restore the channel from last time
    Logs every delegate callback on its own line. Exits 1 if the join fails, 2 if there is nothing to restore.
    """
if CommandLine.arguments.contains("--help") || CommandLine.arguments.contains("-h") {
    print(usage)
    exit(0)
}

final class Delegate: ChannelManagerDelegate, ChannelRestorationDelegate {
    /// Set when the join fails, so that the app doesn't wait to talk on a channel it never joined.
    let joinFailed = Mutex(false)

    func log(_ line: String) {
        // Unbuffered, so that a parent process reading the pipe sees each line at once. A reader
        // that went away (`| head -1`) is not a crash: `write(_:)` traps on EPIPE, this throws.
        try? FileHandle.standardOutput.write(contentsOf: Data((line + "\n").utf8))
    }
    func channelManager(_ m: ChannelManager, didJoinChannel id: UUID, reason: ChannelJoinReason) { log("didJoin \(id) reason=\(reason)") }
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

let delegate = Delegate()
let runSeconds = Double(option("--run-seconds") ?? "") ?? 10
let talkSeconds = Double(option("--talk-seconds") ?? "") ?? 0
let record = option("--record")
let pacer = RealTimePacer()
var audio = AudioConfiguration()
if talkSeconds > 0 {
    let speech = TestSignal.speechLike(seconds: talkSeconds)
    audio.makeInput = { WAVFileSource(pipelineSamples: speech, pacer: RealTimePacer()) }
}
if let record { audio.makeOutput = { try WAVFileSink(path: record, pacer: pacer) } }
var configuration = ChannelManagerConfiguration(appIdentifier: "ptt-example", stateDirectory: option("--state-dir"), audio: audio)
if let port = option("--push-control-port").flatMap(Int.init) { configuration.pushTransport = SimulatedPushTransport(controlPort: port) }

let manager: ChannelManager
do {
    manager = try await ChannelManager.channelManager(delegate: delegate, restorationDelegate: delegate, configuration: configuration)
} catch {
    print("ptt-example: \(error)")
    exit(1)
}
if let problem = manager.restorationError { delegate.log("restoration: \(problem)") }

if let channel = option("--channel").flatMap(UUID.init(uuidString:)), let token = option("--token") {
    let credentials = ChannelCredentials(host: option("--host") ?? "127.0.0.1", port: Int(option("--port") ?? "") ?? 7700,
                                         caPath: option("--ca") ?? "certs/ca.pem", token: token)
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
await manager.invalidate()
delegate.log("exit")
