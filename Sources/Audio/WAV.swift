// The WAV (RIFF) codec. This file and AudioError.swift are compiled on their own into the libFuzzer
// target (fuzz/WAVParserFuzz.swift), so they depend on nothing else in the module, not even Foundation.

/// How samples are stored in a WAV file.
public enum WAVEncoding: Sendable, Hashable {
    /// Signed 16-bit little-endian integers (WAVE_FORMAT_PCM, 16 bits).
    case pcm16
    /// IEEE 754 32-bit little-endian floats (WAVE_FORMAT_IEEE_FLOAT, 32 bits).
    case float32

    public var bytesPerSample: Int { self == .pcm16 ? 2 : 4 }
}

/// The format of a WAV file's audio.
public struct WAVFormat: Sendable, Hashable {
    public var encoding: WAVEncoding
    public var sampleRate: Int
    public var channels: Int

    public init(encoding: WAVEncoding, sampleRate: Int, channels: Int) {
        self.encoding = encoding
        self.sampleRate = sampleRate
        self.channels = channels
    }

    /// The pipeline's own format: 48 kHz mono 16-bit.
    public static let pipeline = WAVFormat(encoding: .pcm16, sampleRate: 48_000, channels: 1)
}

/// Audio held in a WAV file's own encoding, so that reading and writing back is bit-exact.
public enum WAVSamples: Sendable, Hashable {
    case pcm16([Int16])
    case float32([Float])

    /// Number of interleaved samples (frames × channels).
    public var count: Int {
        switch self {
        case .pcm16(let s): return s.count
        case .float32(let s): return s.count
        }
    }

    /// The samples as floats in -1...1 (16-bit values are divided by 32768).
    public var floats: [Float] {
        switch self {
        case .pcm16(let s): return s.map { Float($0) / 32_768 }
        case .float32(let s): return s
        }
    }
}

/// A decoded WAV file: its format and its interleaved samples.
public struct WAVAudio: Sendable, Hashable {
    public var format: WAVFormat
    public var samples: WAVSamples

    public init(format: WAVFormat, samples: WAVSamples) {
        self.format = format
        self.samples = samples
    }

    /// Frames (samples per channel).
    public var frameCount: Int { format.channels == 0 ? 0 : samples.count / format.channels }

    /// Duration in seconds.
    public var duration: Double { Double(frameCount) / Double(format.sampleRate) }

    // MARK: Parsing

    /// The largest data chunk we accept: 1 GiB is over 3 hours of 48 kHz stereo float.
    public static let maximumDataBytes = 1 << 30

    /// A declared size this large that the file doesn't hold is a streaming writer's placeholder, not
    /// a truncation: arecord into a pipe writes 0x80000000 (its RIFF size 0x80000024), others
    /// 0xFFFFFFFF.
    static let streamingPlaceholder = 0x7FFF_FFFF

