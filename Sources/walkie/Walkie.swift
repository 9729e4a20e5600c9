import ArgumentParser
import Audio
import Foundation
import InputDevices
import SquelchInfo
import TerminalUI

@main
struct Walkie: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "walkie",
        abstract: "A push-to-talk walkie-talkie for the terminal.",
        discussion: """
        Run with no command to rejoin the last channel (after a restart or a crash).

        Exit codes:
          0  done
          1  something else failed (the message says what)
          2  bad usage, or no channel to restore
          3  squelchd did not answer (check --server and that it runs)
          4  the token was refused (expired, forged, revoked, or for another channel), or the member removed
          5  the server's certificate is not signed by --ca
          6  the floor was busy or not allowed
          7  an audio device or file could not be used
          129, 130, 143  'talk' stopped by SIGHUP, Ctrl-C or SIGTERM, having let go of the floor
        """,
        version: SquelchInfo.version,
        subcommands: [Resume.self, Join.self, Talk.self, Listen.self, Status.self, Leave.self, Devices.self],
        defaultSubcommand: Resume.self)

    /// ArgumentParser's own usage errors (a missing option, an unknown command, a value that doesn't
    /// parse) would exit 64, EX_USAGE; walkie promises 2 for bad usage, as its own checks exit.
    static func main() async {
        do {
            var command = try parseAsRoot()
            if var command = command as? any AsyncParsableCommand {
                try await command.run()
            } else {
                try command.run()
            }
        } catch {
            // A mistyped command ('walkie tlak') reaches the default command as an argument it doesn't
            // take: say which command was likely meant, rather than the default command's usage.
            let arguments = CommandLine.arguments.dropFirst()
            if exitCode(for: error) == .validationFailure, let word = arguments.first, !word.hasPrefix("-") {
                let commands = configuration.subcommands.map { $0._commandName }
                if !commands.contains(word), let meant = SquelchInfo.nearest(to: word, among: commands, within: 2) {
                    FileHandle.standardError.write(Data("walkie: '\(word)' is not a command; did you mean '\(meant)'? ('walkie --help' lists them)\n".utf8))
                    Foundation.exit(2)
                }
            }
            if exitCode(for: error) == .validationFailure {
                FileHandle.standardError.write(Data((fullMessage(for: error) + "\n").utf8))
                Foundation.exit(2)
            }
            exit(withError: error)
        }
    }
}

/// Why walkie stops, with the exit code from `walkie --help` and one line that says what to do.
struct WalkieFailure: Error, CustomStringConvertible {
    var code: Int32
    var message: String
    var description: String { message }

    static func unreachable(_ detail: String) -> WalkieFailure { WalkieFailure(code: 3, message: detail) }
    static func token(_ detail: String) -> WalkieFailure { WalkieFailure(code: 4, message: detail) }
    static func certificate(_ detail: String) -> WalkieFailure { WalkieFailure(code: 5, message: detail) }
    static func floor(_ detail: String) -> WalkieFailure { WalkieFailure(code: 6, message: detail) }
    static func audio(_ detail: String) -> WalkieFailure { WalkieFailure(code: 7, message: detail) }
    static func usage(_ detail: String) -> WalkieFailure { WalkieFailure(code: 2, message: detail) }
    static func other(_ detail: String) -> WalkieFailure { WalkieFailure(code: 1, message: detail) }
}

/// The most the options that take seconds accept. Swift's durations trap beyond about 292 years, so
/// "--duration 1e20" would crash walkie; nobody means more than these, and a typo gets a clear error.
enum CommandLimits {
    /// `talk --wait`: a day in the floor queue.
    static let longestWait = 86_400.0
    /// `listen --duration`: 12 hours, as a 48 kHz WAV file holds at most 4 GiB (12.4 hours).
    static let longestRecording = 43_200.0
    /// `--max-transmit`: an hour; a channel's burst limit is usually far below it.
    static let longestTransmission = 3_600.0
}

/// Prints the failure as one line on stderr and exits with its code. Messages quote the server's and
/// the network's words: control characters are replaced, as in `say`.
func fail(_ failure: WalkieFailure) -> Never {
    FileHandle.standardError.write(Data("walkie: \(DisplayWidth.sanitize(failure.message))\n".utf8))
    exit(failure.code)
}

