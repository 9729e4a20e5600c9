// libFuzzer target for the audio datagram header: `AudioHeader(parsing:)` must accept exactly the
// datagrams docs/protocol.md §16.4 allows (kind 0x41, known flags, 8 to 8 + maxPayload bytes) and
// reject everything else, and what it accepts must write back to the same 8 bytes. The relay
// rewrites headers in place from what it parsed, so a field read from the wrong byte would reach
// every listener. Built by `make fuzz-build` with Sources/ChannelProtocol/AudioHeader.swift.

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzAudioHeader(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let datagram = UnsafeRawBufferPointer(start: data, count: size)
    // The rule, stated independently of the parser.
    let acceptable = size >= AudioHeader.size && size <= AudioHeader.size + AudioHeader.maxPayload
        && datagram[0] == AudioHeader.kind && datagram[1] & ~0b11 == 0

    guard let header = AudioHeader(parsing: datagram) else {
        precondition(!acceptable, "a valid audio datagram of \(size) bytes was rejected")
        return 0
    }
    precondition(acceptable, "an invalid datagram of \(size) bytes was accepted as \(header)")
    precondition(size >= AudioHeader.size && size - AudioHeader.size <= AudioHeader.maxPayload)

    // Writing the parsed header gives back the input's first 8 bytes …
    var written = [UInt8](repeating: 0xEE, count: AudioHeader.size)
    written.withUnsafeMutableBytes { header.write(to: $0) }
    precondition(written.elementsEqual(datagram[..<AudioHeader.size]), "header \(header) writes back as \(written)")

    // … and so does building the whole datagram around the input's payload, which parses again.
    let rebuilt = header.datagram(payload: datagram[AudioHeader.size...])
    precondition(rebuilt.elementsEqual(datagram), "datagram rebuilt from \(header) differs from the input")
    let reparsed = rebuilt.withUnsafeBytes { AudioHeader(parsing: $0) }
    precondition(reparsed == header, "rebuilt datagram parses as \(String(describing: reparsed)), not \(header)")
    return 0
}
