import ArgumentParser
import Audio
import ChannelProtocol
import Foundation
import JitterBuffer
import ParticipantTokens
import NIOConcurrencyHelpers
import PTTClient
import SquelchInfo

/// A one-shot client (talk, listen) keeps its manager in a directory of its own, so that it never
/// disturbs the interactive walkie's saved channel. When done it closes its connection rather than
/// leave: a `leave` would end the user's membership on the server, and with it the push token of the
/// user's own walkie or phone, which the one-shot's join only pushed aside (`replaced`).
func temporaryState() -> String {
    FileManager.default.temporaryDirectory.appendingPathComponent("walkie-\(ProcessInfo.processInfo.processIdentifier)-\(UUID().uuidString.prefix(8))").path
}

/// What the one-shot commands share.
struct OneShotOptions: ParsableArguments {
    @Flag(help: ArgumentHelp("Leave the channel when done: the user stops being a member.",
                             discussion: "For a user of its own, like an announcer run from cron. Without it the user stays a member, offline, as after any session; never use it with the user of someone's walkie or phone, which would lose the channel and its push token."))
    var leave = false
}
