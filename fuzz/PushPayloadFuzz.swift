// libFuzzer target for push bodies as the device reads them: `PushValue.payload(from:)` takes whatever
// APNs (or a hostile push transport) delivers and must return a JSON object's values or nil, never
// crash; what it returns must survive a trip through JSON unchanged. Built by `make fuzz-build` with
// Sources/PTTClient/PushValue.swift.

import Foundation

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzPushPayload(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let body = Data(bytes: data, count: size)
    guard let payload = PushValue.payload(from: body) else { return 0 }
    let encoded = try! JSONEncoder().encode(PushValue.object(payload))
    let again = PushValue.payload(from: encoded)
    precondition(again == payload, "the payload changed on a round trip")
    _ = payload["activeSpeaker"]?.stringValue
    _ = payload.isServiceUpdatePayload
    return 0
}
