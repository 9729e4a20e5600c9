import Foundation
import KeyFiles
import Testing
@testable import PTTServer

@Suite struct ServerConfigurationTests {
    static func temporaryPath(_ name: String) -> String {
        FileManager.default.temporaryDirectory.appendingPathComponent("squelch-config-\(UUID())-\(name)").path
    }

    static func writeFile(_ text: String) throws -> String {
        let path = temporaryPath("config.json")
        try text.write(toFile: path, atomically: true, encoding: .utf8)
        return path
    }

    @Test func defaultsAreSafe() throws {
        let config = try ServerConfiguration.load(file: nil, environment: [:])
        #expect(config == ServerConfiguration())
        #expect(config.host == "127.0.0.1" && config.port == 7700)
        #expect(config.adminHost == "127.0.0.1" && config.adminPort == 7780)
        #expect(config.adminKey == nil && config.adminKeyFile == nil)
        #expect(config.maxConnections == 10_000 && config.fullDuplexMaxTalkers == 4)
        #expect(config.disconnectGraceSeconds == 2 && config.maxQueue == 16 && config.logLevel == .info)
    }

    /// What squelchd warns about at start: an admin API reachable from other machines.
    @Test func loopbackHostsAreToldFromOthers() {
        for host in ["127.0.0.1", "127.8.9.10", "localhost", "LOCALHOST", "::1", "[::1]", "0:0:0:0:0:0:0:1"] {
            #expect(ServerConfiguration.isLoopback(host), "\(host)")
        }
        for host in ["0.0.0.0", "::", "10.0.0.5", "192.168.1.2", "admin.example.org", "128.0.0.1", "::2", ""] {
            #expect(!ServerConfiguration.isLoopback(host), "\(host)")
        }
    }

    @Test func flagsBeatEnvironmentWhichBeatsTheFileWhichBeatsDefaults() throws {
        let file = try Self.writeFile("""
            {"port": 1000, "adminPort": 2000, "host": "10.0.0.1", "logLevel": "debug", "maxQueue": 3,
             "disconnectGraceSeconds": 0.5, "adminKey": "from-the-file-0123456789"}
            """)
        let environment = ["SQUELCH_PORT": "3000", "SQUELCH_ADMIN_PORT": "4000", "SQUELCH_MAX_QUEUE": "",
                           "SQUELCH_FULL_DUPLEX_MAX_TALKERS": "8", "SQUELCH_ADMIN_KEY": "from-the-environment-0123",
                           "UNRELATED": "x"]
        let config = try ServerConfiguration.load(file: file, environment: environment,
                                                  overrides: ConfigurationOverrides(["port": 5000, "certificateChainPath": "flag.pem"]))
        #expect(config.port == 5000, "flag over environment over file")
        #expect(config.adminPort == 4000, "environment over file")
        #expect(config.host == "10.0.0.1", "file over default")
        #expect(config.logLevel == .debug)
        #expect(config.maxQueue == 3, "an empty variable counts as unset")
        #expect(config.disconnectGraceSeconds == 0.5)
        #expect(config.fullDuplexMaxTalkers == 8)
        #expect(config.adminKey == "from-the-environment-0123")
        #expect(config.certificateChainPath == "flag.pem")
        #expect(config.privateKeyPath == ServerConfiguration().privateKeyPath)
        #expect(config.adminHost == "127.0.0.1")

        // Without --config, SQUELCH_CONFIG names the file.
        let viaEnvironment = try ServerConfiguration.load(file: nil, environment: ["SQUELCH_CONFIG": file])
        #expect(viaEnvironment.port == 1000 && viaEnvironment.adminPort == 2000)

        // A flag replaces a bad variable without it being read: a stale SQUELCH_PORT=abc does not
        // stop a start given --port.
        let flagged = try ServerConfiguration.load(file: nil, environment: ["SQUELCH_PORT": "abc"], overrides: ConfigurationOverrides(["port": 7700]))
        #expect(flagged.port == 7700)
        // An IPv6 address in brackets, as URLs write it, is the address.
        let bracketed = try ServerConfiguration.load(file: nil, environment: [:], overrides: ConfigurationOverrides(["host": "[::1]", "adminHost": "[::1]"]))
        #expect(bracketed.host == "::1" && bracketed.adminHost == "::1" && ServerConfiguration.urlHost(bracketed.adminHost) == "[::1]")
    }

