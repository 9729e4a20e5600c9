import Foundation
import KeyFiles
import Logging
import SquelchInfo

extension ServerConfiguration {
    /// Environment variable naming the config file when `--config` is not given.
    public static let configFileEnvironment = "SQUELCH_CONFIG"

    /// The `SQUELCH_…` variables in `environment` that name no setting, each with the setting's
    /// variable it most likely meant (nil if none is close): a typo such as `SQUELCH_PROT` would
    /// otherwise be ignored without a word, and the server start on the default it was to replace.
    public static func unknownEnvironmentVariables(_ environment: [String: String]) -> [(name: String, meant: String?)] {
        var known: Set<String> = [configFileEnvironment]
        for setting in settings { known.insert(setting.environment) }
        let candidates = known.sorted()
        var unknown: [(name: String, meant: String?)] = []
        for name in environment.keys.sorted() where name.hasPrefix("SQUELCH_") && !known.contains(name) {
            // A word spelled out (`…_DATA_DIRECTORY` for `…_DATA_DIR`) counts as one typo.
            unknown.append((name, SquelchInfo.nearest(to: name, among: candidates, within: 3) { name, candidate in
                name.hasPrefix(candidate) || candidate.hasPrefix(name) ? 1 : SquelchInfo.editDistance(name, candidate)
            }))
        }
        return unknown
    }

    /// The configuration from, in rising precedence, the defaults, the JSON config file at `file` (or
    /// at `$SQUELCH_CONFIG` when `file` is nil), `environment`'s `SQUELCH_…` variables and `overrides`
    /// (the command-line flags). Empty variables count as unset. The result is validated.
    public static func load(file: String?, environment: [String: String],
                            overrides: ConfigurationOverrides = ConfigurationOverrides()) throws(ConfigurationError) -> ServerConfiguration {
        var configuration = ServerConfiguration()
        if let path = file ?? environment[configFileEnvironment].flatMap({ $0.isEmpty ? nil : $0 }) {
            try configuration.apply(try fileOverrides(path: path))
        }
        try configuration.apply(try environmentOverrides(environment, except: overrides))
        try configuration.apply(overrides)
        try configuration.validate()
        return configuration
    }

    /// Lays `layer`'s values over these. Within one layer, setting both the admin key and its file
    /// is an error; across layers the later one replaces the other.
    mutating func apply(_ layer: ConfigurationOverrides) throws(ConfigurationError) {
        if layer["adminKey"] != nil, layer["adminKeyFile"] != nil {
            throw .invalidValue("both adminKey and adminKeyFile are set; set one of them")
        }
        if layer["adminKey"] != nil { adminKeyFile = nil }
        if layer["adminKeyFile"] != nil { adminKey = nil }
        for setting in Self.settings {
            if let value = layer[setting.key] { try set(setting, to: value) }
        }
    }

    /// Sets one setting. Each layer's reader makes values of the setting's kind (or says what is
    /// wrong in its own terms); a number for a number setting may be whole.
    mutating func set(_ setting: Setting, to value: SettingValue) throws(ConfigurationError) {
        switch (setting.kind, value) {
        case (.text(let path), .text(let text)): self[keyPath: path] = text
        case (.optionalText(let path), .text(let text)): self[keyPath: path] = text
        case (.host(let path), .text(let text)): self[keyPath: path] = Self.unbracketed(text)
        case (.whole(let path), .whole(let number)): self[keyPath: path] = number
        case (.number(let path), .number(let number)): self[keyPath: path] = number
        case (.number(let path), .whole(let number)): self[keyPath: path] = Double(number)
        case (.logLevel, .text(let text)):
            guard let level = Logger.Level(rawValue: text.lowercased()) else {
                let levels = Logger.Level.allCases.map(\.rawValue).joined(separator: ", ")
                throw .invalidValue("log level '\(text)' is not one of \(levels); set it with \(setting.howToSet)")
            }
            logLevel = level
        default:
            throw .invalidValue("\(setting.key) must be \(setting.expected); set it with \(setting.howToSet)")
        }
    }

    /// A JSON value as the config file holds it.
    enum JSONValue: Decodable {
        case null, number(Double), bool(Bool), string(String), other

