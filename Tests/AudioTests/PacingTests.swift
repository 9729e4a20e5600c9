import Foundation
import Testing
@testable import Audio

@Suite struct PacingTests {
    @Test func realTimePacingKeepsOrderAndTotalDuration() throws {
        let samples = [Int16](repeating: 100, count: 48_000)  // 1 s
        let source = WAVFileSource(pipelineSamples: samples, pacer: RealTimePacer())
        var buffer = [Int16](repeating: 0, count: PipelineAudio.periodFrames)
        var stamps: [UInt64] = []
        let start = monotonicNanoseconds()
        while let t = try buffer.withUnsafeMutableBufferPointer({ try source.read(into: $0) }) {
            // Each read returns no earlier than its period's deadline.
            #expect(monotonicNanoseconds() >= t)
            stamps.append(t)
        }
        let elapsed = Double(monotonicNanoseconds() - start) / 1e9
        #expect(stamps.count == 100)
        #expect(zip(stamps, stamps.dropFirst()).allSatisfy { $0 < $1 })
        #expect(zip(stamps, stamps.dropFirst()).allSatisfy { $1 - $0 == 10_000_000 })
        // Generous: the machine may be busy, but the last period is due at 0.99 s.
        #expect(elapsed >= 0.98 && elapsed < 2.0, "took \(elapsed) s")
    }

    @Test func virtualPacingDoesNotWait() throws {
        let source = WAVFileSource(pipelineSamples: [Int16](repeating: 1, count: 48_000 * 60), pacer: VirtualPacer(origin: 5))
        var buffer = [Int16](repeating: 0, count: PipelineAudio.periodFrames)
        var last: UInt64 = 0, count = 0
        let start = monotonicNanoseconds()
        while let t = try buffer.withUnsafeMutableBufferPointer({ try source.read(into: $0) }) { last = t; count += 1 }
        #expect(count == 6_000)
        #expect(last == 5 + 5_999 * 10_000_000)
        // A minute of audio is not paced in real time: it takes less than its own duration.
        #expect(monotonicNanoseconds() - start < 60_000_000_000)
    }

    @Test func wavSinkRecordsWhatItPlays() throws {
        let path = temporaryPath("sink.wav")
        let sink = try WAVFileSink(path: path, pacer: VirtualPacer())
        let expected: [Int16] = (0..<4_800).map { Int16(truncatingIfNeeded: $0 * 13) }
        for p in 0..<10 {
            _ = try expected[p * 480..<(p + 1) * 480].withUnsafeBufferPointer { try sink.write($0) }
        }
        try sink.finish()
        let audio = try WAVAudio.read(path: path)
        #expect(audio.format == .pipeline)
        #expect(audio.samples == .pcm16(expected))
    }

    /// A recorder that never reaches `finish()` (SIGKILL, power lost) leaves a file whose header counts
    /// every whole second written, rather than one that says it holds nothing.
    @Test func anUnfinishedRecordingKeepsItsWholeSeconds() throws {
        let path = temporaryPath("unfinished.wav")
        let sink = try WAVFileSink(path: path, pacer: VirtualPacer())
        let expected: [Int16] = (0..<(125 * 480)).map { Int16(truncatingIfNeeded: $0 * 7) }
        for p in 0..<125 {
            _ = try expected[p * 480..<(p + 1) * 480].withUnsafeBufferPointer { try sink.write($0) }
        }
        // Read while the sink is still open, as a file left by a killed recorder is.
        let audio = try WAVAudio.read(path: path)
        #expect(audio.samples == .pcm16(Array(expected[..<(100 * 480)])), "the header counts the first two seconds")
        try sink.finish()
        #expect(try WAVAudio.read(path: path).samples == .pcm16(expected))
    }

    /// Written through, as a shell's `>` would: a symbolic link stays a link (and its target gets the
    /// audio), and a pipe or a device is refused up front rather than replaced by a regular file.
    @Test func wavSinkWritesThroughALinkAndRefusesPipesAndDevices() throws {
        let target = temporaryPath("target.wav"), link = temporaryPath("link.wav")
        try FileManager.default.createSymbolicLink(atPath: link, withDestinationPath: target)
        defer { try? FileManager.default.removeItem(atPath: link) }
        let sink = try WAVFileSink(path: link, pacer: VirtualPacer())
        let samples = [Int16](repeating: 99, count: 480)
        _ = try samples.withUnsafeBufferPointer { try sink.write($0) }
        try sink.finish()
        #expect(try FileManager.default.destinationOfSymbolicLink(atPath: link) == target, "the link is still a link")
        #expect(try WAVAudio.read(path: target).samples == .pcm16(samples))

        let fifo = temporaryPath("fifo.wav")
        #expect(mkfifo(fifo, 0o600) == 0)
        defer { try? FileManager.default.removeItem(atPath: fifo) }
        for path in [fifo, "/dev/null"] {
            #expect(throws: AudioError.self, "\(path)") { _ = try WAVFileSink(path: path, pacer: VirtualPacer()) }
            do { _ = try WAVFileSink(path: path, pacer: VirtualPacer()) } catch {
                #expect("\(error)".contains("not a regular file"), "\(error)")
            }
        }
        var status = stat()
        #expect(stat("/dev/null", &status) == 0 && status.st_mode & S_IFMT == S_IFCHR, "/dev/null is still a device")
    }

    @Test func lastPeriodIsPaddedWithSilence() throws {
        let source = WAVFileSource(pipelineSamples: [Int16](repeating: 7, count: 500), pacer: VirtualPacer())
        var buffer = [Int16](repeating: -1, count: 480)
        _ = try buffer.withUnsafeMutableBufferPointer { try source.read(into: $0) }
        #expect(try buffer.withUnsafeMutableBufferPointer { try source.read(into: $0) } != nil)
        #expect(buffer.prefix(20).allSatisfy { $0 == 7 } && buffer.dropFirst(20).allSatisfy { $0 == 0 })
        #expect(try buffer.withUnsafeMutableBufferPointer { try source.read(into: $0) } == nil)
    }

    @Test func wrongBufferSizeIsRejected() {
        let source = WAVFileSource(pipelineSamples: [1, 2, 3], pacer: VirtualPacer())
        var buffer = [Int16](repeating: 0, count: 100)
        #expect(throws: AudioError.wrongBufferSize(got: 100, expected: 480)) {
            try buffer.withUnsafeMutableBufferPointer { try source.read(into: $0) }
        }
    }
}
