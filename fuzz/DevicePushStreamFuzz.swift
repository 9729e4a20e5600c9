// libFuzzer target for a device push stream as the device reads it: the bytes a server (or whoever
// answers in its place) sends, cut into lines by `NDJSONLineSplitter` at chunk sizes the input
// chooses, each line decoded as `DevicePushTransport` does (the confirmation, then deliveries, whose
// bodies go to `PushValue.payload`). Nothing may crash, and the lines must not depend on how the
// bytes were split. Built by `make fuzz-build` with Sources/PushStream/NDJSONLineSplitter.swift,
// Sources/ChannelProtocol/DevicePushProtocol.swift and Sources/PTTClient/PushValue.swift.

import Foundation

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzDevicePushStream(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    guard size > 0 else { return 0 }
    let chunk = Int(data[0] % 17) + 1
    let bytes = Array(UnsafeBufferPointer(start: data + 1, count: size - 1))
    var whole = NDJSONLineSplitter()
    let expected = whole.append(bytes)
    var split = NDJSONLineSplitter()
    var lines: [[UInt8]] = []
    for start in stride(from: 0, to: bytes.count, by: chunk) {
        lines += split.append(bytes[start ..< min(start + chunk, bytes.count)])
    }
    precondition(lines == expected, "the lines depend on how the stream was split")
    precondition(split.pendingCount == whole.pendingCount)
    let decoder = DevicePushProtocol.decoder()
    for line in lines where !line.isEmpty {
        _ = try? decoder.decode(DevicePushSubscribed.self, from: Data(line))
        if let delivery = try? decoder.decode(DevicePushDelivery.self, from: Data(line)) {
            _ = PushValue.payload(from: Data(delivery.body.utf8))
        }
    }
    return 0
}
