import ArgumentParser
import Audio
import SquelchInfo

@main
struct Walkie: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "walkie",
        abstract: "A push-to-talk walkie-talkie for the terminal.",
        discussion: "Joining a channel arrives with the client library; today walkie lists audio devices.",
        version: SquelchInfo.version,
        subcommands: [Devices.self])
}

struct Devices: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "List ALSA capture and playback devices for --input and --output.")

    func run() throws {
        let devices = ALSA.devices()
        guard !devices.isEmpty else {
            print("No ALSA devices found. Install alsa-utils and check 'aplay -L', or use --input-file/--output-file with WAV files.")
            throw ExitCode(1)
        }
        let width = min(40, devices.map(\.name.count).max() ?? 0)
        for d in devices {
            let io = d.canCapture && d.canPlay ? "in/out" : d.canCapture ? "in" : "out"
            print(d.name.padding(toLength: max(width, d.name.count), withPad: " ", startingAt: 0) + "  "
                  + io.padding(toLength: 6, withPad: " ", startingAt: 0) + "  " + d.description)
        }
    }
}