    @Test func aLaterAdminKeyFileReplacesAnEarlierKey() throws {
        let file = try Self.writeFile(#"{"adminKey": "from-the-file-0123456789"}"#)
        let config = try ServerConfiguration.load(file: file, environment: [:],
                                                  overrides: ConfigurationOverrides(["adminKeyFile": "/run/secrets/key"]))
        #expect(config.adminKey == nil && config.adminKeyFile == "/run/secrets/key")
        let both = ConfigurationOverrides(["adminKey": "x-0123456789abcdef", "adminKeyFile": "/k"])
        #expect(throws: ServerConfiguration.ConfigurationError.self) {
            try ServerConfiguration.load(file: nil, environment: [:], overrides: both)
        }
    }

    /// A mistyped variable is named, with the one it was likely meant to be; the settings' own
    /// variables, the config file's and other programs' are not.
    @Test func aMistypedEnvironmentVariableIsNamedWithItsLikelyMeaning() {
        let unknown = ServerConfiguration.unknownEnvironmentVariables([
            "SQUELCH_PROT": "7701", "SQUELCH_PORT": "7700", "SQUELCH_CONFIG": "/etc/squelch.json", "SQUELCH_DATA_DIRECTORY": "/srv",
            "SQUELCH_WHATEVER_ELSE_ENTIRELY": "1", "HOME": "/root", "SQUELCH_ADMIN_KEY": "k",
        ])
        #expect(unknown.map(\.name) == ["SQUELCH_DATA_DIRECTORY", "SQUELCH_PROT", "SQUELCH_WHATEVER_ELSE_ENTIRELY"])
        #expect(unknown.map(\.meant) == ["SQUELCH_DATA_DIR", "SQUELCH_PORT", nil])
        #expect(ServerConfiguration.unknownEnvironmentVariables(["SQUELCH_PORT": "1"]).isEmpty)
    }

