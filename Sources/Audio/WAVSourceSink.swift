import Foundation

/// Plays a WAV file as if it were a microphone: converted to 48 kHz mono, delivered in 10 ms periods
/// on the pacer's clock. The last period is padded with silence.
public final class WAVFileSource: AudioSource {
    private let samples: [Int16]
    private let pacer: any AudioPacer
    private var period = 0

    /// The file's own format, before conversion.
    public let fileFormat: WAVFormat

    public init(path: String, pacer: any AudioPacer, resampler: Resampler = Resampler()) throws(AudioError) {
        let audio = try WAVAudio.read(path: path)
        self.fileFormat = audio.format
        self.samples = audio.pipelineSamples(resampler: resampler)
        self.pacer = pacer
    }

    /// A source over samples already in pipeline format (48 kHz mono).
    public init(pipelineSamples: [Int16], pacer: any AudioPacer) {
        self.samples = pipelineSamples
        self.pacer = pacer
        self.fileFormat = .pipeline
    }

    /// Number of periods the source will deliver.
    public var periodCount: Int { (samples.count + PipelineAudio.periodFrames - 1) / PipelineAudio.periodFrames }

    public func read(into buffer: UnsafeMutableBufferPointer<Int16>) throws(AudioError) -> UInt64? {
        let n = PipelineAudio.periodFrames
        guard buffer.count == n else { throw .wrongBufferSize(got: buffer.count, expected: n) }
        let start = period * n
        guard start < samples.count else { return nil }
        let end = min(start + n, samples.count)
        samples.withUnsafeBufferPointer { s in
            for i in 0..<(end - start) { buffer[i] = s[start + i] }
        }
        for i in (end - start)..<n { buffer[i] = 0 }
        let timestamp = pacer.waitForPeriod(period)
        period += 1
        return timestamp
    }

    public func close() {}
}

/// Records 48 kHz mono audio to a WAV file as if it were a speaker: each period is written when its
/// slot on the pacer's clock comes, so the file's timeline is the playback timeline. Samples stream to
/// disk; the header's sizes are filled in by `finish()`.
public final class WAVFileSink: AudioSink {
    private let handle: FileHandle
    private let path: String
    private let pacer: any AudioPacer
    private var period = 0
    private var dataBytes = 0
    private var scratch = [UInt8](repeating: 0, count: PipelineAudio.periodFrames * 2)
    private var finished = false

    /// When the first sample was due, on the monotonic clock: pairs this file with a capture timeline.
    public var origin: UInt64 { pacer.origin }

    /// Opens `path` for writing, truncating a file already there: written through, as a shell's `>`
    /// would (`FileManager.createFile` writes a new file and renames it over the path, which replaced
    /// a symbolic link, or a device node, with a regular file). Only a regular file (or a new one)
    /// will do: the header's sizes are rewritten at the start as the file grows.
    public init(path: String, pacer: any AudioPacer) throws(AudioError) {
        var status = stat()
        if stat(path, &status) == 0, status.st_mode & S_IFMT != S_IFREG {
            throw .file(path: path, reason: "is not a regular file (a pipe, a device or a directory); a WAV recording needs a file, since its sizes are written at its start as it grows")
        }
        let descriptor = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o644)
        guard descriptor >= 0 else {
            throw .file(path: path, reason: "cannot create it (\(String(cString: strerror(errno)))); check that the directory exists and is writable")
        }
        let handle = FileHandle(fileDescriptor: descriptor, closeOnDealloc: true)
        do { try handle.write(contentsOf: WAVAudio.header(format: .pipeline, dataBytes: 0)) } catch {
            throw .file(path: path, reason: "write failed: \(error.localizedDescription)")
        }
        self.handle = handle
        self.path = path
        self.pacer = pacer
    }

    @discardableResult
    public func write(_ samples: UnsafeBufferPointer<Int16>) throws(AudioError) -> UInt64 {
        guard samples.count == PipelineAudio.periodFrames else {
            throw .wrongBufferSize(got: samples.count, expected: PipelineAudio.periodFrames)
        }
        guard dataBytes + scratch.count <= WAVAudio.maximumWritableDataBytes else {
            throw .file(path: path, reason: "the recording reached the 4 GiB limit of a WAV file; start a new file")
        }
        let timestamp = pacer.waitForPeriod(period)
        period += 1
        for (i, v) in samples.enumerated() {
            let u = UInt16(bitPattern: v)
            scratch[2 * i] = UInt8(u & 0xFF)
            scratch[2 * i + 1] = UInt8(u >> 8)
        }
        do { try handle.write(contentsOf: scratch) } catch {
            throw .file(path: path, reason: "write failed: \(error.localizedDescription)")
        }
        dataBytes += scratch.count
        if period % Self.headerRefreshPeriods == 0 { refreshHeader() }
        return timestamp
    }

    /// How often the header's sizes are brought up to date while recording: each second.
    static let headerRefreshPeriods = 50

    /// Writes the header's sizes for what is written so far, in place (`pwrite`, so that the next
    /// period still goes at the end). A recorder killed with SIGKILL never reaches `finish()`;
    /// without this its file would say it holds no audio, and players show it empty. With it, at
    /// most the last second is outside the sizes. Data first, sizes after: the sizes never count
    /// bytes the process has not written. (Nothing is synced, so after a power cut the disk may hold
    /// either in any order; syncing every second would cost a recorder on a slow card its timing.)
    /// A failure here is left for `finish()`, which writes the same bytes and says why.
    private func refreshHeader() {
        let header = WAVAudio.header(format: .pipeline, dataBytes: dataBytes)
        _ = header.withUnsafeBytes { pwrite(handle.fileDescriptor, $0.baseAddress, $0.count, 0) }
    }

    public func finish() throws(AudioError) {
        guard !finished else { return }
        finished = true
        do {
            try handle.seek(toOffset: 0)
            try handle.write(contentsOf: WAVAudio.header(format: .pipeline, dataBytes: dataBytes))
            try handle.synchronize()
            try handle.close()
        } catch {
            throw .file(path: path, reason: "cannot complete the header: \(error.localizedDescription)")
        }
    }

    deinit { try? finish() }
}
