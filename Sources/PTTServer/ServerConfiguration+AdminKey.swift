import Foundation
import KeyFiles
import Logging
import SquelchInfo

extension ServerConfiguration {
    /// Path of the generated admin key.
    public var generatedAdminKeyPath: String {
        URL(fileURLWithPath: dataDirectory).appendingPathComponent(Self.adminKeyFileName).path
    }

    /// Where `resolveAdminKey` finds the key, in words (a 401 says it).
    public var adminKeySource: String {
        if adminKey != nil { return "the one set with SQUELCH_ADMIN_KEY or \"adminKey\" in the config file" }
        // No path: the 401 goes to whoever asks, before any key.
        if adminKeyFile != nil { return "the one in the file set with --admin-key-file, SQUELCH_ADMIN_KEY_FILE or \"adminKeyFile\" in the config file" }
        return "the one in <data-dir>/\(URL(fileURLWithPath: generatedAdminKeyPath).lastPathComponent)"
    }

    /// The admin API key: `adminKey` if set, else the contents of `adminKeyFile`, else the key in
    /// `<dataDirectory>/admin-key`, generated there (mode 0600) on first use. Call after `prepare()`.
    public func resolveAdminKey() throws(ConfigurationError) -> String {
        if let adminKey { return adminKey }
        if let adminKeyFile {
            return try Self.readAdminKey(at: adminKeyFile,
                                         advice: "point --admin-key-file (or SQUELCH_ADMIN_KEY_FILE) at a file holding a key of at least \(Self.minimumAdminKeyLength) characters")
        }
        let path = generatedAdminKeyPath
        let advice = "delete it and restart to generate a new key (clients then need the new one)"
        if FileManager.default.fileExists(atPath: path) { return try Self.readAdminKey(at: path, advice: advice) }
        let key = Self.generateAdminKey()
        let outcome: KeyFiles.Outcome
        do { outcome = try KeyFiles.createOnce(at: path, contents: Array((key + "\n").utf8)) } catch {
            throw .adminKey(path: path, reason: error.description)
        }
        // Another process may have made the key a moment ago: then its key is the one to use.
        if outcome == .exists { return try Self.readAdminKey(at: path, advice: advice) }
        return key
    }

    /// 32 random bytes from the system generator, base64url without padding (43 characters).
    public static func generateAdminKey() -> String {
        var generator = SystemRandomNumberGenerator()
        let bytes = (0..<32).map { _ in UInt8.random(in: .min ... .max, using: &generator) }
        return Data(bytes).base64EncodedString()
            .replacingOccurrences(of: "+", with: "-")
            .replacingOccurrences(of: "/", with: "_")
            .replacingOccurrences(of: "=", with: "")
    }

    static func readAdminKey(at path: String, advice: String) throws(ConfigurationError) -> String {
        let text: String
        do { text = try String(contentsOfFile: path, encoding: .utf8) } catch {
            let problem = KeyFiles.problem(error, at: path)
            // Someone else's file is to be given back, not replaced.
            let fix = problem == "permission denied" ? "run squelchd as the user that owns it, or give it to this one (keep it mode 600)" : advice
            throw .adminKey(path: path, reason: "cannot read it (\(problem)); \(fix)")
        }
        let key = text.trimmingCharacters(in: .whitespacesAndNewlines)
        guard key.count >= minimumAdminKeyLength, key.unicodeScalars.allSatisfy({ $0.value > 0x20 && $0.value < 0x7F }) else {
            throw .adminKey(path: path, reason: "it does not hold a key of at least \(minimumAdminKeyLength) printable characters; \(advice)")
        }
        return key
    }
}