    @Test func anUnknownKeyIsNamedWithTheValidOnes() throws {
        let file = try Self.writeFile(#"{"port": 7701, "adminport": 1}"#)
        let error = #expect(throws: ServerConfiguration.ConfigurationError.self) {
            try ServerConfiguration.load(file: file, environment: [:])
        }
        let message = String(describing: try #require(error))
        #expect(message.contains("unknown setting \"adminport\""))
        #expect(message.contains(file))
        for setting in ServerConfiguration.settings { #expect(message.contains(setting.key)) }
    }

    @Test func badFilesGiveClearErrors() throws {
        let missing = Self.temporaryPath("missing.json")
        let notFound = #expect(throws: ServerConfiguration.ConfigurationError.self) {
            try ServerConfiguration.load(file: missing, environment: [:])
        }
        #expect(String(describing: try #require(notFound)).contains("no such file; check the path given with --config"))
        let directory = #expect(throws: ServerConfiguration.ConfigurationError.self) {
            try ServerConfiguration.load(file: FileManager.default.temporaryDirectory.path, environment: [:])
        }
        #expect(String(describing: try #require(directory)).contains("it is a directory, not a JSON file"))

        let cases: [(text: String, expected: String)] = [
            (#"{"port": 77"#, "not valid JSON"),
            (#"[1, 2]"#, "one JSON object"),
            (#"{"port": "7700"}"#, "\"port\" must be a whole number, not \"7700\""),
            (#"{"port": 7793.5}"#, "\"port\" must be a whole number, not 7793.5"),
            (#"{"host": 1}"#, "\"host\" must be a string"),
            (#"{"logLevel": "loud"}"#, "log level 'loud'"),
            // A key given twice: Foundation keeps the first without a word, most tools the last.
            (#"{"port": 7715, "logLevel": "info", "port": 7716}"#, "\"port\" is set more than once; keep one"),
            ("{\"maxQueue\": 4,\n  \"max\\u0051ueue\": 999}", "\"maxQueue\" is set more than once"),
        ]
        for (text, expected) in cases {
            let file = try Self.writeFile(text)
            let error = #expect(throws: ServerConfiguration.ConfigurationError.self, "\(text)") {
                try ServerConfiguration.load(file: file, environment: [:])
            }
            let message = error.map { String(describing: $0) } ?? ""
            #expect(message.contains(expected), "\(text) → \(message)")
        }
        // The same text inside a value, or a nested object's keys, is not a repeated setting.
        #expect(ServerConfiguration.duplicateTopLevelKeys(in: Data(#"{"host": "port", "port": 1, "x": {"port": 2}, "y": ["port", {"port": 3}]}"#.utf8)) == [])
        #expect(ServerConfiguration.duplicateTopLevelKeys(in: Data(#"{"a\"b": 1, "a\"b": 2, "c": "\\", "c": 3}"#.utf8)) == ["a\"b", "c"])
        // null keeps the default.
        let nulls = try ServerConfiguration.load(file: try Self.writeFile(#"{"port": null}"#), environment: [:])
        #expect(nulls.port == 7700)
    }

    @Test func outOfRangeValuesSayWhatToDo() throws {
        let cases: [(overrides: ConfigurationOverrides, environment: [String: String], expected: [String])] = [
            (ConfigurationOverrides(["port": 70_000]), [:], ["UDP port 70000", "1-65535", "--port", "SQUELCH_PORT"]),
            (ConfigurationOverrides(["adminPort": -1]), [:], ["admin port -1", "--admin-port"]),
            (ConfigurationOverrides(), ["SQUELCH_PORT": "seventy"], ["SQUELCH_PORT='seventy' is not a whole number"]),
            (ConfigurationOverrides(["port": 7700]), ["SQUELCH_DISCONNECT_GRACE_SECONDS": "soon"], ["SQUELCH_DISCONNECT_GRACE_SECONDS='soon'"]),
            (ConfigurationOverrides(["adminPort": 2198]), [:], ["the admin API and the APNs simulator's control port are both set to port 2198"]),
            (ConfigurationOverrides(["fullDuplexMaxTalkers": 17]), [:], ["1-16", "--full-duplex-max-talkers"]),
            (ConfigurationOverrides(["fullDuplexMaxTalkers": 0]), [:], ["1-16"]),
            (ConfigurationOverrides(["maxConnections": 0]), [:], ["maximum connections 0"]),
            (ConfigurationOverrides(["disconnectGraceSeconds": 61]), [:], ["disconnect grace"]),
            (ConfigurationOverrides(["maxQueue": -1]), [:], ["floor queue length -1"]),
            (ConfigurationOverrides(["logLevel": "chatty"]), [:], ["log level 'chatty'", "--log-level"]),
            (ConfigurationOverrides(), ["SQUELCH_ADMIN_KEY": "short"], ["at least 16", "SQUELCH_ADMIN_KEY"]),
            (ConfigurationOverrides(), ["SQUELCH_DISCONNECT_GRACE_SECONDS": "soon"], ["SQUELCH_DISCONNECT_GRACE_SECONDS='soon' is not a number"]),
            (ConfigurationOverrides(["apns": "http://apns.example"]), [:], ["apns 'http://apns.example'", "--apns"]),
            (ConfigurationOverrides(["apns": "https://127.0.0.1:99999"]), [:], ["has port 99999", "1-65535", "--apns"]),
            (ConfigurationOverrides(["apns": "https://127.0.0.1:0"]), [:], ["has port 0"]),
            (ConfigurationOverrides(["apnsKeyID": "short"]), [:], ["10-character Key ID", "--apns-key-id"]),
            (ConfigurationOverrides(["apnsTopic": "org.example.app"]), [:], ["<bundle id>.voip-ptt", "--apns-topic"]),
            (ConfigurationOverrides(["apnsPoolSize": 0]), [:], ["pool size 0"]),
        ]
        for (overrides, environment, expected) in cases {
            let error = #expect(throws: ServerConfiguration.ConfigurationError.self) {
                try ServerConfiguration.load(file: nil, environment: environment, overrides: overrides)
            }
            let message = error.map { String(describing: $0) } ?? ""
            for fragment in expected { #expect(message.contains(fragment), "\(message)") }
        }
    }

    /// Files in the way are said in words, not as "NSCocoaErrorDomain error 512".
    @Test func pathsThatCantBeUsedSayWhy() throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("config-paths-\(UUID())").path
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        try "x".write(toFile: dir + "/afile", atomically: true, encoding: .utf8)
        var configuration = ServerConfiguration()
        configuration.dataDirectory = dir + "/afile/data"
        let underAFile = #expect(throws: ServerConfiguration.ConfigurationError.self) { try configuration.prepare() }
        #expect("\(underAFile!)".contains("\(dir)/afile is a file, not a directory") && !"\(underAFile!)".contains("NSCocoaErrorDomain"), "\(underAFile!)")
        configuration.dataDirectory = dir
        configuration.adminKeyFile = dir
        let aDirectory = #expect(throws: ServerConfiguration.ConfigurationError.self) { try configuration.resolveAdminKey() }
        #expect("\(aDirectory!)".contains("it is a directory") && !"\(aDirectory!)".contains("NSCocoaErrorDomain"), "\(aDirectory!)")
    }

    @Test func pushTargetsParse() throws {
        #expect(try ServerConfiguration.load(file: nil, environment: [:]).pushTarget == .simulator)
        #expect(try ServerConfiguration.load(file: nil, environment: ["SQUELCH_APNS": "off"]).pushTarget == .off)
        let apple = ConfigurationOverrides(["apns": "apple", "apnsKeyPath": "/etc/squelch/AuthKey_ABC123DEFG.p8", "apnsKeyID": "ABC123DEFG",
                                           "apnsTeamID": "TEAM123456", "apnsTopic": "com.example.radio.voip-ptt"])
        #expect(try ServerConfiguration.load(file: nil, environment: [:], overrides: apple).pushTarget == .apple)
        // Apple with any of the development defaults would refuse every push while /healthz said ok.
        for leftAsDefault in ["apnsKeyPath", "apnsKeyID", "apnsTeamID", "apnsTopic"] {
            var overrides = apple
            overrides[leftAsDefault] = nil
            let error = #expect(throws: ServerConfiguration.ConfigurationError.self) {
                try ServerConfiguration.load(file: nil, environment: [:], overrides: overrides)
            }
            #expect(String(describing: error.map { $0 } as Any).contains("development") || String(describing: error as Any).contains("example app"))
        }
        #expect(try ServerConfiguration.load(file: nil, environment: [:], overrides: ConfigurationOverrides(["apns": "https://push.example:2197"])).pushTarget
                == .custom(host: "push.example", port: 2197))
        // With pushes off, the APNs identity isn't checked at all.
        #expect(throws: Never.self) {
            try ServerConfiguration.load(file: nil, environment: [:], overrides: ConfigurationOverrides(["apns": "off", "apnsKeyID": "x"]))
        }
    }

    @Test func helpNamesTheVariableAndDefaultOfEverySetting() {
        #expect(ServerConfiguration.help("port", "UDP port.") == "UDP port. (env: SQUELCH_PORT; config file: \"port\"; default: 7700)")
        let settings = ServerConfiguration.settings
        #expect(Set(settings.map(\.key)).count == settings.count)
        #expect(Set(settings.map(\.environment)).count == settings.count)
        #expect(settings.allSatisfy { $0.environment.hasPrefix("SQUELCH_") && !$0.defaultDescription.isEmpty })
        #expect(settings.count == 42, "a new ServerConfiguration field needs a row in settings and a flag in Serve")
    }

    /// The table is the one declaration: a property of ServerConfiguration without a row would be
    /// settable from no file, variable or flag.
    @Test func everyPropertyOfTheConfigurationIsASettingOfTheTable() {
        let properties = Mirror(reflecting: ServerConfiguration()).children.compactMap(\.label)
        #expect(properties == ServerConfiguration.settings.map(\.key))
    }

    @Test func flagsAreReadFromTheTable() throws {
        let layer = try ServerConfiguration.flagOverrides(["--port", "5000", "--cert=flag.pem", "--disconnect-grace-seconds", "-1",
                                                           "--log-level", "debug", "--port", "5001"])
        #expect(layer == ["port": 5001, "certificateChainPath": "flag.pem", "disconnectGraceSeconds": -1.0, "logLevel": "debug"])
        #expect(throws: ServerConfiguration.FlagError.invalidValue("abc", flag: "--port", valueName: "port", expected: "a whole number")) {
            try ServerConfiguration.flagOverrides(["--port", "abc"])
        }
        #expect(throws: ServerConfiguration.FlagError.missingValue(flag: "--data-dir", valueName: "path")) {
            try ServerConfiguration.flagOverrides(["--data-dir"])
        }
        let typo = #expect(throws: ServerConfiguration.FlagError.self) { try ServerConfiguration.flagOverrides(["--prot", "7700"]) }
        #expect(typo?.description.contains("did you mean --port?") == true, "\(String(describing: typo))")
        // The admin key has no flag: on a command line, `ps` would show it.
        #expect(throws: ServerConfiguration.FlagError.unknown("--admin-key")) { try ServerConfiguration.flagOverrides(["--admin-key", "k"]) }
        #expect(throws: ServerConfiguration.FlagError.unknown("7700")) { try ServerConfiguration.flagOverrides(["7700"]) }
    }

    @Test func theTokenKeyDefaultsToTheDataDirectoryAndCanBeSetAnywhere() throws {
        let plain = try ServerConfiguration.load(file: nil, environment: ["SQUELCH_DATA_DIR": "/var/lib/squelch"])
        #expect(plain.tokenKeyPath == nil && plain.resolvedTokenKeyPath == "/var/lib/squelch/token-key.pem")
        let set = try ServerConfiguration.load(file: nil, environment: ["SQUELCH_TOKEN_KEY": "/etc/squelch/token.pem"])
        #expect(set.resolvedTokenKeyPath == "/etc/squelch/token.pem")
        var flag = ConfigurationOverrides()
        flag["tokenKeyPath"] = ""
        let error = #expect(throws: ServerConfiguration.ConfigurationError.self) {
            try ServerConfiguration.load(file: nil, environment: [:], overrides: flag)
        }
        #expect(String(describing: try #require(error)).contains("--token-key"))
        // A rotation's previous key comes from any layer, and may not be the current key.
        let rotating = try ServerConfiguration.load(file: nil, environment: ["SQUELCH_PREVIOUS_TOKEN_KEY": "/etc/squelch/old.pem"])
        #expect(rotating.previousTokenKeyPath == "/etc/squelch/old.pem")
        let same = #expect(throws: ServerConfiguration.ConfigurationError.self) {
            try ServerConfiguration.load(file: nil, environment: ["SQUELCH_TOKEN_KEY": "/k.pem", "SQUELCH_PREVIOUS_TOKEN_KEY": "/k.pem"])
        }
        #expect(String(describing: try #require(same)).contains("--previous-token-key"))
    }

