#if canImport(Glibc)
import Glibc
#endif
import Foundation

/// A Linux input device that has keys or buttons, as sysfs describes it: no permission on the device
/// itself is needed to list it.
public struct InputDeviceInfo: Equatable, Sendable {
    /// The device node, /dev/input/eventN.
    public var path: String
    public var name: String
    /// How many key and button codes it can send: a foot pedal has one to three, a keyboard a hundred.
    public var keyCount: Int
    /// Whether this user may open it (members of the `input` group, usually).
    public var readable: Bool
}

public enum InputDeviceList {
    /// The input devices with keys, in event-number order.
    /// - Parameters:
    ///   - sysfs: the input class directory; tests give a tree of their own (this machine has no input devices).
    ///   - devices: where the nodes are.
    public static func devicesWithKeys(sysfs: String = "/sys/class/input", devices: String = "/dev/input") -> [InputDeviceInfo] {
        var found: [(Int, InputDeviceInfo)] = []
        for entry in directory(sysfs) where entry.hasPrefix("event") {
            guard let number = Int(entry.dropFirst(5)) else { continue }
            let keys = keyCount(capabilities: read("\(sysfs)/\(entry)/device/capabilities/key") ?? "")
            guard keys > 0 else { continue }
            let path = "\(devices)/\(entry)"
            let name = read("\(sysfs)/\(entry)/device/name") ?? entry
            found.append((number, InputDeviceInfo(path: path, name: name, keyCount: keys, readable: access(path, R_OK) == 0)))
        }
        return found.sorted { $0.0 < $1.0 }.map(\.1)
    }

    /// The device's own name for the node at `path` (which may be a /dev/input/by-id link), if it is one.
    public static func name(of path: String, sysfs: String = "/sys/class/input") -> String? {
        guard let resolved = realpath(path, nil) else { return nil }
        defer { free(resolved) }
        let node = String(cString: resolved).split(separator: "/").last.map(String.init) ?? ""
        guard node.hasPrefix("event") else { return nil }
        return read("\(sysfs)/\(node)/device/name")
    }

    /// The bits set in a sysfs capability bitmap: hexadecimal words separated by spaces.
    static func keyCount(capabilities: String) -> Int {
        capabilities.split(separator: " ").reduce(0) { count, word in count + (UInt64(word, radix: 16)?.nonzeroBitCount ?? 0) }
    }

    private static func directory(_ path: String) -> [String] {
        (try? FileManager.default.contentsOfDirectory(atPath: path)) ?? []
    }

    private static func read(_ path: String) -> String? {
        (try? String(contentsOfFile: path, encoding: .utf8))?.trimmingCharacters(in: .whitespacesAndNewlines)
    }
}
