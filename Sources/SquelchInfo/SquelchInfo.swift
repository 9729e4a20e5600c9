/// Facts about this build of Squelch that every executable reports the same way.
public enum SquelchInfo {
    /// The release version, printed by `--version` of every executable.
    public static let version = "0.1.0"

    /// A number as a setting is written (`7793.5`, `30`, `1e+20`): no thousands separators or other
    /// locale forms, which `formatted()` adds ("7,793.5") and which read as a list in an error.
    public static func plainNumber(_ value: Double) -> String {
        if value.isFinite, value == value.rounded(), abs(value) < 1e15 { return String(Int64(value)) }
        return "\(value)"
    }

    /// Levenshtein distance, for the "did you mean" every executable offers for a mistyped name (a
    /// setting, a command): names of a few dozen characters.
    public static func editDistance(_ a: String, _ b: String) -> Int {
        let a = Array(a.utf8), b = Array(b.utf8)
        var previous = Array(0...b.count)
        for i in 1...max(a.count, 1) where !a.isEmpty {
            var current = [i] + [Int](repeating: 0, count: b.count)
            for j in stride(from: 1, through: b.count, by: 1) {
                current[j] = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1))
            }
            previous = current
        }
        return a.isEmpty ? b.count : previous[b.count]
    }

    /// The candidate `word` most likely meant (the first of the nearest), if it is within `limit`
    /// by `distance`: what a "did you mean" names.
    public static func nearest(to word: String, among candidates: [String], within limit: Int,
                               distance: (String, String) -> Int = editDistance) -> String? {
        var best: (candidate: String, distance: Int)?
        for candidate in candidates {
            let d = distance(word, candidate)
            if d < (best?.distance ?? Int.max) { best = (candidate, d) }
        }
        return best.flatMap { $0.distance <= limit ? $0.candidate : nil }
    }
}