    @Test func configurationRefusesBadValuesWithAdvice() throws {
        var config = ServerConfiguration()
        config.adminPort = 70_000
        #expect(throws: ServerConfiguration.ConfigurationError.self) { try config.prepare() }
        config = ServerConfiguration()
        config.controlMessagesPerSecond = 0
        #expect(throws: ServerConfiguration.ConfigurationError.self) { try config.prepare() }
        config = ServerConfiguration()
        config.floorGrantsPerMinute = 0
        let grants = #expect(throws: ServerConfiguration.ConfigurationError.self) { try config.prepare() }
        #expect(String(describing: try #require(grants)).contains("--floor-grants-per-minute"))
        config = ServerConfiguration()
        config.transmissionLogDays = -1
        let retention = #expect(throws: ServerConfiguration.ConfigurationError.self) { try config.prepare() }
        #expect(String(describing: try #require(retention)).contains("--transmission-log-days"))
        config = ServerConfiguration()
        config.auditDays = 36_501
        let audit = #expect(throws: ServerConfiguration.ConfigurationError.self) { try config.prepare() }
        #expect(String(describing: try #require(audit)).contains("--audit-days"))
        #expect(try ServerConfiguration.load(file: nil, environment: ["SQUELCH_AUDIT_DAYS": "30"]).auditDays == 30)
        config = ServerConfiguration()
        config.memberRetentionDays = 40_000
        let members = #expect(throws: ServerConfiguration.ConfigurationError.self) { try config.prepare() }
        #expect(String(describing: try #require(members)).contains("--member-retention-days"))

        let file = Self.temporaryPath("notadir")
        _ = FileManager.default.createFile(atPath: file, contents: Data())
        config = ServerConfiguration()
        config.dataDirectory = file
        let error = #expect(throws: ServerConfiguration.ConfigurationError.self) { try config.prepare() }
        #expect(String(describing: try #require(error)).contains("--data-dir"))
    }

