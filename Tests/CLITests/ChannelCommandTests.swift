import Foundation
import SquelchTesting
import Testing

@Suite struct ChannelCommandTests {
    let dataDir = FileManager.default.temporaryDirectory.appendingPathComponent("channel-cli-\(UUID())").path

    func squelchd(_ arguments: [String]) throws -> (status: Int32, out: String, err: String) {
        try Executables.run("squelchd", ["channel"] + arguments + ["--data-dir", dataDir])
    }

    @Test func createListUpdateShowDelete() throws {
        defer { try? FileManager.default.removeItem(atPath: dataDir) }

        let created = try squelchd(["create", "--name", "Ops", "--image", "https://example.com/ops.png", "--max-burst", "45"])
        #expect(created.status == 0, "\(created.err)")
        let id = try #require(UUID(uuidString: created.out.trimmingCharacters(in: .whitespacesAndNewlines)), "stdout: \(created.out)")
        #expect(created.err.contains("squelchd token issue --channel \(id.uuidString)"), "\(created.err)")
        // The first one made the database, and says where, in case the server keeps its data elsewhere.
        #expect(created.err.contains("note: no database in \(URL(fileURLWithPath: dataDir).standardizedFileURL.path); made a new one"),
                "\(created.err)")
        let second = try squelchd(["create", "--name", "Spare"])
        #expect(second.status == 0 && !second.err.contains("no database"), "\(second.err)")
        #expect(try squelchd(["delete", second.out.trimmingCharacters(in: .whitespacesAndNewlines), "--yes"]).status == 0)

        let listed = try squelchd(["list"])
        #expect(listed.status == 0, "\(listed.err)")
        let row = try #require(listed.out.split(separator: "\n").first { $0.contains(id.uuidString) }, "\(listed.out)")
        #expect(row.contains("Ops") && row.contains("half") && row.contains("45 s"), "\(row)")

        let updated = try squelchd(["update", id.uuidString, "--name", "Dispatch", "--mode", "full", "--max-burst", "30", "--clear-image"])
        #expect(updated.status == 0, "\(updated.err)")

        let shown = try squelchd(["show", id.uuidString])
        #expect(shown.status == 0, "\(shown.err)")
        #expect(shown.out.contains("Dispatch") && shown.out.contains("full duplex") && shown.out.contains("30 s"), "\(shown.out)")
        #expect(shown.out.contains("(none)"), "the image was cleared: \(shown.out)")

        let json = try squelchd(["show", id.uuidString, "--json"])
        #expect(json.status == 0, "\(json.err)")
        let object = try #require(try JSONSerialization.jsonObject(with: Data(json.out.utf8)) as? [String: Any], "\(json.out)")
        #expect(object["name"] as? String == "Dispatch" && object["mode"] as? String == "fullDuplex")
        // `image` is there as null, as the admin API writes it.
        #expect(object["maxBurstSeconds"] as? Int == 30 && object["image"] is NSNull && (object["members"] as? [Any])?.isEmpty == true)

        let refused = try squelchd(["delete", id.uuidString])
        #expect(refused.status == 1)
        #expect(refused.err.hasPrefix("squelchd: ") && refused.err.contains("--yes"), "\(refused.err)")
        #expect(try squelchd(["list"]).out.contains(id.uuidString), "a refused delete must keep the channel")

        let deleted = try squelchd(["delete", id.uuidString, "--yes"])
        #expect(deleted.status == 0, "\(deleted.err)")
        let listJSON = try squelchd(["list", "--json"])
        #expect(listJSON.status == 0 && listJSON.out.trimmingCharacters(in: .whitespacesAndNewlines) == "[\n\n]"
                || listJSON.out.trimmingCharacters(in: .whitespacesAndNewlines) == "[]", "\(listJSON.out)")

        let gone = try squelchd(["show", id.uuidString])
        #expect(gone.status == 1)
        #expect(gone.err.contains("no channel \(id)") && gone.err.contains("squelchd channel list"), "\(gone.err)")
    }

    @Test func mistakesSayWhatToDo() throws {
        defer { try? FileManager.default.removeItem(atPath: dataDir) }

        let noDatabase = try squelchd(["list"])
        #expect(noDatabase.status == 78)
        #expect(noDatabase.err.contains("no database") && noDatabase.err.contains("--data-dir"), "\(noDatabase.err)")
        #expect(!FileManager.default.fileExists(atPath: dataDir), "list must not create a data directory")

        let invalid = try squelchd(["create", "--name", "Ops", "--max-burst", "0"])
        #expect(invalid.status == 1)
        #expect(invalid.err.contains("maximum burst"), "\(invalid.err)")

        _ = try squelchd(["create", "--name", "Ops"])
        let badID = try squelchd(["show", "not-a-uuid"])
        #expect(badID.status == 1 && badID.err.contains("not a channel id"), "\(badID.err)")

        let nothing = try squelchd(["update", UUID().uuidString])
        #expect(nothing.status == 1 && nothing.err.contains("nothing to change"), "\(nothing.err)")

        try Data("this is not a database, it is a shopping list".utf8).write(to: URL(fileURLWithPath: dataDir + "/squelch.sqlite"))
        let corrupt = try squelchd(["list"])
        #expect(corrupt.status == 78 && corrupt.err.contains("not a database"), "\(corrupt.err)")
    }

    /// Another process holds the database's write lock past the CLI's busy timeout (5 s): the CLI
    /// exits 75 (EX_TEMPFAIL, "try again"), says so in one line, and writes nothing.
    @Test func aLockedDatabaseExitsTempFailAndChangesNothing() throws {
        defer { try? FileManager.default.removeItem(atPath: dataDir) }
        #expect(try squelchd(["create", "--name", "Ops"]).status == 0)
        let lock = try WriteLockHolder(path: dataDir + "/squelch.sqlite")
        let locked = try squelchd(["create", "--name", "Gate 4"])
        lock.unlock()
        #expect(locked.status == 75, "\(locked.err)")
        #expect(locked.err.split(separator: "\n").count == 1 && locked.err.contains("locked") && locked.err.contains("try again"), "\(locked.err)")
        let list = try squelchd(["list"])
        #expect(list.status == 0 && list.out.contains("Ops") && !list.out.contains("Gate 4"), "\(list.out)")
    }
}
