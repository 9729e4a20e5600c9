import Foundation
import ParticipantTokens
import Testing

@Suite struct TokenCommandTests {
    /// `squelchd channel create` in `dir`; returns the id it prints.
    func createChannel(in dir: String) throws -> UUID {
        let created = try Executables.run("squelchd", ["channel", "create", "--name", "Ops", "--data-dir", dir])
        #expect(created.status == 0, "\(created.err)")
        return try #require(UUID(uuidString: created.out.trimmingCharacters(in: .whitespacesAndNewlines)))
    }

    /// A token for a channel the database doesn't hold would be refused at every join: it is not
    /// printed, and the message says where to find the ids. A host with only the key (no database)
    /// still issues, as it cannot check.
    @Test func aTokenForAChannelTheServerDoesNotHaveIsRefused() async throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("token-unknown-\(UUID())").path
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let known = try createChannel(in: dir)
        let unknown = UUID()
        let refused = try Executables.run("squelchd", ["token", "issue", "--channel", unknown.uuidString, "--user", "u1", "--name", "Ann",
                                                       "--data-dir", dir])
        #expect(refused.status == 1 && refused.out.isEmpty, "\(refused.status) \(refused.err)")
        #expect(refused.err.contains("no channel \(unknown)") && refused.err.contains("squelchd channel list"), "\(refused.err)")
        #expect(!FileManager.default.fileExists(atPath: dir + "/token-key.pem"), "a refused issue made no key")
        let issued = try Executables.run("squelchd", ["token", "issue", "--channel", known.uuidString, "--user", "u1", "--name", "Ann",
                                                      "--data-dir", dir])
        #expect(issued.status == 0, "\(issued.err)")
        let keyOnly = dir + "/key-host"
        let key = try await TokenAuthority.loadOrCreate(at: keyOnly + "/token.pem")
        let elsewhere = try Executables.run("squelchd", ["token", "issue", "--channel", unknown.uuidString, "--user", "u1", "--name", "Ann",
                                                         "--data-dir", keyOnly, "--token-key", keyOnly + "/token.pem"])
        #expect(elsewhere.status == 0, "\(elsewhere.err)")
        _ = try await key.verify(elsewhere.out.trimmingCharacters(in: .whitespacesAndNewlines), channel: unknown)
    }

    /// During a key rotation the server accepts the old key's tokens, so inspect and revoke read them
    /// too, while issue keeps signing with the current key.
    @Test func inspectAndRevokeReadTheOldKeysTokensDuringARotation() async throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("token-rotation-\(UUID())").path
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let channel = try createChannel(in: dir)
        let issue = ["token", "issue", "--channel", channel.uuidString, "--user", "u1", "--name", "Ann", "--data-dir", dir]
        let old = try Executables.run("squelchd", issue).out.trimmingCharacters(in: .whitespacesAndNewlines)
        let newKey = dir + "/new-token-key.pem"
        _ = try await TokenAuthority.loadOrCreate(at: newKey)
        let rotating = ["SQUELCH_TOKEN_KEY": newKey, "SQUELCH_PREVIOUS_TOKEN_KEY": dir + "/token-key.pem"]
        let withoutPrevious = try Executables.run("squelchd", ["token", "inspect", old, "--data-dir", dir], environment: ["SQUELCH_TOKEN_KEY": newKey])
        #expect(withoutPrevious.status != 0 && withoutPrevious.err.contains("--previous-token-key"), "the new key alone does not know it: \(withoutPrevious.err)")
        // The flag does what the environment does.
        let flagged = try Executables.run("squelchd", ["token", "inspect", old, "--data-dir", dir, "--token-key", newKey,
                                                       "--previous-token-key", dir + "/token-key.pem"])
        #expect(flagged.status == 0 && flagged.out.contains("valid"), "\(flagged.err)")
        let inspected = try Executables.run("squelchd", ["token", "inspect", old, "--data-dir", dir], environment: rotating)
        #expect(inspected.status == 0 && inspected.out.contains("valid"), "\(inspected.err)")
        let revoked = try Executables.run("squelchd", ["token", "revoke", "--token", old, "--data-dir", dir], environment: rotating)
        #expect(revoked.status == 0, "\(revoked.err)")
        let fresh = try Executables.run("squelchd", issue, environment: rotating).out.trimmingCharacters(in: .whitespacesAndNewlines)
        _ = try await TokenAuthority.load(from: newKey).verify(fresh, channel: channel)
    }

    /// The commands' changes go into the same audit trail as the admin API's, with the user and
    /// host that ran them; `squelchd audit` reads it back, newest first, of a channel or of all.
    @Test func commandChangesAreInTheAuditTrail() throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("token-audit-\(UUID())").path
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let channel = try createChannel(in: dir)
        let issued = try Executables.run("squelchd", ["token", "issue", "--channel", channel.uuidString, "--user", "u1", "--name", "Ann",
                                                      "--role", "dispatcher", "--data-dir", dir])
        #expect(issued.status == 0, "\(issued.err)")
        let tokenID = UUID().uuidString
        let revoked = try Executables.run("squelchd", ["token", "revoke", "--channel", channel.uuidString, "--id", tokenID,
                                                       "--reason", "lost phone", "--data-dir", dir])
        #expect(revoked.status == 0, "\(revoked.err)")
        let again = try Executables.run("squelchd", ["token", "revoke", "--channel", channel.uuidString, "--id", tokenID,
                                                     "--reason", "stolen", "--data-dir", dir])
        #expect(again.status == 0 && again.out.contains("already revoked"), "\(again.out) \(again.err)")
        let other = try createChannel(in: dir)
        let deleted = try Executables.run("squelchd", ["channel", "delete", other.uuidString, "--yes", "--data-dir", dir])
        #expect(deleted.status == 0, "\(deleted.err)")

        let listed = try Executables.run("squelchd", ["audit", "--channel", channel.uuidString, "--json", "--data-dir", dir])
        #expect(listed.status == 0, "\(listed.err)")
        let records = try #require(try JSONSerialization.jsonObject(with: Data(listed.out.utf8)) as? [[String: Any]])
        #expect(records.map { $0["action"] as? String } == ["token revocation repeated", "token revoked", "token issued", "channel created"])
        let repeated = try #require(records.first?["details"] as? [String: String])
        #expect(repeated["reason"] == "lost phone" && repeated["requested_reason"] == "stolen", "\(repeated)")
        #expect(records.allSatisfy { $0["source"] as? String == "cli" && ($0["actor"] as? String)?.contains("@") == true })
        let issue = try #require(records.dropFirst(2).first?["details"] as? [String: String])
        #expect(issue["role"] == "dispatcher" && issue["token_id"] != nil)
        #expect(!listed.out.contains(issued.out.trimmingCharacters(in: .whitespacesAndNewlines)), "the token itself stays out of the trail")
        #expect((records.dropFirst().first?["details"] as? [String: String])?["reason"] == "lost phone")
        // All channels, as a table: the deleted channel's record is still there, on top.
        let table = try Executables.run("squelchd", ["audit", "--limit", "2", "--data-dir", dir])
        let lines = table.out.split(separator: "\n")
        #expect(table.status == 0 && lines.count == 3 && lines[0].hasPrefix("TIME"), "\(table.out)")
        #expect(lines[1].contains("channel deleted") && lines[1].contains(other.uuidString) && lines[1].contains("name=Ops"), "\(table.out)")
        let bad = try Executables.run("squelchd", ["audit", "--limit", "0", "--data-dir", dir])
        #expect(bad.status != 0 && bad.err.contains("--limit must be 1-"), "\(bad.err)")
    }

    @Test func squelchdIssuesATokenTheServerKeyVerifies() async throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("token-cli-\(UUID())").path
        let channel = try createChannel(in: dir)
        let result = try Executables.run("squelchd", ["token", "issue", "--channel", channel.uuidString, "--user", "u1", "--name", "Ann",
                                                      "--capability", "listen", "--priority", "7", "--ttl", "1h", "--data-dir", dir])
        #expect(result.status == 0, "\(result.err)")
        let token = result.out.trimmingCharacters(in: .whitespacesAndNewlines)
        let claims = try await TokenAuthority.loadOrCreate(in: dir).verify(token, channel: channel)
        #expect(claims.userID == "u1" && claims.name == "Ann" && claims.capabilities == [.listen] && claims.priority == 7)
        #expect(claims.expiresAt.timeIntervalSinceNow > 3_500 && claims.expiresAt.timeIntervalSinceNow <= 3_600)
    }

    @Test func issuingOutsideTheServersDataDirectoryIsRefusedNotSignedWithANewKey() async throws {
        let empty = FileManager.default.temporaryDirectory.appendingPathComponent("token-nowhere-\(UUID())").path
        let result = try Executables.run("squelchd", ["token", "issue", "--channel", UUID().uuidString, "--user", "u", "--name", "n",
                                                      "--data-dir", empty], environment: ["SQUELCH_DATA_DIR": "", "SQUELCH_CONFIG": ""])
        #expect(result.status == 78)
        #expect(result.err.contains("no server database") && result.err.contains("--data-dir"), "\(result.err)")
        #expect(result.out.isEmpty)
        #expect(!FileManager.default.fileExists(atPath: empty + "/token-key.pem"))
        // A stray key file there, without the database, is not used either.
        _ = try await TokenAuthority.loadOrCreate(in: empty)
        let stray = try Executables.run("squelchd", ["token", "issue", "--channel", UUID().uuidString, "--user", "u", "--name", "n",
                                                     "--data-dir", empty], environment: ["SQUELCH_DATA_DIR": "", "SQUELCH_CONFIG": ""])
        #expect(stray.status == 78 && stray.out.isEmpty, "\(stray.err)")
    }

    /// The server runs with a key kept outside its data directory, and someone issues a token without
    /// saying so: refused, rather than signed with a key the server would call forged.
    @Test func tokenIssueRefusesAKeyTheServerDoesNotSignWith() async throws {
        let base = FileManager.default.temporaryDirectory.appendingPathComponent("token-record-\(UUID())").path
        defer { try? FileManager.default.removeItem(atPath: base) }
        let data = base + "/data", certs = base + "/certs", key = base + "/keys/token.pem"
        try Executables.makeDevCertificates(into: certs)
        let serverKey = try await TokenAuthority.loadOrCreate(at: key)
        let reaper = KillRestartTests.Reaper()
        defer { reaper.killAll() }
        _ = try await KillRestartTests().startServer(data: data, certs: certs, extraArguments: ["--token-key", key], reaper: reaper)
        let channel = try createChannel(in: data)
        let issue = ["token", "issue", "--channel", channel.uuidString, "--user", "u1", "--name", "Ann", "--data-dir", data]
        let clean = ["SQUELCH_DATA_DIR": "", "SQUELCH_CONFIG": "", "SQUELCH_TOKEN_KEY": ""]
        let unsaid = try Executables.run("squelchd", issue, environment: clean)
        #expect(unsaid.status == 78 && unsaid.out.isEmpty && unsaid.err.contains("--token-key"), "\(unsaid.err)")
        #expect(!FileManager.default.fileExists(atPath: data + "/token-key.pem"), "no default key made")
        // A default key that is there (from before the server was given its own) is not the server's.
        _ = try await TokenAuthority.loadOrCreate(at: data + "/token-key.pem")
        let stray = try Executables.run("squelchd", issue, environment: clean)
        #expect(stray.status == 78 && stray.err.contains("not the one squelchd last started with"), "\(stray.err)")
        let right = try Executables.run("squelchd", issue + ["--token-key", key], environment: clean)
        #expect(right.status == 0, "\(right.err)")
        _ = try await serverKey.inspect(right.out.trimmingCharacters(in: .whitespacesAndNewlines))
    }

    @Test func theTokenCommandsFindTheKeyAsTheServerDoes() async throws {
        let base = FileManager.default.temporaryDirectory.appendingPathComponent("token-env-\(UUID())").path
        let data = base + "/data"
        let channel = try createChannel(in: data)
        let issue = ["token", "issue", "--channel", channel.uuidString, "--user", "u1", "--name", "Ann"]
        // SQUELCH_DATA_DIR, as the server has it, with no --data-dir.
        let viaEnvironment = try Executables.run("squelchd", issue, environment: ["SQUELCH_DATA_DIR": data])
        #expect(viaEnvironment.status == 0, "\(viaEnvironment.err)")
        let serverKey = try await TokenAuthority.load(from: data + "/token-key.pem")
        _ = try await serverKey.verify(viaEnvironment.out.trimmingCharacters(in: .whitespacesAndNewlines), channel: channel)
        // The config file's dataDirectory.
        let config = base + "/squelchd.json"
        try #"{"dataDirectory": "\#(data)"}"#.write(toFile: config, atomically: true, encoding: .utf8)
        let viaConfig = try Executables.run("squelchd", issue + ["--config", config], environment: ["SQUELCH_DATA_DIR": ""])
        #expect(viaConfig.status == 0, "\(viaConfig.err)")
        _ = try await serverKey.verify(viaConfig.out.trimmingCharacters(in: .whitespacesAndNewlines), channel: channel)
        // A configured key: used when it exists, never made when it doesn't.
        let other = base + "/keys/other.pem"
        let missing = try Executables.run("squelchd", issue + ["--data-dir", data, "--token-key", other])
        #expect(missing.status == 78 && missing.err.contains("no token key at \(other)"), "\(missing.err)")
        #expect(!FileManager.default.fileExists(atPath: other))
        let otherKey = try await TokenAuthority.loadOrCreate(at: other)
        let viaKey = try Executables.run("squelchd", issue + ["--data-dir", data], environment: ["SQUELCH_TOKEN_KEY": other])
        #expect(viaKey.status == 0, "\(viaKey.err)")
        let token = viaKey.out.trimmingCharacters(in: .whitespacesAndNewlines)
        _ = try await otherKey.verify(token, channel: channel)
        await #expect(throws: TokenError.self) { try await serverKey.verify(token, channel: channel) }
        // inspect reads the same key.
        let inspected = try Executables.run("squelchd", ["token", "inspect", token, "--data-dir", data, "--token-key", other])
        #expect(inspected.status == 0 && inspected.out.contains("status        valid"), "\(inspected.out) \(inspected.err)")
        // Its channel deleted, the token no longer joins, and inspect says so rather than "valid".
        let deleted = try Executables.run("squelchd", ["channel", "delete", channel.uuidString, "--yes", "--data-dir", data])
        #expect(deleted.status == 0, "\(deleted.err)")
        let orphan = try Executables.run("squelchd", ["token", "inspect", token, "--data-dir", data, "--token-key", other])
        #expect(orphan.status == 3 && orphan.out.contains("status        noChannel (no such channel"), "it would not join: \(orphan.out) \(orphan.err)")
    }

    @Test(arguments: [
        (["--channel", "not-a-uuid"], "not a UUID"),
        (["--ttl", "12y"], "not a lifetime"),
        (["--capability", "shout"], "unknown capability"),
        (["--priority", "300"], "0-255"),
        (["--ttl", "31d"], "longer than 30d"),
        (["--user", "   "], "the user id is empty"),
        (["--name", "Ann\u{202E}nimda"], "bidirectional"),
        (["--name", String(repeating: "n", count: 65)], "at most 64"),
    ] as [([String], String)])
    func badOptionsSayWhatIsWrong(options: [String], message: String) throws {
        var arguments = ["token", "issue", "--channel", UUID().uuidString, "--user", "u", "--name", "n",
                         "--data-dir", FileManager.default.temporaryDirectory.appendingPathComponent("token-bad-\(UUID())").path]
        arguments += options  // a repeated option: the last one wins
        let result = try Executables.run("squelchd", arguments)
        #expect(result.status == 64, "\(result.err)")
        #expect(result.err.contains(message), "\(result.err)")
        // The command's own usage, not the root's 'squelchd <subcommand>'.
        #expect(result.err.contains("Usage: squelchd token issue") && result.err.contains("See 'squelchd token issue --help'"), "\(result.err)")
    }
}
