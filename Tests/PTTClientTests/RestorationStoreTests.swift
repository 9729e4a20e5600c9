import Foundation
@testable import PTTClient
import Testing

@Suite struct RestorationStoreTests {
    /// Each damaged file is moved aside and said for what it is: the channel, the leaves owed to a
    /// server, or an app's own settings (which were once described as "the saved channel").
    @Test func aDamagedFileIsMovedAsideAndNamedForWhatItHolds() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("restoration-\(UUID())").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let store = RestorationStore(directory: directory)
        for name in ["channel.json", RestorationStore.owedLeavesFile, "settings.json"] {
            try Data("{not json".utf8).write(to: URL(fileURLWithPath: directory + "/" + name))
        }
        struct Settings: Codable { var port: Int }
        func failure(_ body: () throws(RestorationError) -> Void) -> RestorationError? {
            do { try body() } catch { return error }
            return nil
        }
        let channel = failure { () throws(RestorationError) in _ = try store.load() }
        let leaves = failure { () throws(RestorationError) in _ = try store.loadOwedLeaves() }
        let settings = failure { () throws(RestorationError) in _ = try store.loadValue(Settings.self, named: "settings.json") }
        #expect(channel?.file == .channel && "\(channel!)".contains("the saved channel"), "\(String(describing: channel))")
        #expect(leaves?.file == .owedLeaves && "\(leaves!)".contains("leaves not yet delivered"), "\(String(describing: leaves))")
        #expect(settings?.file == .app("settings.json") && "\(settings!)".contains("the defaults apply"), "\(String(describing: settings))")
        for error: RestorationError? in [channel, leaves, settings] {
            guard case .corrupt(_, let path, let aside, _)? = error else {
                Issue.record("not corrupt: \(String(describing: error))")
                continue
            }
            #expect(!FileManager.default.fileExists(atPath: path) && FileManager.default.fileExists(atPath: aside), "moved aside, not deleted: \(aside)")
        }
    }
}