    /// Parses a whole WAV file. Unknown chunks (LIST, fact, cue …) are skipped; every size field is
    /// checked against the bytes that are really there before anything is allocated.
    public static func parse(_ bytes: UnsafeRawBufferPointer) throws(AudioError) -> WAVAudio {
        var reader = ByteReader(bytes)
        guard bytes.count >= 12 else {
            throw .malformedWAV(reason: "truncated header: the file has \(bytes.count) bytes, a WAV header needs at least 12")
        }
        let riff = reader.fourCC(), riffSize = reader.u32(), wave = reader.fourCC()
        guard riff == "RIFF" else {
            throw .malformedWAV(reason: riff == "RIFX" || riff == "RF64"
                ? "\(riff) files (big-endian or 64-bit RIFF) are not supported"
                : "it does not start with 'RIFF'")
        }
        guard wave == "WAVE" else { throw .malformedWAV(reason: "the RIFF form type is '\(printable(wave))', not 'WAVE'") }
        // Some writers put a wrong RIFF size when they stream; the chunks themselves are authoritative,
        // but a RIFF size larger than the file means it was cut short.
        guard Int(riffSize) + 8 <= bytes.count || Int(riffSize) >= streamingPlaceholder else {
            throw .malformedWAV(reason: "the RIFF header declares \(Int(riffSize) + 8) bytes but the file has \(bytes.count): it is truncated")
        }

        var format: WAVFormat?
        while reader.remaining >= 8 {
            let id = reader.fourCC()
            let size = Int(reader.u32())
            switch id {
            case "fmt ":
                guard size >= 16 else { throw .malformedWAV(reason: "the fmt chunk is \(size) bytes; it must be at least 16") }
                guard size <= reader.remaining else {
                    throw .malformedWAV(reason: "the fmt chunk declares \(size) bytes but only \(reader.remaining) remain")
                }
                format = try parseFormat(&reader, size: size)
            case "data":
                guard let format else { throw .malformedWAV(reason: "the data chunk comes before the fmt chunk") }
                var size = size
                // Writers that stream (arecord or ffmpeg into a pipe, a recorder killed before it
                // finished) leave the sizes as placeholders: 2 GiB or more that the file doesn't hold,
                // or 0 in a header never rewritten (its RIFF size doesn't match the file). The
                // samples then run to the end of the file, as sox and ffmpeg read them. A 0 in a
                // finished header is an empty chunk.
                let finished = Int(riffSize) + 8 == bytes.count
                if (size >= streamingPlaceholder && size > reader.remaining) || (size == 0 && !finished) { size = reader.remaining }
                guard size <= maximumDataBytes else {
                    throw .malformedWAV(reason: "the data chunk declares \(size) bytes, more than the \(maximumDataBytes)-byte limit")
                }
                guard size <= reader.remaining else {
                    throw .malformedWAV(reason: "the data chunk declares \(size) bytes but only \(reader.remaining) remain: the file is truncated or its size is wrong")
                }
                let frameBytes = format.channels * format.encoding.bytesPerSample
                let usable = size - size % frameBytes  // a trailing partial frame is dropped, as players do
                return WAVAudio(format: format, samples: reader.samples(usable, format.encoding))
            default:
                let padded = size + (size & 1)
                guard padded <= reader.remaining else {
                    throw .malformedWAV(reason: "the '\(printable(id))' chunk declares \(size) bytes but only \(reader.remaining) remain")
                }
                reader.skip(padded)
            }
        }
        throw .malformedWAV(reason: format == nil ? "no fmt chunk" : "no data chunk")
    }

    private static func parseFormat(_ reader: inout ByteReader, size: Int) throws(AudioError) -> WAVFormat {
        var tag = Int(reader.u16())
        let channels = Int(reader.u16())
        let rate = Int(reader.u32())
        let byteRate = Int(reader.u32())
        let blockAlign = Int(reader.u16())
        let bits = Int(reader.u16())
        var consumed = 16
        if tag == 0xFFFE {  // WAVE_FORMAT_EXTENSIBLE: the real format is the first 2 bytes of the sub-format GUID.
            guard size >= 40 else { throw .malformedWAV(reason: "an extensible fmt chunk is \(size) bytes; it must be at least 40") }
            reader.skip(8)  // cbSize, valid bits, channel mask
            tag = Int(reader.u16())
            reader.skip(14)
            consumed = 40
        }
        reader.skip(size - consumed + (size & 1))
        guard channels > 0 else { throw .malformedWAV(reason: "the fmt chunk declares zero channels") }
        guard channels <= 32 else { throw .malformedWAV(reason: "the fmt chunk declares \(channels) channels (at most 32 are accepted)") }
        guard (1_000...768_000).contains(rate) else {
            throw .malformedWAV(reason: "the sample rate \(rate) Hz is outside 1000...768000")
        }
        let encoding: WAVEncoding
        switch (tag, bits) {
        case (1, 16): encoding = .pcm16
        case (3, 32): encoding = .float32
        default:
            throw .unsupportedWAV(reason: "\(formatName(tag)) with \(bits) bits per sample; only 16-bit PCM and 32-bit float are read")
        }
        guard blockAlign == channels * encoding.bytesPerSample, byteRate == blockAlign * rate else {
            throw .malformedWAV(reason: "the fmt chunk is inconsistent: block align \(blockAlign) and byte rate \(byteRate) don't match \(channels) channels at \(rate) Hz")
        }
        return WAVFormat(encoding: encoding, sampleRate: rate, channels: channels)
    }

    private static func formatName(_ tag: Int) -> String {
        switch tag {
        case 1: return "integer PCM"
        case 2: return "Microsoft ADPCM"
        case 3: return "IEEE float"
        case 6: return "A-law"
        case 7: return "µ-law"
        case 0x55: return "MP3"
        default: return "format tag 0x" + String(tag, radix: 16)
        }
    }

