import ArgumentParser
import Foundation
import Logging
import ParticipantTokens
import PTTServer
import SquelchInfo

@main
struct Squelchd: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "squelchd",
        abstract: "The Squelch push-to-talk server.",
        discussion: "Start it with 'squelchd serve'. Everything binds to 127.0.0.1 unless you say otherwise.",
        version: SquelchInfo.version,
        subcommands: [Serve.self, Token.self, Channel.self, APNsSim.self])
}
