// libFuzzer target for the WAV parser: any byte string must either parse or throw AudioError; a crash,
// an out-of-bounds read (ASan) or a leak is a bug. Built by `make fuzz-build` together with
// Sources/Audio/WAV.swift and AudioError.swift.

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzWAVParser(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let bytes = UnsafeRawBufferPointer(start: data, count: size)
    do {
        let audio = try WAVAudio.parse(bytes)
        // What parses must re-serialise to something that parses to the same audio.
        let again = audio.serialized().withUnsafeBytes { raw in Result { () throws(AudioError) in try WAVAudio.parse(raw) } }
        guard case .success(let copy) = again, copy.format == audio.format, copy.samples.count == audio.samples.count else {
            fatalError("re-serialised WAV did not parse back the same")
        }
    } catch {
        _ = error.description  // every error must render its message
    }
    return 0
}
