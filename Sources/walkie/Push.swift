import ArgumentParser
import DevicePush
import PTTClient
import SimulatedPush

/// Where walkie's wake-up pushes come from (`--push`).
enum PushSource: String, Codable, CaseIterable, ExpressibleByArgument {
    /// squelchd's own device push service, at the server's address: works wherever walkie runs.
    case device
    /// The APNs simulator's control port: this machine only, for testing the Apple path.
    case simulator
    case off
}

/// `--push` and `--push-port` read together, as walkie uses them.
enum PushChoice: Equatable {
    case off
    case simulator(controlPort: Int)
    /// `port` nil: the voice port's number, where squelchd serves it by default.
    case device(port: Int?)

    static let simulatorControlPort = 2198

    /// `--push-port` alone names the APNs simulator's control port, as it did before walkie took
    /// pushes from squelchd itself; 0 turns pushes off whatever `--push` says.
    init(source: PushSource?, port: Int?) {
        switch (source, port) {
        case (_, 0?), (.off?, _): self = .off
        case (.simulator?, let port): self = .simulator(controlPort: port ?? Self.simulatorControlPort)
        case (.device?, let port): self = .device(port: port)
        case (nil, let port?): self = .simulator(controlPort: port)
        case (nil, nil): self = .device(port: nil)
        }
    }

    /// The transport for a server at `host`; nil when pushes are off.
    func transport(host: String) -> (any PushTransport)? {
        switch self {
        case .off: nil
        case .simulator(let port): SimulatedPushTransport(host: host, controlPort: port)
        case .device(let port): DevicePushTransport(port: port)
        }
    }

    var isOn: Bool { self != .off }

    /// As `walkie.json` keeps it.
    var saved: (source: PushSource, port: Int?) {
        switch self {
        case .off: (.off, nil)
        case .simulator(let port): (.simulator, port)
        case .device(let port): (.device, port)
        }
    }
}
