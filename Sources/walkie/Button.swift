import ArgumentParser
import Foundation
import InputDevices
import NIOConcurrencyHelpers
import PTTClient
import TerminalUI

/// `--ptt-device`: a hardware push-to-talk button (evdev) beside the keyboard's key. It reaches the
/// manager as Apple's hands-free accessory (`accessoryButton`, source `handsfreeButton`), which works
/// with walkie in the background too; the screen says when the device goes and comes back.
extension Interactive {
    /// The button's key, or nil for any key of the device; checked before anything joins.
    static func buttonKey(_ options: InteractiveOptions) throws(WalkieFailure) -> KeyCode? {
        guard options.pttKey.lowercased() != "any" else { return nil }
        guard let key = KeyCode(name: options.pttKey) else {
            throw .usage("--ptt-key \(options.pttKey) is not a key name or code; try KEY_F13, BTN_0, playpause, a number, or any")
        }
        return key
    }

    static func checkButton(_ options: InteractiveOptions) throws(WalkieFailure) {
        _ = try buttonKey(options)
        guard let path = options.pttDevice else { return }
        do throws(InputDeviceError) { try PushToTalkButton.check(path) } catch { throw .usage(error.description) }
    }

    /// Starts reading the button, if there is one; its presses go to the channel open at the time.
    static func startButton(_ options: InteractiveOptions, manager: ChannelManager, shared: NIOLockedValueBox<Shared>) -> PushToTalkButton? {
        guard let path = options.pttDevice else { return nil }
        let key = try? buttonKey(options)  // checked by `preflight`
        let which = key.map { "\($0)" } ?? "any key"
        let button = PushToTalkButton(path: path, key: key, onPress: { pressed in
            guard let channel = manager.activeChannelUUID else { return }
            shared.withLockedValue { state in
                state.buttonDown = pressed
                state.buttonCutOff = false
                state.requesting = pressed
                if pressed, !manager.isJoined {
                    state.status = .init("Not connected: talking as soon as the channel is back (up to \(ChannelManager.heldPressWaitSeconds) s)")
                }
            }
            manager.accessoryButton(pressed: pressed, channelUUID: channel)
        }, onStatus: { status in
            shared.withLockedValue { state in
                switch status {
                case .open(let name): state.status = .init("PTT button ready (\(which)): \(name)")
                case .lost(let reason): state.status = .init("PTT button \(reason): trying it again every second", isError: true)
                }
            }
        })
        button.start()
        return button
    }
}

extension Interactive.Loop {
    /// `--max-transmit` for the button: the keyboard's own limit covers only what the key started.
    /// Checked each turn of the loop; `grantedAt` is when the current transmission began.
    func enforceButtonLimit(time: UInt64, grantedAt: UInt64?, channel: UUID) {
        let limit = keyboard.holdToTalk.configuration.maximumTransmitDuration
        guard let grantedAt, time - grantedAt >= limit, manager.isTransmitting else { return }
        let cut = shared.withLockedValue { state -> Bool in
            guard state.buttonDown, !state.buttonCutOff else { return false }
            state.buttonCutOff = true
            state.requesting = false
            state.status = .init("Released after the \(limit / 1_000_000_000) s limit: let go of the button and press it again to go on")
            return true
        }
        if cut { manager.stopTransmitting(channelUUID: channel, source: .handsfreeButton) }
    }
}