    @Test func dataDirectoryIsCreatedPrivate() throws {
        var config = ServerConfiguration()
        config.dataDirectory = Self.temporaryPath("data") + "/nested"
        try config.prepare()
        let attributes = try FileManager.default.attributesOfItem(atPath: config.dataDirectory)
        #expect((attributes[.posixPermissions] as? NSNumber)?.intValue == 0o700)
    }

    @Test func processesStartingTogetherShareOneAdminKey() async throws {
        var config = ServerConfiguration()
        config.dataDirectory = Self.temporaryPath("data")
        try config.prepare()
        let starting = config
        let keys = try await withThrowingTaskGroup(of: String.self) { group in
            for _ in 0..<8 { group.addTask { try starting.resolveAdminKey() } }
            return try await group.reduce(into: Set<String>()) { $0.insert($1) }
        }
        #expect(keys.count == 1)
        let left = try FileManager.default.contentsOfDirectory(atPath: config.dataDirectory).filter { $0.hasPrefix("admin-key") }
        #expect(left == ["admin-key"], "no temporary files left behind: \(left)")
    }

    @Test func aKeyFileIsNeverReplaced() throws {
        let path = Self.temporaryPath("key")
        #expect(try KeyFiles.createOnce(at: path, contents: Array("first\n".utf8)) == .created)
        #expect(try KeyFiles.createOnce(at: path, contents: Array("second\n".utf8)) == .exists)
        #expect(try String(contentsOfFile: path, encoding: .utf8) == "first\n")
        #expect(throws: KeyFiles.Failure.self) {
            try KeyFiles.createOnce(at: "/nonexistent-\(UUID())/key", contents: [1])
        }
    }

    @Test func theAdminKeyIsGeneratedOncePrivateAndReused() throws {
        var config = ServerConfiguration()
        config.dataDirectory = Self.temporaryPath("data")
        try config.prepare()
        let path = config.dataDirectory + "/admin-key"
        #expect(!FileManager.default.fileExists(atPath: path))

        let key = try config.resolveAdminKey()
        #expect(key.count == 43, "32 bytes in base64url without padding")
        #expect(key.allSatisfy { $0.isLetter || $0.isNumber || $0 == "-" || $0 == "_" })
        let attributes = try FileManager.default.attributesOfItem(atPath: path)
        #expect((attributes[.posixPermissions] as? NSNumber)?.intValue == 0o600)
        #expect(try String(contentsOfFile: path, encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines) == key)

        #expect(try config.resolveAdminKey() == key, "reused, not regenerated")
        var restarted = ServerConfiguration()
        restarted.dataDirectory = config.dataDirectory
        #expect(try restarted.resolveAdminKey() == key)
        #expect(ServerConfiguration.generateAdminKey() != key)

        // An explicit key wins and writes nothing; a key file is read and trimmed.
        var explicit = ServerConfiguration()
        explicit.dataDirectory = Self.temporaryPath("data")
        explicit.adminKey = "explicit-key-0123456789"
        try explicit.prepare()
        #expect(try explicit.resolveAdminKey() == "explicit-key-0123456789")
        #expect(!FileManager.default.fileExists(atPath: explicit.generatedAdminKeyPath))

        let keyFile = try Self.writeFile("  from-a-file-0123456789\n")
        explicit.adminKey = nil
        explicit.adminKeyFile = keyFile
        #expect(try explicit.resolveAdminKey() == "from-a-file-0123456789")

        // A damaged generated key is refused with advice rather than silently replaced.
        try "\n".write(toFile: path, atomically: true, encoding: .utf8)
        let error = #expect(throws: ServerConfiguration.ConfigurationError.self) { try config.resolveAdminKey() }
        #expect(String(describing: try #require(error)).contains("delete it"))
    }
}