    private static func printable(_ id: String) -> String {
        String(id.unicodeScalars.map { $0.value >= 32 && $0.value < 127 ? Character($0) : "?" })
    }

    // MARK: Writing

    /// The most audio bytes a canonical header can describe (its RIFF size is 32 bits).
    public static let maximumWritableDataBytes = Int(UInt32.max) - 36

    /// The canonical 44-byte-header file for this audio.
    public func serialized() -> [UInt8] {
        let dataBytes = samples.count * format.encoding.bytesPerSample
        var out = WAVAudio.header(format: format, dataBytes: dataBytes)
        out.reserveCapacity(out.count + dataBytes)
        switch samples {
        case .pcm16(let s):
            for v in s { let u = UInt16(bitPattern: v); out.append(UInt8(u & 0xFF)); out.append(UInt8(u >> 8)) }
        case .float32(let s):
            for v in s { let u = v.bitPattern; for shift in stride(from: 0, to: 32, by: 8) { out.append(UInt8((u >> UInt32(shift)) & 0xFF)) } }
        }
        return out
    }

    /// A canonical header (RIFF, 16-byte fmt, data) for `dataBytes` of audio. Streaming writers emit it
    /// with a size of 0 first and rewrite it when they finish.
    public static func header(format: WAVFormat, dataBytes: Int) -> [UInt8] {
        precondition((1...65_535).contains(format.channels), "a WAV file holds 1 to 65535 channels")
        precondition(dataBytes >= 0 && dataBytes <= maximumWritableDataBytes, "a WAV data chunk holds at most 4 GiB")
        var h: [UInt8] = []
        h.reserveCapacity(44)
        func u32(_ v: Int) { for shift in [0, 8, 16, 24] { h.append(UInt8((UInt32(truncatingIfNeeded: v) >> UInt32(shift)) & 0xFF)) } }
        func u16(_ v: Int) { h.append(UInt8(v & 0xFF)); h.append(UInt8((v >> 8) & 0xFF)) }
        let blockAlign = format.channels * format.encoding.bytesPerSample
        h += Array("RIFF".utf8); u32(36 + dataBytes); h += Array("WAVE".utf8)
        h += Array("fmt ".utf8); u32(16)
        u16(format.encoding == .pcm16 ? 1 : 3); u16(format.channels); u32(format.sampleRate)
        u32(format.sampleRate * blockAlign); u16(blockAlign); u16(format.encoding.bytesPerSample * 8)
        h += Array("data".utf8); u32(dataBytes)
        return h
    }
}

/// A bounds-checked little-endian reader. Callers check `remaining` before each read.
private struct ByteReader {
    let bytes: UnsafeRawBufferPointer
    var offset = 0

    init(_ bytes: UnsafeRawBufferPointer) { self.bytes = bytes }

    var remaining: Int { bytes.count - offset }

    mutating func skip(_ n: Int) { offset = min(bytes.count, offset + n) }

    mutating func u16() -> UInt16 {
        guard remaining >= 2 else { offset = bytes.count; return 0 }
        defer { offset += 2 }
        return UInt16(bytes[offset]) | UInt16(bytes[offset + 1]) << 8
    }

    mutating func u32() -> UInt32 {
        guard remaining >= 4 else { offset = bytes.count; return 0 }
        defer { offset += 4 }
        return UInt32(bytes[offset]) | UInt32(bytes[offset + 1]) << 8 | UInt32(bytes[offset + 2]) << 16 | UInt32(bytes[offset + 3]) << 24
    }

    mutating func fourCC() -> String {
        let n = min(4, remaining)
        defer { offset += n }
        return String(decoding: bytes[offset..<offset + n], as: UTF8.self)
    }

    mutating func samples(_ byteCount: Int, _ encoding: WAVEncoding) -> WAVSamples {
        let start = offset
        offset += byteCount
        switch encoding {
        case .pcm16:
            return .pcm16((0..<byteCount / 2).map { i in
                Int16(bitPattern: UInt16(bytes[start + 2 * i]) | UInt16(bytes[start + 2 * i + 1]) << 8)
            })
        case .float32:
            return .float32((0..<byteCount / 4).map { i in
                let b = start + 4 * i
                return Float(bitPattern: UInt32(bytes[b]) | UInt32(bytes[b + 1]) << 8 | UInt32(bytes[b + 2]) << 16 | UInt32(bytes[b + 3]) << 24)
            })
        }
    }
}
