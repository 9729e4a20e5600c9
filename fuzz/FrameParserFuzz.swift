// libFuzzer target for the frame parser: any payload must parse into frames or throw WireParseError.
// Built by `make fuzz-build` with Sources/Wire/WireBytes.swift and Frames.swift.

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzFrameParser(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let payload = UnsafeRawBufferPointer(start: data, count: size)
    var parser = FrameParser(payload: payload)
    var frames = 0
    do {
        while let frame = try parser.next() {
            frames += 1
            // Every range a frame hands out must lie inside the payload.
            switch frame {
            case .crypto(_, let r), .control(_, let r), .newToken(let r), .datagram(let r), .connectionClose(_, let r), .applicationClose(_, let r),
                 .newConnectionID(_, _, _, let r):
                precondition(r.lowerBound >= 0 && r.upperBound <= size)
            case .ack(let ack):
                var previous = UInt64.max
                for range in ack.ranges(in: payload) {
                    precondition(range.upperBound < previous)
                    previous = range.lowerBound
                }
            default: break
            }
        }
    } catch {
        _ = error.description
    }
    return 0
}
