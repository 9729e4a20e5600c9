import COpus

/// Everything that can go wrong in the codec, typed so that callers can tell a corrupt packet
/// (drop it, count it, conceal it) from a programming error (a wrong frame size).
public enum OpusError: Error, Sendable, Hashable, CustomStringConvertible {
    /// A configuration value is out of range. The message names the field and the valid values.
    case invalidConfiguration(String)
    /// PCM handed to the encoder, or a concealment request, is not a whole frame.
    case wrongFrameSize(got: Int, expected: Int, sampleRate: Int, channels: Int)
    /// The packet could not be decoded: garbage, truncated, or not Opus.
    case corruptPacket(length: Int)
    /// The packet is empty. An empty packet is not "loss"; use `decodeMissing` for that.
    case emptyPacket
    /// The output buffer is too small for the decoded frame.
    case bufferTooSmall(needed: Int, available: Int)
    /// Any other libopus failure, with its code and the operation that failed.
    case library(code: Int32, operation: String)

    public var description: String {
        switch self {
        case .invalidConfiguration(let message):
            return "invalid Opus configuration: \(message)"
        case .wrongFrameSize(let got, let expected, let rate, let channels):
            let perChannel = expected / max(channels, 1)
            let ms = Double(perChannel) * 1000 / Double(rate)
            let duration = ms == ms.rounded() ? String(Int(ms)) : String(ms)
            return "wrong Opus frame size: got \(got) samples, expected \(expected) "
                + "(\(duration) ms at \(rate) Hz, \(channels) channel\(channels == 1 ? "" : "s")); "
                + "pass whole frames, or configure a frame duration of 10, 20, 40 or 60 ms"
        case .corruptPacket(let length):
            return "corrupt Opus packet (\(length) bytes): drop it and conceal the gap"
        case .emptyPacket:
            return "empty Opus packet: report a lost frame with decodeMissing instead"
        case .bufferTooSmall(let needed, let available):
            return "output buffer too small for the decoded frame: need \(needed) samples, have \(available)"
        case .library(let code, let operation):
            return "libopus \(operation) failed: \(OpusError.libraryMessage(code)) (\(code))"
        }
    }

    static func libraryMessage(_ code: Int32) -> String {
        guard let text = opus_strerror(code) else { return "unknown error" }
        return String(cString: text)
    }

    /// Maps a negative libopus return code from a decode call.
    static func decodeFailure(_ code: Int32, packetLength: Int) -> OpusError {
        switch code {
        case OPUS_INVALID_PACKET: return .corruptPacket(length: packetLength)
        default: return .library(code: code, operation: "decode")
        }
    }
}
