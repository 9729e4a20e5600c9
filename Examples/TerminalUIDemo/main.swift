import Glibc
import TerminalUI

// terminal-ui-demo            the interactive screen with a pretend channel: hold Space (or tap it) to "talk".
// terminal-ui-demo fixture [kitty] [crash]
//                             for TerminalUITests: open a session, write READY, wait; the test sends signals.
//
// The demo loop is the reference for walkie's own: wait for input until the next deadline, hand the bytes to
// KeyboardController, act on its actions, render, write only what changed.

let arguments = Array(CommandLine.arguments.dropFirst())
do {
    if arguments.first == "fixture" {
        try runFixture(Set(arguments.dropFirst()))
    } else {
        try runDemo()
    }
} catch {
    print(error)
    exit(2)
}

func runFixture(_ options: Set<String>) throws {
    let session = try TerminalSession()
    try session.start()
    if options.contains("kitty") { session.enableKittyKeyboard() }
    session.write("READY")
    if options.contains("crash") { fatalError("crash requested by the test") }
    while true {
        let input = session.waitForInput(timeout: nil)
        if input.resumed { session.write("RESUMED") }
        if input.endOfInput || input.bytes.contains(UInt8(ascii: "q")) { break }
    }
    session.restore()
    session.write("DONE")
}

func runDemo() throws {
    let session = try TerminalSession()
    try session.start()
    defer { session.restore() }

    var keyboard = KeyboardController()
    var model = ScreenModel(
        channelName: "#demo", serviceStatus: .ready,
        roster: [.init(name: "you", role: "demo", isSelf: true), .init(name: "Alice", role: "dispatcher"),
                 .init(name: "Bob", role: "driver", connection: .offline)],
        network: .init(roundTripMilliseconds: 12, lossPercent: 0, jitterBufferMilliseconds: 60),
        maximumTransmit: keyboard.holdToTalk.configuration.maximumTransmitDuration)
    model.status = .init("Probing the keyboard…")
    var previous: Frame?
    var background = false

    while true {
        let now = monotonicNanoseconds()
        // While transmitting, repaint a few times a second for the elapsed time and the meter.
        let repaint = keyboard.holdToTalk.transmitting ? now + 200_000_000 : nil
        let deadline = [keyboard.nextDeadline, repaint].compactMap { $0 }.min()
        let input = session.waitForInput(timeout: deadline.map { $0 > now ? $0 - now : 0 })

        let time = monotonicNanoseconds()
        for action in keyboard.receive(input.bytes, now: time) + keyboard.tick(now: time) {
            switch action {
            case .startTransmit:
                model.status = .init("Transmitting")
            case .stopTransmit(let reason):
                model.status = .init("Stopped: \(reason)")
            case .enableKittyKeyboard:
                session.enableKittyKeyboard()
            case .command(.quit):
                return
            case .command(.suspend):
                session.suspend()
            case .command(.toggleMute):
                model.muted.toggle()
            case .command(.background):
                background.toggle()
            case .command(.redraw):
                previous = nil
            case .command:
                break
            }
        }
        if keyboard.probe.support != .unknown, model.status?.text == "Probing the keyboard…" {
            model.status = .init(keyboard.probe.support == .kitty ? "kitty keyboard protocol: exact key release"
                                                                  : "No key-release events: tap latches, hold is momentary")
        }
        if input.endOfInput { return }
        if input.resized || input.resumed { previous = nil }

        let ptt = keyboard.holdToTalk
        model.keyboard = ptt.mode
        model.localState = background ? .background : ptt.latched ? .latched : ptt.transmitting ? .transmitting : .idle
        model.activeSpeaker = ptt.transmitting ? "you" : nil
        model.roster[0].talking = ptt.transmitting
        model.transmitElapsed = ptt.transmitStartedAt.map { time - $0 }
        let wobble = Double(time / 1_000_000 % 1000) / 1000
        model.inputLevel = ptt.transmitting && !model.muted ? .init(rms: 0.05 + 0.1 * wobble, peak: 0.3 + 0.3 * wobble) : .init(rms: 0, peak: 0)

        let size = session.size()
        let frame = Screen.render(model, width: size.columns, height: size.rows)
        if frame != previous {
            session.write(Screen.ansi(frame, previous: previous))
            previous = frame
        }
    }
}
