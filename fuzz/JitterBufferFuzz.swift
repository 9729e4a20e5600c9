// libFuzzer target for the receive path: the input is cut into audio datagrams, each parsed with
// `AudioHeader(parsing:)` and inserted into a `JitterBuffer` at a time taken from the input, with
// playout ticks in between. Whatever arrives (forged sequences, bursts that flip back and forth, end
// markers in any order, catch-up floods), the buffer must not crash, must hand out each frame of a
// burst at most once and in increasing order (between resyncs), and must never hand out a payload it
// did not store. The loss meter fed from it must only ever report a percentage.
// Built by `make fuzz-build` with Sources/JitterBuffer and Sources/ChannelProtocol/AudioHeader.swift.

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzJitterBuffer(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    var configuration = JitterBufferConfiguration()
    configuration.maxBacklogFrames = 300  // keeps one input's memory small; the logic is the same
    var buffer = JitterBuffer(configuration: configuration)
    var now: UInt64 = 0
    var offset = 0
    var lastPlayed: (burst: UInt32, sequence: UInt16)?
    var meter = ReceptionLossMeter(tracks: 1, windowFrames: 20, firstWindowFrames: 5)
    while offset + 2 <= size {
        // [length][step][datagram bytes…]
        let length = Int(data[offset]) % 64
        let step = UInt64(data[offset + 1])
        offset += 2
        let end = min(size, offset + length)
        let datagram = UnsafeRawBufferPointer(start: data + offset, count: end - offset)
        offset = end
        now += step * 1_000_000
        if let header = AudioHeader(parsing: datagram) {
            let payload = UnsafeRawBufferPointer(rebasing: datagram[AudioHeader.size...])
            let outcome = buffer.insert(slot: header.slot, burst: header.burst, sequence: header.sequence,
                                        endOfBurst: header.flags.contains(.endOfBurst), catchUp: header.flags.contains(.catchUp),
                                        payload: payload, now: now)
            // A resync may jump by any distance, and 16-bit serial order only holds within half the
            // sequence space, so order is checked between resyncs.
            if outcome == .resynced { lastPlayed = nil }
        }
        if step & 1 == 0 {
            let burst = buffer.current.map { UInt32($0.slot) << 16 | UInt32($0.burst) }
            let decision = buffer.nextFrame(now: now)
            let report = if case .ended(let statistics, _) = decision {
                meter.observe(track: 0, statistics, ended: true)
            } else {
                meter.observe(track: 0, buffer.current)
            }
            if let report { precondition((0...100).contains(report), "loss \(report) %") }
            switch decision {
            case .play(let frame):
                let count = buffer.withPayload(of: frame) { $0.count }
                precondition(count <= configuration.maxPayloadBytes)
                if let burst, let last = lastPlayed, last.burst == burst {
                    precondition(Int16(bitPattern: frame.sequence &- last.sequence) > 0, "frame \(frame.sequence) after \(last.sequence)")
                }
                if let burst { lastPlayed = (burst, frame.sequence) }
            case .ended:
                lastPlayed = nil
            default:
                break
            }
        }
    }
    return 0
}
