/// Facts about this build of Squelch that every executable reports the same way.
public enum SquelchInfo {
    /// The release version, printed by `--version` of every executable.
    public static let version = "0.1.0"
}