        init(from decoder: any Decoder) throws {
            let container = try decoder.singleValueContainer()
            if container.decodeNil() { self = .null }
            else if let number = try? container.decode(Double.self) { self = .number(number) }
            else if let bool = try? container.decode(Bool.self) { self = .bool(bool) }
            else if let string = try? container.decode(String.self) { self = .string(string) }
            else { self = .other }
        }

        var kindDescription: String {
            switch self {
            case .null: return "null"
            case .number(let number): return SquelchInfo.plainNumber(number)
            case .bool(let bool): return "\(bool)"
            case .string(let string): return "\"\(string)\""
            case .other: return "an array or object"
            }
        }
    }

    /// The keys of the file's outer object that appear more than once, in order. Foundation's
    /// decoder keeps the first of a repeated key without a word, and no reader here reports them;
    /// the file has been decoded already (valid JSON), so this only walks its tokens: strings (with
    /// their escapes) and nesting, a key being a string at depth 1 followed by a colon.
    static func duplicateTopLevelKeys(in data: Data) -> [String] {
        let bytes = [UInt8](data)
        var seen: Set<String> = [], repeated: [String] = []
        var depth = 0, index = 0
        while index < bytes.count {
            switch bytes[index] {
            case UInt8(ascii: "{"), UInt8(ascii: "["): depth += 1
            case UInt8(ascii: "}"), UInt8(ascii: "]"): depth -= 1
            case UInt8(ascii: "\""):
                let start = index
                index += 1
                while index < bytes.count, bytes[index] != UInt8(ascii: "\"") {
                    index += bytes[index] == UInt8(ascii: "\\") ? 2 : 1
                }
                guard depth == 1, index < bytes.count else { break }
                var next = index + 1
                while next < bytes.count, [UInt8(ascii: " "), UInt8(ascii: "\t"), UInt8(ascii: "\n"), UInt8(ascii: "\r")].contains(bytes[next]) {
                    next += 1
                }
                guard next < bytes.count, bytes[next] == UInt8(ascii: ":"),
                      let key = try? JSONDecoder().decode(String.self, from: Data(bytes[start...index])) else { break }
                if !seen.insert(key).inserted, !repeated.contains(key) { repeated.append(key) }
            default: break
            }
            index += 1
        }
        return repeated
    }

