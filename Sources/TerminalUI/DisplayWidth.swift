/// Terminal column arithmetic for the renderer: how wide text is on screen, cutting it to fit, and making
/// text from the network safe to print.
public enum DisplayWidth {
    /// Columns `text` occupies: 2 for East Asian wide and emoji-presentation characters, 0 for combining
    /// marks and zero-width characters, 1 otherwise. An approximation of `wcwidth` that needs no locale.
    public static func of(_ text: some StringProtocol) -> Int {
        text.reduce(0) { $0 + of($1) }
    }

    /// Columns of one grapheme cluster.
    public static func of(_ character: Character) -> Int {
        let scalars = character.unicodeScalars
        guard let first = scalars.first else { return 0 }
        if scalars.contains(where: { $0.value == 0xFE0F }) { return 2 }   // emoji presentation selector
        return width(of: first)
    }

    /// `text` cut to at most `columns` columns, ending in "…" when something was cut. Never wraps.
    public static func truncate(_ text: String, to columns: Int) -> String {
        guard columns > 0 else { return "" }
        guard of(text) > columns else { return text }
        var result = ""
        var used = 0
        for character in text {
            let w = of(character)
            if used + w > columns - 1 { break }
            result.append(character)
            used += w
        }
        return result + "…"
    }

    /// `text` truncated or padded with spaces to exactly `columns` columns.
    public static func pad(_ text: String, to columns: Int) -> String {
        let cut = truncate(text, to: columns)
        return cut + String(repeating: " ", count: max(0, columns - of(cut)))
    }

    /// Replaces control characters (C0, DEL, C1) with U+FFFD. Names and messages come from the server and
    /// other users; printed raw, an embedded escape sequence could rewrite the user's terminal.
    public static func sanitize(_ text: String) -> String {
        guard text.unicodeScalars.contains(where: isControl) else { return text }
        var scalars = String.UnicodeScalarView()
        for scalar in text.unicodeScalars {
            scalars.append(isControl(scalar) ? "\u{FFFD}" : scalar)
        }
        return String(scalars)
    }

    private static func isControl(_ scalar: Unicode.Scalar) -> Bool {
        scalar.value < 0x20 || (0x7F...0x9F).contains(scalar.value)
    }

    private static func width(of scalar: Unicode.Scalar) -> Int {
        let v = scalar.value
        if v == 0 || isControl(scalar) { return 0 }
        switch scalar.properties.generalCategory {
        case .nonspacingMark, .enclosingMark, .format: return 0
        default: break
        }
        if v == 0x200B { return 0 }
        if scalar.properties.isEmojiPresentation { return 2 }
        switch v {
        case 0x1100...0x115F, 0x231A...0x231B, 0x2329...0x232A, 0x2E80...0x303E, 0x3041...0x33FF,
             0x3400...0x4DBF, 0x4E00...0x9FFF, 0xA000...0xA4CF, 0xA960...0xA97F, 0xAC00...0xD7A3,
             0xF900...0xFAFF, 0xFE10...0xFE19, 0xFE30...0xFE6F, 0xFF00...0xFF60, 0xFFE0...0xFFE6,
             0x1F300...0x1F64F, 0x1F900...0x1F9FF, 0x20000...0x2FFFD, 0x30000...0x3FFFD:
            return 2
        default:
            return 1
        }
    }
}
