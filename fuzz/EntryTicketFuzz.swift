// libFuzzer target for the plaintext of an entry ticket (docs/protocol.md §7.8), which a cluster node
// reads from a client's ClientHello once the ticket's AES-GCM opens. `EntryTicketContents(parsing:)`
// must accept exactly the layout stated again below and nothing else, and what it accepts must encode
// back to the input. Built by `make fuzz-build` with Sources/Wire/EntryTicketContents.swift.

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzEntryTicket(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let bytes = Array(UnsafeBufferPointer(start: data, count: size))
    // The rule, stated independently of the parser: version 1, 8 bytes of expiry, a 32-byte key, a
    // 17-byte host, an audience of at most 64 bytes that the input holds whole; the payload is the rest.
    let fixed = 1 + 8 + 32 + 17 + 1
    let acceptable = size >= fixed && bytes[0] == 1 && bytes[fixed - 1] <= 64 && size >= fixed + Int(bytes[fixed - 1])

    guard let contents = EntryTicketContents(parsing: bytes) else {
        precondition(!acceptable, "a valid ticket of \(size) bytes was rejected")
        return 0
    }
    precondition(acceptable, "an invalid ticket of \(size) bytes was accepted as \(contents)")
    precondition(contents.key.count == 32 && contents.host.count == 17 && contents.audience.count == Int(bytes[fixed - 1]))
    let encoded = contents.encoded()
    precondition(encoded == bytes, "\(contents) encodes as \(String(describing: encoded)), not the input")
    return 0
}
