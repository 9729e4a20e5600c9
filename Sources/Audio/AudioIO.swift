/// The pipeline's audio format everywhere between devices and the codec: 48 kHz, mono, signed 16-bit.
public enum PipelineAudio {
    public static let sampleRate = 48_000
    /// Samples in one 10 ms period, the unit every source and sink moves.
    public static let periodFrames = 480
}

/// Where audio comes from: a microphone or a file. Sources block until the next period is due, so
/// they run on a dedicated capture thread, as ALSA's blocking reads want.
public protocol AudioSource: AnyObject {
    /// Fills `buffer` (exactly `PipelineAudio.periodFrames` samples) and returns the monotonic time in
    /// nanoseconds at which its first sample was captured, or nil at the end of the stream.
    func read(into buffer: UnsafeMutableBufferPointer<Int16>) throws(AudioError) -> UInt64?
    /// Stops the source and releases its device or file.
    func close()
}

/// Where audio goes: a speaker or a file. Sinks block while their queue is full.
public protocol AudioSink: AnyObject {
    /// Queues `samples` (exactly `PipelineAudio.periodFrames`) for playback and returns the monotonic
    /// time in nanoseconds at which the first of them plays.
    @discardableResult
    func write(_ samples: UnsafeBufferPointer<Int16>) throws(AudioError) -> UInt64
    /// Plays out what is queued, then releases the device or completes the file.
    func finish() throws(AudioError)
}
