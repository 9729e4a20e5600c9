/// Errors from audio files and devices. Each message says what went wrong and what to do next.
public enum AudioError: Error, Sendable, Hashable, CustomStringConvertible {
    /// The file is not a WAV file we can read; `reason` says exactly where it breaks.
    case malformedWAV(reason: String)
    /// A well-formed WAV file in an encoding we don't read.
    case unsupportedWAV(reason: String)
    /// The file could not be opened, read or written.
    case file(path: String, reason: String)
    /// An audio device could not be opened or configured.
    case device(name: String, reason: String)
    /// A running device failed and could not be recovered.
    case deviceFailed(name: String, reason: String)
    /// A caller passed a buffer whose size doesn't match the stream's period.
    case wrongBufferSize(got: Int, expected: Int)

    public var description: String {
        switch self {
        case .malformedWAV(let reason):
            return "not a valid WAV file: \(reason). Re-export it as 16-bit PCM or 32-bit float WAV (for example: sox in.wav -b 16 out.wav)"
        case .unsupportedWAV(let reason):
            return "unsupported WAV encoding: \(reason). Convert it to 16-bit PCM (sox in.wav -b 16 -e signed-integer out.wav)"
        case .file(let path, let reason):
            return "\(path): \(reason)"
        case .device(let name, let reason):
            return "audio device '\(name)' could not be opened: \(reason). Run 'walkie devices' to list devices, or use --input-file/--output-file for WAV files"
        case .deviceFailed(let name, let reason):
            return "audio device '\(name)' failed: \(reason) (unplugged, or taken by another program)"
        case .wrongBufferSize(let got, let expected):
            return "audio buffer holds \(got) samples, but the stream's period is \(expected)"
        }
    }
}
