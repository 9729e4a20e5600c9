// libFuzzer target for what a listener's datagrams carry: the audio header, then the SFrame header
// of the sealed frame behind it, or a key datagram. Any input must parse or be refused, never trap;
// a parsed SFrame header must lie inside the input, and writing it back and reading that again gives
// the same values; a key datagram that parses writes back to the same bytes.
// Built by `make fuzz-build` with Sources/ChannelProtocol/AudioHeader.swift, MediaKeyDatagram.swift
// (and the Messages.swift and MessageCoding.swift it needs) and Sources/SFrame/SFrameHeader.swift.

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzMediaFrame(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let datagram = UnsafeRawBufferPointer(start: data, count: size)
    _ = AudioHeader(parsing: datagram)
    if let key = MediaKey(datagram: datagram) {
        precondition(key.datagram == Array(datagram) && key.keyID <= MediaKey.maxKeyID)
    }
    let frame = UnsafeRawBufferPointer(rebasing: datagram[min(size, AudioHeader.size)...])
    for bytes in [datagram, frame] {
        guard let (header, length) = SFrameHeader.parse(bytes) else { continue }
        precondition(length >= 1 && length <= bytes.count && length <= SFrameHeader.maxSize)
        var written = [UInt8](repeating: 0, count: SFrameHeader.maxSize)
        let count = written.withUnsafeMutableBytes { header.write(to: $0) }
        precondition(count == header.size && count <= length)
        let again = written.withUnsafeBytes { SFrameHeader.parse(UnsafeRawBufferPointer(rebasing: $0[..<count])) }
        precondition(again?.header == header && again?.size == count)
    }
    return 0
}
