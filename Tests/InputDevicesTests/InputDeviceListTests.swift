import Foundation
@testable import InputDevices
import Testing

/// This machine has no input devices (no /dev/input): the sysfs tree here is one the test writes, in
/// the kernel's layout (`eventN/device/name`, `eventN/device/capabilities/key`).
struct InputDeviceListTests {
    @Test func listsTheDevicesWithKeysInEventOrder() throws {
        let root = FileManager.default.temporaryDirectory.appendingPathComponent("input-\(UUID())").path
        defer { try? FileManager.default.removeItem(atPath: root) }
        func device(_ node: String, name: String, keys: String) throws {
            let dir = "\(root)/\(node)/device/capabilities"
            try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
            try "\(name)\n".write(toFile: "\(root)/\(node)/device/name", atomically: true, encoding: .utf8)
            try "\(keys)\n".write(toFile: "\(dir)/key", atomically: true, encoding: .utf8)
        }
        try device("event10", name: "USB Foot Switch", keys: "1 0 0 0 0")
        try device("event2", name: "Power Button", keys: "10000000000000 0")
        try device("event3", name: "Accelerometer", keys: "0")
        try device("event0", name: "AT Translated Set 2 keyboard", keys: "402000000 3803078f800d001 feffffdfffefffff fffffffffffffffe")
        try FileManager.default.createDirectory(atPath: "\(root)/input7", withIntermediateDirectories: true)
        let list = InputDeviceList.devicesWithKeys(sysfs: root, devices: "/dev/input")
        #expect(list.map(\.path) == ["/dev/input/event0", "/dev/input/event2", "/dev/input/event10"])
        #expect(list.map(\.name) == ["AT Translated Set 2 keyboard", "Power Button", "USB Foot Switch"])
        #expect(list.map(\.keyCount)[1...] == [1, 1])
        #expect(list[0].keyCount > 100)
        #expect(list.allSatisfy { !$0.readable }, "no such nodes here")
        #expect(InputDeviceList.keyCount(capabilities: "ff 1") == 9)
        #expect(InputDeviceList.keyCount(capabilities: "") == 0)
    }
}