    static func fileOverrides(path: String) throws(ConfigurationError) -> ConfigurationOverrides {
        let data: Data
        var isDirectory: ObjCBool = false
        let exists = FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory)
        guard exists, !isDirectory.boolValue, let read = FileManager.default.contents(atPath: path) else {
            let reason = !exists ? "no such file" : isDirectory.boolValue ? "it is a directory, not a JSON file" : "cannot read it (check its permissions)"
            throw .configFile(path: path, problem: "\(reason); check the path given with --config or \(configFileEnvironment)")
        }
        data = read
        let object: [String: JSONValue]
        do { object = try JSONDecoder().decode([String: JSONValue].self, from: data) } catch {
            let why: String
            if case DecodingError.dataCorrupted(let context) = error, let underlying = context.underlyingError {
                why = "it is not valid JSON (\(underlying.localizedDescription))"
            } else if case DecodingError.typeMismatch = error {
                why = "it must hold one JSON object"
            } else {
                why = "it is not valid JSON"
            }
            throw .configFile(path: path, problem: "\(why); write one JSON object such as {\"port\": 7700, \"logLevel\": \"info\"}")
        }
        if let repeated = duplicateTopLevelKeys(in: data).first {
            throw .configFile(path: path, problem: "\"\(repeated)\" is set more than once; keep one (this reader takes the first, most JSON tools the last, so an override added at the end would be ignored)")
        }
        let settings = self.settings
        var layer = ConfigurationOverrides()
        for (key, value) in object.sorted(by: { $0.key < $1.key }) {
            guard let setting = settings.first(where: { $0.key == key }) else {
                throw .unknownSetting(key: key, file: path, valid: settings.map(\.key))
            }
            func wrongType(_ expected: String) -> ConfigurationError {
                .configFile(path: path, problem: "\"\(key)\" must be \(expected), not \(value.kindDescription); for example \"\(key)\": \(example(setting))")
            }
            if case .null = value { continue }  // null: keep the default
            switch (setting.kind, value) {
            case (.whole, .number(let number)) where number.rounded() == number && abs(number) < 1e15: layer[key] = .whole(Int(number))
            case (.number, .number(let number)): layer[key] = .number(number)
            case (.text, .string(let text)), (.optionalText, .string(let text)), (.host, .string(let text)), (.logLevel, .string(let text)):
                layer[key] = .text(text)
            default:
                throw wrongType(setting.expected)
            }
        }
        return layer
    }

    static func example(_ setting: Setting) -> String {
        switch setting.kind {
        case .text, .optionalText, .host, .logLevel: return "\"\(setting.key == "adminKey" ? "<key>" : setting.defaultDescription)\""
        case .whole, .number: return setting.defaultDescription
        }
    }

    /// The environment's layer. A setting a flag sets (`flags`) is not read from it: the flag wins
    /// anyway, and a bad value it replaces must not stop the start ("--port 7700" with a stale
    /// SQUELCH_PORT=abc exited 78).
    static func environmentOverrides(_ environment: [String: String],
                                     except flags: ConfigurationOverrides = ConfigurationOverrides()) throws(ConfigurationError) -> ConfigurationOverrides {
        var layer = ConfigurationOverrides()
        for setting in settings where flags[setting.key] == nil {
            guard let raw = environment[setting.environment], !raw.isEmpty else { continue }
            // The admin key is taken as it is; anything else without the spaces around it.
            guard let value = setting.value(parsing: setting.key == "adminKey" ? raw : raw.trimmingCharacters(in: .whitespaces)) else {
                throw .invalidValue("\(setting.environment)='\(raw)' is not \(setting.expected); set it to one such as \(setting.defaultDescription), or unset it")
            }
            layer[setting.key] = value
        }
        return layer
    }

    /// The command line's layer: each setting's flag and its value, as `--port 7700` or
    /// `--port=7700`; a value may start with a dash (`--disconnect-grace-seconds -1` is refused
    /// for its range, not taken for a flag). A flag given twice counts the last time.
    public static func flagOverrides(_ arguments: [String]) throws(FlagError) -> ConfigurationOverrides {
        var layer = ConfigurationOverrides()
        var index = 0
        while index < arguments.count {
            let argument = arguments[index]
            let (name, inline) = argument.firstIndex(of: "=").map { (String(argument[..<$0]), String(argument[argument.index(after: $0)...])) }
                ?? (argument, nil)
            guard let setting = setting(flag: name) else { throw FlagError.unknown(argument) }
            var value = inline
            if value == nil {
                index += 1
                guard index < arguments.count else { throw .missingValue(flag: name, valueName: setting.valueName) }
                value = arguments[index]
            }
            guard let text = value, let parsed = setting.value(parsing: text) else {
                throw .invalidValue(value ?? "", flag: name, valueName: setting.valueName, expected: setting.expected)
            }
            layer[setting.key] = parsed
            index += 1
        }
        return layer
    }

    /// A command line `flagOverrides` can't read: a mistake on the command line (exit 64), not in a setting.
    public enum FlagError: Error, Equatable, CustomStringConvertible {
        case unknown(String)
        case missingValue(flag: String, valueName: String)
        case invalidValue(String, flag: String, valueName: String, expected: String)

        public var description: String {
            switch self {
            case .unknown(let argument):
                let name = String(argument.prefix { $0 != "=" })
                let near = SquelchInfo.nearest(to: name, among: ServerConfiguration.settings.compactMap(\.flag), within: 3)
                    .map { " (did you mean \($0)?)" } ?? ""
                return argument.hasPrefix("--")
                    ? "unknown option '\(name)'\(near); 'squelchd serve --help' lists the settings"
                    : "unexpected argument '\(argument)'; settings are given as --flag value ('squelchd serve --help' lists them)"
            case .missingValue(let flag, let valueName):
                return "missing value for '\(flag) <\(valueName)>'"
            case .invalidValue(let value, let flag, let valueName, let expected):
                return "the value '\(value)' is invalid for '\(flag) <\(valueName)>': it must be \(expected)"
            }
        }
    }
}
