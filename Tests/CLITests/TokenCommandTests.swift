import Foundation
import ParticipantTokens
import Testing

@Suite struct TokenCommandTests {
    @Test func squelchdIssuesATokenTheServerKeyVerifies() async throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("token-cli-\(UUID())").path
        let channel = UUID()
        let result = try Executables.run("squelchd", ["token", "issue", "--channel", channel.uuidString, "--user", "u1", "--name", "Ann",
                                                      "--capability", "listen", "--priority", "7", "--ttl", "1h", "--data-dir", dir])
        #expect(result.status == 0, "\(result.err)")
        let token = result.out.trimmingCharacters(in: .whitespacesAndNewlines)
        let claims = try await TokenAuthority.loadOrCreate(in: dir).verify(token, channel: channel)
        #expect(claims.userID == "u1" && claims.name == "Ann" && claims.capabilities == [.listen] && claims.priority == 7)
        #expect(claims.expiresAt.timeIntervalSinceNow > 3_500 && claims.expiresAt.timeIntervalSinceNow <= 3_600)
    }

    @Test(arguments: [
        (["--channel", "not-a-uuid"], "not a UUID"),
        (["--ttl", "12y"], "not a lifetime"),
        (["--capability", "shout"], "unknown capability"),
        (["--priority", "300"], "0-255"),
    ] as [([String], String)])
    func badOptionsSayWhatIsWrong(options: [String], message: String) throws {
        var arguments = ["token", "issue", "--channel", UUID().uuidString, "--user", "u", "--name", "n",
                         "--data-dir", FileManager.default.temporaryDirectory.appendingPathComponent("token-bad-\(UUID())").path]
        arguments += options  // a repeated option: the last one wins
        let result = try Executables.run("squelchd", arguments)
        #expect(result.status != 0)
        #expect(result.err.contains(message), "\(result.err)")
    }
}
