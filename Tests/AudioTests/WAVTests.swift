import Foundation
import Testing
@testable import Audio

func temporaryPath(_ name: String) -> String {
    let dir = FileManager.default.temporaryDirectory.appendingPathComponent("squelch-audio-\(UUID().uuidString)")
    try! FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
    return dir.appendingPathComponent(name).path
}

func parse(_ bytes: [UInt8]) throws(AudioError) -> WAVAudio {
    try bytes.withUnsafeBytes { raw in Result { () throws(AudioError) in try WAVAudio.parse(raw) } }.get()
}

/// Builds a WAV file field by field, so a test can break exactly one field.
struct WAVBuilder {
    var riff = "RIFF", wave = "WAVE"
    var riffSize: UInt32? = nil
    var formatTag: UInt16 = 1, channels: UInt16 = 1, rate: UInt32 = 48_000, bits: UInt16 = 16
    var blockAlign: UInt16? = nil, byteRate: UInt32? = nil
    var fmtSize: UInt32 = 16
    var extraChunks: [UInt8] = []
    var dataSize: UInt32? = nil
    var data: [UInt8] = [1, 0, 2, 0, 3, 0, 4, 0]

    func bytes() -> [UInt8] {
        var out: [UInt8] = []
        func u32(_ v: UInt32) { withUnsafeBytes(of: v.littleEndian) { out += $0 } }
        func u16(_ v: UInt16) { withUnsafeBytes(of: v.littleEndian) { out += $0 } }
        let align = blockAlign ?? channels * bits / 8
        var body: [UInt8] = []
        swap(&out, &body)
        out += Array("fmt ".utf8); u32(fmtSize)
        u16(formatTag); u16(channels); u32(rate); u32(byteRate ?? UInt32(align) * rate); u16(align); u16(bits)
        out += [UInt8](repeating: 0, count: max(0, Int(fmtSize) - 16))
        out += extraChunks
        out += Array("data".utf8); u32(dataSize ?? UInt32(data.count)); out += data
        swap(&out, &body)
        out += Array(riff.utf8); u32(riffSize ?? UInt32(4 + body.count)); out += Array(wave.utf8); out += body
        return out
    }
}

@Suite struct WAVTests {
    @Test func pcm16RoundTripIsBitExact() throws {
        var rng = SystemRandomNumberGenerator()
        let samples = (0..<44_100 * 2).map { _ in Int16.random(in: .min ... .max, using: &rng) }
        let audio = WAVAudio(format: WAVFormat(encoding: .pcm16, sampleRate: 44_100, channels: 2), samples: .pcm16(samples))
        let bytes = audio.serialized()
        let parsed = try parse(bytes)
        #expect(parsed == audio)
        #expect(parsed.serialized() == bytes)

        // Through the file system as well.
        let path = temporaryPath("rt16.wav")
        try audio.write(path: path)
        #expect(try Data(contentsOf: URL(fileURLWithPath: path)) == Data(bytes))
        #expect(try WAVAudio.read(path: path) == audio)
    }

    @Test func float32RoundTripIsBitExact() throws {
        var rng = SystemRandomNumberGenerator()
        // Include values a lossy path would change: tiny, negative zero, out of range, NaN payloads aside.
        var samples = (0..<9_000).map { _ in Float.random(in: -1.5...1.5, using: &rng) }
        samples += [0, -0.0, .leastNonzeroMagnitude, 1, -1, 2.5]
        let audio = WAVAudio(format: WAVFormat(encoding: .float32, sampleRate: 22_050, channels: 3), samples: .float32(samples))
        let bytes = audio.serialized()
        let parsed = try parse(bytes)
        guard case .float32(let back) = parsed.samples else { Issue.record("wrong encoding"); return }
        #expect(back.map(\.bitPattern) == samples.map(\.bitPattern))
        #expect(parsed.serialized() == bytes)
    }

    @Test func unknownChunksAndExtensibleFormatAreRead() throws {
        var b = WAVBuilder()
        b.extraChunks = Array("LIST".utf8) + [5, 0, 0, 0] + [1, 2, 3, 4, 5, 0]  // odd size: padded
        #expect(try parse(b.bytes()).samples == .pcm16([1, 2, 3, 4]))

        var ext = WAVBuilder()
        ext.formatTag = 0xFFFE
        ext.fmtSize = 40
        var bytes = ext.bytes()
        // Sub-format GUID starts at fmt offset 24: KSDATAFORMAT_SUBTYPE_PCM begins with 0x0001.
        let fmtStart = 12 + 8
        bytes[fmtStart + 24] = 1
        #expect(try parse(bytes).format == WAVFormat(encoding: .pcm16, sampleRate: 48_000, channels: 1))
    }

