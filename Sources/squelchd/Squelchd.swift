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

struct Token: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Participant tokens.", subcommands: [Issue.self])

    struct Issue: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Print a participant token (an ES256 JWT signed with the server's token key).",
            discussion: "The token key is <data-dir>/token-key.pem, made on first use. Give the token to the member's app; it joins with it.")

        @Option(help: "Channel UUID the token admits to.") var channel: String
        @Option(help: "User id (the token's subject).") var user: String
        @Option(help: "Display name.") var name: String
        @Option(help: "Capabilities, comma-separated: talk, listen.") var capability = "talk,listen"
        @Option(help: "Floor priority 0-255; a higher one pre-empts a lower one.") var priority = 0
        @Option(help: "Role attribute (free text, e.g. dispatcher).") var role: String?
        @Option(help: "Lifetime: 90s, 30m, 12h, 7d.") var ttl = "12h"
        @Option(help: "Data directory holding the token key.") var dataDir = ServerConfiguration().dataDirectory

        func run() async throws {
            guard let channelID = UUID(uuidString: channel) else {
                throw ValidationError("--channel '\(channel)' is not a UUID; 'squelchd channel list' shows channel ids")
            }
            guard (0...255).contains(priority) else { throw ValidationError("--priority must be 0-255, not \(priority)") }
            guard let lifetime = parseLifetime(ttl) else { throw ValidationError("--ttl '\(ttl)' is not a lifetime; use e.g. 90s, 30m, 12h or 7d") }
            var capabilities = Set<Capability>()
            for name in capability.split(separator: ",").map({ $0.trimmingCharacters(in: .whitespaces) }) {
                guard let parsed = Capability(rawValue: name) else {
                    throw ValidationError("unknown capability '\(name)'; use talk, listen or both (talk,listen)")
                }
                capabilities.insert(parsed)
            }
            let authority: TokenAuthority
            do { authority = try await TokenAuthority.loadOrCreate(in: dataDir) } catch {
                FileHandle.standardError.write(Data("squelchd: \(error)\n".utf8))
                throw ExitCode(78)
            }
            let now = Date()
            let token = try await authority.issue(ParticipantClaims(
                userID: user, name: name, channel: channelID, capabilities: capabilities, role: role,
                priority: UInt8(priority), issuedAt: now, expiresAt: now.addingTimeInterval(lifetime)))
            print(token)
        }
    }
}