/// Where the server is and how to get in.
struct ServerOptions: ParsableArguments {
    @Option(help: "squelchd's voice address, HOST:PORT.")
    var server: String = "127.0.0.1:7700"
    @Option(help: "A participant token from 'squelchd token issue'; '-' reads it from standard input (on the command line, any local user can read it).")
    var token: String?
    @Option(help: ArgumentHelp("Read the participant token from this file instead, and renew the session whenever the file holds a new one.",
                               discussion: "A session ends when its token expires; put a fresh token in the file (by hand or from a cron job) and walkie carries on without a break. It also keeps the token out of the process list."))
    var tokenFile: String?
    @Option(help: "The CA that signed the server's certificate.")
    var ca: String = "certs/ca.pem"
    @Option(help: ArgumentHelp("Where wake-up pushes come from: device, simulator or off (default: device; simulator when only --push-port is given).",
                               discussion: "device: squelchd's own device push service, at the --server address over TLS: walkie can be woken wherever it runs. simulator: the APNs simulator's control port on the server's host, for testing the Apple path. Used by 'walkie join' and 'walkie' (resume), which can wait in the background for a push; 'talk' and 'listen' stay connected while they run and register no push token, so they take it and ignore it."))
    var push: PushSource?
    @Option(help: "The push port: for device, squelchd's --device-push-port (default: the voice port); for simulator, its control port (default 2198). 0: no pushes.")
    var pushPort: Int?

    var pushChoice: PushChoice { PushChoice(source: push, port: pushPort) }
}

struct StateOptions: ParsableArguments {
    @Option(help: "Where walkie keeps its channel for restoring (default: $XDG_STATE_HOME/squelch/walkie).")
    var stateDir: String?
}

struct AudioOptions: ParsableArguments {
    @Option(help: "ALSA capture device (see 'walkie devices').")
    var input: String = "default"
    @Option(help: "ALSA playback device.")
    var output: String = "default"
    @Option(help: "Talk from this WAV file instead of a microphone (each transmission starts it again).")
    var inputFile: String?
    @Option(help: "Play into this WAV file instead of a speaker.")
    var outputFile: String?
    @Option(help: ArgumentHelp("The floor's tones on the speaker: all, off, or a list of permit, busy, queued, end.",
                               discussion: "permit: the floor is yours, speak after it; busy: refused; queued: waiting in the floor queue; end: a call you heard ended."))
    var tones: String = "all"
}

struct Devices: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "List ALSA capture and playback devices for --input and --output, and input devices with keys for --ptt-device.")

    func run() throws {
        let devices = ALSA.devices()
        let buttons = InputDeviceList.devicesWithKeys()
        if devices.isEmpty {
            print("No ALSA devices found. Install alsa-utils and check 'aplay -L', or use --input-file/--output-file with WAV files.")
        } else {
            print("Audio (--input, --output):")
            let width = min(40, devices.map(\.name.count).max() ?? 0)
            for d in devices {
                let io = d.canCapture && d.canPlay ? "in/out" : d.canCapture ? "in" : "out"
                print("  " + d.name.padding(toLength: max(width, d.name.count), withPad: " ", startingAt: 0) + "  "
                      + io.padding(toLength: 6, withPad: " ", startingAt: 0) + "  " + d.description)
            }
        }
        print("")
        if buttons.isEmpty {
            print("No input devices with keys (for --ptt-device): plug in the PTT switch, pedal or headset; /sys/class/input lists what the kernel sees.")
        } else {
            print("Push-to-talk buttons (--ptt-device; --ptt-key picks one key, default any):")
            let width = buttons.map(\.path.count).max() ?? 0
            for b in buttons {
                let keys = b.keyCount == 1 ? "1 key" : "\(b.keyCount) keys"
                let access = b.readable ? "" : "  (not readable: join the group that owns it, usually input)"
                print("  " + b.path.padding(toLength: width, withPad: " ", startingAt: 0) + "  " + b.name + ", " + keys + access)
            }
        }
        if devices.isEmpty && buttons.isEmpty { throw ExitCode(1) }
    }
}
