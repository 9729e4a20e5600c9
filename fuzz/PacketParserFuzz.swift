// libFuzzer target for packet headers: any datagram must parse (coalesced packets included) or throw
// WireParseError, and every offset handed out must lie inside the datagram.
// Built by `make fuzz-build` with Sources/Wire/WireBytes.swift, Frames.swift, PacketHeader.swift and
// MediaEnvelope.swift.

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzPacketParser(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let datagram = UnsafeRawBufferPointer(start: data, count: size)
    _ = PacketHeader.destination(of: datagram)
    var offset = 0
    while offset < size {
        guard let header = try? PacketHeader.parse(datagram, at: offset) else { break }
        switch header {
        case .long(_, _, _, _, let token, let pnOffset, let end):
            precondition(token.lowerBound >= offset && token.upperBound <= pnOffset)
            precondition(pnOffset < end && end <= size && end - pnOffset >= 20)
            offset = end
        case .short(_, let pnOffset):
            precondition(pnOffset + 20 <= size)
            offset = size
        case .retry(_, _, _, let token, let tag):
            precondition(token.upperBound == tag.lowerBound && tag.upperBound == size && tag.count == 16)
            offset = size
        case .versionNegotiation(_, _, let versions):
            precondition(versions.upperBound == size && versions.count % 4 == 0)
            offset = size
        case .unsupportedVersion:
            offset = size
        }
    }
    // An envelope's media lies inside it, behind its 9-byte header.
    if let (_, media) = MediaEnvelope.parse(datagram) {
        precondition(media.lowerBound == MediaEnvelope.headerSize && media.upperBound == size && !media.isEmpty)
    }
    // Packet-number recovery never traps, whatever the inputs.
    if size >= 9 {
        var largest: UInt64 = 0
        for i in 0..<8 { largest = largest << 8 | UInt64(datagram[i]) }
        let length = Int(datagram[8] & 3) + 1
        _ = PacketNumber.decode(truncated: largest & ((1 << UInt64(8 * length)) - 1), length: length, largest: largest & ((1 << 62) - 1))
    }
    return 0
}
