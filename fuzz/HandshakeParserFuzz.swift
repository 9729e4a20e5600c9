// libFuzzer target for handshake messages and transport parameters: any CRYPTO stream content must
// decode or throw WireParseError; a decoded message must re-encode to the same bytes.
// Built by `make fuzz-build` with Sources/Wire/WireBytes.swift, Frames.swift and HandshakeMessages.swift.

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzHandshakeParser(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let input = UnsafeRawBufferPointer(start: data, count: size)
    var reader = WireReader(input)
    while !reader.isAtEnd {
        let start = reader.offset
        guard let message = try? HandshakeMessage.decode(&reader) else { break }
        // Round trip: what we parse is exactly what we would send, except transport parameters,
        // whose unknown IDs are skipped and whose integers may have been sent in a longer form.
        if case .encryptedExtensions = message {} else if case .clientHello = message {} else {
            precondition(message.encoded() == Array(input[start..<reader.offset]), "\(message) does not round-trip")
        }
    }
    var parameters = WireReader(input)
    _ = try? TransportParameters.decode(&parameters, end: size)
    return 0
}
