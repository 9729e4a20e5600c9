import COpus

/// The libopus this process is linked with (the system's, through pkg-config).
public enum OpusLibrary {
    /// As libopus names itself, e.g. "libopus 1.3.1". Which FEC it codes at which settings changed
    /// between releases, so measurements that depend on it say which one they were taken with.
    public static var version: String { String(cString: opus_get_version_string()) }
}