    /// A streamed WAV (arecord or ffmpeg into a pipe, or a recorder killed before it finished) keeps
    /// its placeholder sizes: its samples run to the end of the file, as sox reads them. It used to
    /// be refused ("declares 4294967295 bytes") or read as holding no audio.
    @Test func placeholderSizesOfAStreamedFileReadToTheEnd() throws {
        var unfilled = WAVBuilder(); unfilled.riffSize = 0xFFFF_FFFF; unfilled.dataSize = 0xFFFF_FFFF
        #expect(try parse(unfilled.bytes()).samples == .pcm16([1, 2, 3, 4]))
        // arecord writing to a pipe: 0x80000000 bytes of data, a RIFF size to match.
        var arecord = WAVBuilder(); arecord.riffSize = 0x8000_0024; arecord.dataSize = 0x8000_0000
        #expect(try parse(arecord.bytes()).samples == .pcm16([1, 2, 3, 4]))
        var zeroed = WAVBuilder(); zeroed.riffSize = 0; zeroed.dataSize = 0
        #expect(try parse(zeroed.bytes()).samples == .pcm16([1, 2, 3, 4]))
        // A placeholder with a half frame at the end: the whole frames only.
        var odd = WAVBuilder(); odd.dataSize = 0xFFFF_FFFF; odd.data = [1, 0, 2, 0, 3]
        #expect(try parse(odd.bytes()).samples == .pcm16([1, 2]))
        // A finished header (its RIFF size is the file's) with an empty data chunk and a chunk after
        // it: empty, not the next chunk's bytes read as audio.
        var empty = WAVBuilder(); empty.dataSize = 0; empty.data = Array("LIST".utf8) + [2, 0, 0, 0, 7, 7]
        #expect(try parse(empty.bytes()).samples == .pcm16([]))
    }

    @Test func truncatedHeaderIsRejected() throws {
        let error = #expect(throws: AudioError.self) { try parse(Array(WAVBuilder().bytes().prefix(10))) }
        #expect(String(describing: try #require(error)).contains("truncated header"))
        // Cut in the middle of the fmt chunk, with a streaming-style RIFF size so the fmt check is reached.
        var streaming = WAVBuilder(); streaming.riffSize = 0xFFFF_FFFF
        let cut = #expect(throws: AudioError.self) { try parse(Array(streaming.bytes().prefix(30))) }
        #expect(try #require(cut) == .malformedWAV(reason: "the fmt chunk declares 16 bytes but only 10 remain"))
    }

    @Test func wrongChunkSizesAreRejected() throws {
        var fmt = WAVBuilder(); fmt.fmtSize = 12
        #expect(String(describing: try #require(#expect(throws: AudioError.self) { try parse(fmt.bytes()) })).contains("at least 16"))

        var data = WAVBuilder(); data.dataSize = 4_000
        let error = #expect(throws: AudioError.self) { try parse(data.bytes()) }
        #expect(String(describing: try #require(error)).contains("declares 4000 bytes but only 8 remain"))

        var riff = WAVBuilder(); riff.riffSize = 1_000_000
        #expect(String(describing: try #require(#expect(throws: AudioError.self) { try parse(riff.bytes()) })).contains("truncated"))

        var align = WAVBuilder(); align.blockAlign = 3
        #expect(String(describing: try #require(#expect(throws: AudioError.self) { try parse(align.bytes()) })).contains("inconsistent"))
    }

    @Test func zeroChannelsIsRejected() {
        var b = WAVBuilder(); b.channels = 0; b.blockAlign = 0; b.byteRate = 0
        let error = #expect(throws: AudioError.self) { try parse(b.bytes()) }
        #expect(error == .malformedWAV(reason: "the fmt chunk declares zero channels"))
    }

    @Test func hugeDeclaredSizeIsRejectedWithoutAllocating() throws {
        // Over the limit but under the 2 GiB of a streaming placeholder, and not in the file.
        var b = WAVBuilder(); b.dataSize = 0x5000_0000; b.riffSize = 36 + 8
        let error = #expect(throws: AudioError.self) { try parse(b.bytes()) }
        #expect(String(describing: try #require(error)).contains("limit"))
        // A placeholder's size is never allocated: what the file holds is read.
        var placeholder = WAVBuilder(); placeholder.dataSize = 0xFFFF_FFF0; placeholder.riffSize = 36 + 8
        #expect(try parse(placeholder.bytes()).samples == .pcm16([1, 2, 3, 4]))
    }

    @Test func unsupportedFormatsAreNamed() throws {
        var adpcm = WAVBuilder(); adpcm.formatTag = 2; adpcm.bits = 4; adpcm.blockAlign = 1
        let e1 = #expect(throws: AudioError.self) { try parse(adpcm.bytes()) }
        #expect(e1 == .unsupportedWAV(reason: "Microsoft ADPCM with 4 bits per sample; only 16-bit PCM and 32-bit float are read"))

        var pcm24 = WAVBuilder(); pcm24.bits = 24
        let e2 = #expect(throws: AudioError.self) { try parse(pcm24.bytes()) }
        #expect(String(describing: try #require(e2)).contains("integer PCM with 24 bits"))
        #expect(String(describing: try #require(e2)).contains("sox"))

        var notWave = WAVBuilder(); notWave.wave = "AVI "
        #expect(throws: AudioError.self) { try parse(notWave.bytes()) }
    }

    @Test func missingFileErrorNamesThePath() throws {
        let error = #expect(throws: AudioError.self) { try WAVAudio.read(path: "/nonexistent/speech.wav") }
        #expect(String(describing: try #require(error)).contains("/nonexistent/speech.wav"))
        #expect(String(describing: try #require(error)).contains("no such file"))
    }

    @Test func parserErrorsFromFilesNameTheFile() throws {
        let path = temporaryPath("broken.wav")
        try Data(Array(WAVBuilder().bytes().prefix(20))).write(to: URL(fileURLWithPath: path))
        let error = #expect(throws: AudioError.self) { try WAVAudio.read(path: path) }
        #expect(String(describing: try #require(error)).hasPrefix(path))
    }
}
