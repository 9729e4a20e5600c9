import Foundation

extension WAVAudio {
    /// Reads and parses a WAV file. Files over the data limit are refused before they are read.
    public static func read(path: String) throws(AudioError) -> WAVAudio {
        var isDirectory: ObjCBool = false
        if FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory), isDirectory.boolValue {
            throw .file(path: path, reason: "it is a directory; give a WAV file")
        }
        guard let handle = FileHandle(forReadingAtPath: path) else {
            throw .file(path: path, reason: "cannot open it (\(FileManager.default.fileExists(atPath: path) ? "permission denied" : "no such file")); check the path")
        }
        defer { try? handle.close() }
        // Read at most one byte past the limit: a FIFO or /dev/zero must not fill memory.
        let limit = maximumDataBytes + 1 << 20
        let data: Data
        do { data = try handle.read(upToCount: limit + 1) ?? Data() } catch {
            throw .file(path: path, reason: "cannot read it: \(error.localizedDescription)")
        }
        guard data.count <= limit else {
            throw .file(path: path, reason: "the file is larger than the \(limit)-byte limit; split it")
        }
        let parsed = data.withUnsafeBytes { raw in Result { () throws(AudioError) in try parse(raw) } }
        switch parsed {
        case .success(let audio): return audio
        // Name the file in parser errors, so the user knows which input was bad.
        case .failure(let error): throw .file(path: path, reason: error.description)
        }
    }

    /// Writes the audio as a canonical WAV file, atomically (a crash never leaves half a file).
    public func write(path: String) throws(AudioError) {
        do { try Data(serialized()).write(to: URL(fileURLWithPath: path), options: .atomic) } catch {
            throw .file(path: path, reason: "cannot write it: \(error.localizedDescription)")
        }
    }
}
