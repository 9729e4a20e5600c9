import Foundation

// libFuzzer target for the control-message codec: any bytes off the control stream must decode to a
// message or throw MessageError, never trap. A message that decodes is an oracle for the codec: what
// the other side would send for it (`encode`) must decode to the same message and re-encode to the
// same bytes, or a client and the server could read one message two ways.
// Built by `make fuzz-build` with Sources/ChannelProtocol/Messages.swift, MessageCoding.swift and
// AudioHeader.swift (Foundation's JSONDecoder is the parser under test).

private let codec = MessageCodec()

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzControlMessage(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let bytes = Array(UnsafeBufferPointer(start: data, count: size))

    // The server reads what clients send …
    do {
        let message = try codec.decodeClientMessage(bytes)
        let encoded = codec.encode(message)
        precondition(!encoded.isEmpty, "client message \(message) did not encode")
        let again: ClientMessage
        do { again = try codec.decodeClientMessage(encoded) } catch {
            fatalError("client message \(message) re-encoded as \(String(decoding: encoded, as: UTF8.self)) does not decode: \(error)")
        }
        precondition(again == message, "client message \(message) came back as \(again)")
        precondition(codec.encode(again) == encoded, "client message \(message) encodes two ways")
    } catch {
        _ = error.description  // every error must render its message
    }

    // … and a client reads what the server sends.
    do {
        let message = try codec.decodeServerMessage(bytes)
        let encoded = codec.encode(message)
        precondition(!encoded.isEmpty, "server message \(message) did not encode")
        let again: ServerMessage
        do { again = try codec.decodeServerMessage(encoded) } catch {
            fatalError("server message \(message) re-encoded as \(String(decoding: encoded, as: UTF8.self)) does not decode: \(error)")
        }
        precondition(again == message, "server message \(message) came back as \(again)")
        precondition(codec.encode(again) == encoded, "server message \(message) encodes two ways")
    } catch {
        _ = error.description
    }
    return 0
}
