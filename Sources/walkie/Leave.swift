import ArgumentParser
import Audio
import ChannelProtocol
import Foundation
import JitterBuffer
import ParticipantTokens
import NIOConcurrencyHelpers
import PTTClient
import SquelchInfo
import TerminalUI

struct Leave: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Leave the saved channel: the server forgets you and your push token.")

    @OptionGroup var state: StateOptions

    func run() async throws {
        let delegate = WalkieDelegate()
        let manager: ChannelManager
        do { manager = try await makeManager(delegate: delegate, stateDirectory: state.stateDir, push: nil, audio: .none, purpose: .leave) } catch { fail(error) }
        if let problem = manager.restorationError { fail(.other(problem.description)) }
        // Collected from the start: a leave owed from an earlier run may settle while this one joins.
        let outcomes = NIOLockedValueBox<[UUID: OwedLeaveOutcome]>([:])
        let collecting = Task {
            for await event in manager.events {
                if case .leaveSettled(let channel, let outcome) = event { outcomes.withLockedValue { $0[channel] = outcome } }
            }
        }
        defer { collecting.cancel() }
        let earlier = manager.owedLeaves
        guard let channel = manager.activeChannelUUID else {
            guard !earlier.isEmpty else {
                say("no saved channel; nothing to leave")
                throw ExitCode(2)
            }
            // Channels left before while the server couldn't hear it: try telling it now.
            let code = await settle(manager, outcomes, earlier, within: .seconds(10))
            await manager.invalidate()
            if code != 0 { throw ExitCode(code) }
            return
        }
        // Rejoin (so the server hears the leave on the channel's own connection), then leave. Without
        // an answer the manager keeps the leave and delivers it on a connection of its own.
        let joined = await withTaskGroup(of: Bool.self) { group -> Bool in
            group.addTask { for await event in delegate.stream { if case .joined = event { return true } }; return false }
            group.addTask { try? await Task.sleep(for: .seconds(5)); return false }
            let first = await group.next() ?? false
            group.cancelAll()
            return first
        }
        manager.userLeftChannel(channelUUID: channel)
        var code: Int32 = 0
        if joined {
            // The manager waits for the server's acknowledgement of the leave before it closes.
            await manager.invalidate()
            say("left the channel")
        } else {
            try? await Task.sleep(for: .milliseconds(300))
            // The server didn't answer the join for 5 s: a shorter wait for the leave's own try.
            code = await settle(manager, outcomes, manager.owedLeaves.union(earlier), within: .seconds(5))
            await manager.invalidate()
        }
        if code != 0 { throw ExitCode(code) }
    }

    /// Waits up to `limit` for the leaves in `channels` to settle and says how each did; the exit code.
    func settle(_ manager: ChannelManager, _ outcomes: NIOLockedValueBox<[UUID: OwedLeaveOutcome]>, _ channels: Set<UUID>,
                within limit: Duration) async -> Int32 {
        let deadline = ContinuousClock.now + limit
        while ContinuousClock.now < deadline, !manager.owedLeaves.isDisjoint(with: channels) {
            try? await Task.sleep(for: .milliseconds(100))
        }
        var code: Int32 = 0
        for channel in channels.sorted(by: { $0.uuidString < $1.uuidString }) {
            switch outcomes.withLockedValue({ $0[channel] }) {
            case .delivered?:
                say("left channel \(channel): the server heard it")
            case .nothingToLeave(let why)?:
                say("left channel \(channel): the server no longer had you there (\(why))")
            case .superseded?:
                break
            case .undeliverable(let why)?:
                say("left channel \(channel) here, but the server refused the token (\(why)); it lists you there, and may wake this device, until an administrator removes you (DELETE /v1/channels/\(channel)/members/<user>)")
                code = 4
            case nil:
                say("left channel \(channel) here, but the server did not answer; the leave is kept, and walkie tells the server the next time it runs (or run 'walkie leave' again)")
                code = 3
            }
        }
        return code
    }
}

/// One line on stdout, written at once: scripts and tests read walkie's progress through a pipe, where
/// `print` would hold it in a buffer until exit.
/// Lines carry text from the network (names, reasons, close reasons anyone on the path can forge):
/// control characters are replaced, so an escape sequence in them cannot reach the terminal.
func say(_ line: String) {
    // `try?`: a reader that went away (`walkie listen … | head -1`) must not crash walkie before it
    // completes its file; `write(_:)` traps on EPIPE, `write(contentsOf:)` throws.
    try? FileHandle.standardOutput.write(contentsOf: Data((DisplayWidth.sanitize(line) + "\n").utf8))
}
