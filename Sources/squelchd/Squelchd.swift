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
        subcommands: [Serve.self, Token.self, Channel.self, Node.self, Audit.self, APNsSim.self])

    /// A `ValidationError` thrown by a command's `run` (after parsing: a value no parser can check,
    /// like a lifetime or a UUID) would be printed with the root's usage, 'squelchd <subcommand>';
    /// it is printed with the command's own, as a parsing error would be.
    static func main() async {
        let command: any ParsableCommand
        do { command = try parseAsRoot() } catch { exit(withError: error) }
        do {
            if var command = command as? any AsyncParsableCommand {
                try await command.run()
            } else {
                var command = command
                try command.run()
            }
        } catch let error as ValidationError {
            let type = Swift.type(of: command)
            let text = "Error: \(error.message)\nUsage: \(usageString(for: type))\n  See 'squelchd \(commandPath(of: type)) --help' for more information.\n"
            FileHandle.standardError.write(Data(text.utf8))
            Foundation.exit(ExitCode.validationFailure.rawValue)
        } catch {
            exit(withError: error)
        }
    }

    /// "token issue" for `Token.Issue`: the names from the root down.
    static func commandPath(of type: any ParsableCommand.Type) -> String {
        func path(_ node: any ParsableCommand.Type, _ names: [String]) -> [String]? {
            if ObjectIdentifier(node) == ObjectIdentifier(type) { return names }
            for child in node.configuration.subcommands {
                if let found = path(child, names + [child._commandName]) { return found }
            }
            return nil
        }
        return path(Squelchd.self, [])?.joined(separator: " ") ?? ""
    }
}
