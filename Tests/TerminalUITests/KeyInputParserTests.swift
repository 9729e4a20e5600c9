import SeededRandom
import Testing
import TerminalUI

private func bytes(_ text: String) -> [UInt8] { Array(text.utf8) }
private let esc = "\u{1B}"

/// Feeds `input` in the given chunk sizes (cycled), then flushes.
private func parse(_ input: [UInt8], chunks: [Int] = [Int.max], flush: Bool = true) -> [KeyInputEvent] {
    var parser = KeyInputParser()
    var events: [KeyInputEvent] = []
    var offset = 0
    var chunk = 0
    while offset < input.count {
        let size = max(1, min(chunks[chunk % chunks.count], input.count - offset))
        events += parser.feed(input[offset..<(offset + size)])
        offset += size
        chunk += 1
    }
    if flush { events += parser.flush() }
    return events
}

@Suite("KeyInputParser")
struct KeyInputParserTests {
    @Test("kitty Space press, repeat and release (audio.md §5.2)")
    func kittySpace() {
        #expect(parse(bytes("\(esc)[32u")) == [.key(.space, .press)])
        #expect(parse(bytes("\(esc)[32;1:2u")) == [.key(.space, .repeat)])
        #expect(parse(bytes("\(esc)[32;1:3u")) == [.key(.space, .release)])
        #expect(parse(bytes("\(esc)[32;1:1u")) == [.key(.space, .press)])
        // Shift went down during the hold: still Space, with the modifier.
        #expect(parse(bytes("\(esc)[32;2:3u")) == [.key(.space, .release, modifiers: .shift)])
        // Alternate key codes and associated text are ignored.
        #expect(parse(bytes("\(esc)[97:65;2;65u")) == [.key(.character("A"), .press, modifiers: .shift)])
    }

    @Test("kitty encodings of Escape, Enter, Tab, Backspace, Ctrl-C and functional keys")
    func kittyKeys() {
        #expect(parse(bytes("\(esc)[27u"), flush: false) == [.key(.escape, .press)])
        #expect(parse(bytes("\(esc)[13u\(esc)[9u\(esc)[127u")) == [.key(.enter, .press), .key(.tab, .press), .key(.backspace, .press)])
        #expect(parse(bytes("\(esc)[99;5u")) == [.key(.character("c"), .press, modifiers: .ctrl)])
        #expect(parse(bytes("\(esc)[113;65u")) == [.key(.character("q"), .press, modifiers: .capsLock)])
        #expect(parse(bytes("\(esc)[57441;2u")) == [.key(.code(57441), .press, modifiers: .shift)])
        #expect(Key.code(57441).isModifierOnly)
        #expect(parse(bytes("\(esc)[57376u")) == [.key(.function(13), .press)])
        #expect(parse(bytes("\(esc)[1;1:3A")) == [.key(.up, .release)])
        #expect(parse(bytes("\(esc)[3;1:2~")) == [.key(.delete, .repeat)])
    }

    @Test("probe replies: kitty flags and device attributes")
    func probeReplies() {
        // kitty 0.26.5 answers both; xterm and tmux only the DA.
        #expect(parse(bytes("\(esc)[?0u\(esc)[?62;c")) == [.kittyFlags(0), .deviceAttributes])
        #expect(parse(bytes("\(esc)[?1;2c")) == [.deviceAttributes])
        #expect(parse(bytes("\(esc)[?64;1;2;6;9;15;16;17;18;21;22;28c")) == [.deviceAttributes])
        #expect(parse(bytes("\(esc)[?11u")) == [.kittyFlags(11)])
        // Secondary DA, and our own query echoed back, are not replies.
        #expect(parse(bytes("\(esc)[>1;4000;15c\(esc)[?u")) == [])
    }

    @Test("focus reports")
    func focus() {
        #expect(parse(bytes("\(esc)[I\(esc)[O")) == [.focusIn, .focusOut])
    }

    @Test("legacy bytes")
    func legacy() {
        #expect(parse(bytes(" q\r\t")) == [.key(.space, .press), .key(.character("q"), .press), .key(.enter, .press), .key(.tab, .press)])
        #expect(parse([0x7F, 0x08]) == [.key(.backspace, .press), .key(.backspace, .press)])
        #expect(parse([0x03, 0x1A, 0x00]) == [.key(.character("c"), .press, modifiers: .ctrl),
                                              .key(.character("z"), .press, modifiers: .ctrl),
                                              .key(.space, .press, modifiers: .ctrl)])
        #expect(parse(bytes("é€😀")) == [.key(.character("é"), .press), .key(.character("€"), .press), .key(.character("😀"), .press)])
        // Auto-repeat in a legacy terminal is just more of the same byte.
        #expect(parse(bytes("   ")) == Array(repeating: .key(.space, .press), count: 3))
    }

    @Test("legacy cursor and function keys, CSI and SS3 forms")
    func legacyCursorKeys() {
        #expect(parse(bytes("\(esc)[A\(esc)[B\(esc)[C\(esc)[D")) == [.key(.up, .press), .key(.down, .press), .key(.right, .press), .key(.left, .press)])
        #expect(parse(bytes("\(esc)OA\(esc)OP")) == [.key(.up, .press), .key(.function(1), .press)])
        #expect(parse(bytes("\(esc)[1;5C")) == [.key(.right, .press, modifiers: .ctrl)])
        #expect(parse(bytes("\(esc)[5~\(esc)[15~\(esc)[24~")) == [.key(.pageUp, .press), .key(.function(5), .press), .key(.function(12), .press)])
        #expect(parse(bytes("\(esc)[Z")) == [.key(.tab, .press, modifiers: .shift)])
    }

    @Test("a lone ESC waits for flush; ESC plus a key is Alt")
    func loneEscape() {
        var parser = KeyInputParser()
        #expect(parser.feed([0x1B]) == [])
        #expect(parser.hasPendingInput)
        #expect(parser.flush() == [.key(.escape, .press)])
        #expect(!parser.hasPendingInput)

        #expect(parse(bytes("\(esc)q")) == [.key(.character("q"), .press, modifiers: .alt)])
        #expect(parse(bytes("\(esc)\(esc)")) == [.key(.escape, .press), .key(.escape, .press)])
        #expect(parse(bytes("\(esc)[")) == [.key(.character("["), .press, modifiers: .alt)])
        #expect(parse(bytes("\(esc)O")) == [.key(.character("O"), .press, modifiers: .alt)])
        // Not flushed: the sequence may still be on its way.
        #expect(parse(bytes("\(esc)[32;1:"), flush: false) == [])
    }

    @Test("every split of every reference sequence gives the same events")
    func splitChunks() {
        let stream = bytes("\(esc)[?0u\(esc)[?62;c\(esc)[32u\(esc)[32;1:2u\(esc)[32;1:2u\(esc)[32;1:3u"
            + "\(esc)[?1;2c\(esc)[I\(esc)[O q\(esc)[A\(esc)OBé😀\(esc)[1;5C\(esc)[27u")
        let expected = parse(stream)
        #expect(expected.count == 17)
        for split in 1..<stream.count {
            var parser = KeyInputParser()
            let events = parser.feed(stream[..<split]) + parser.feed(stream[split...]) + parser.flush()
            #expect(events == expected, "split at \(split)")
        }
        #expect(parse(stream, chunks: [1]) == expected)
        #expect(parse(stream, chunks: [2, 3, 5, 7]) == expected)
    }

    @Test("garbage is dropped and parsing recovers")
    func garbage() {
        // Unknown final byte, intermediates, bracketed-paste markers, a cursor position report.
        #expect(parse(bytes("\(esc)[12;34x \(esc)[1 q\(esc)[200~\(esc)[201~\(esc)[5;10R")) == [.key(.space, .press)])
        // A sequence broken off by a new ESC: the broken one is dropped, the new one parsed.
        #expect(parse(bytes("\(esc)[1;\(esc)[32u")) == [.key(.space, .press)])
        // ESC O followed by a new sequence: Alt+O, then the sequence.
        #expect(parse(bytes("\(esc)O\(esc)[A")) == [.key(.character("O"), .press, modifiers: .alt), .key(.up, .press)])
        // A control character inside a sequence aborts it and is itself parsed.
        #expect(parse(bytes("\(esc)[12\r")) == [.key(.enter, .press)])
        // Invalid UTF-8 (stray continuation, overlong, surrogate, truncated) and C1 controls.
        #expect(parse([0x80, 0xC0, 0xAF, 0xED, 0xA0, 0x80, 0xC2, 0x85, 0xE2, 0x82, 0x20]) == [.key(.space, .press)])
        // Out-of-range numbers.
        #expect(parse(bytes("\(esc)[99999999999999999999u\(esc)[32;999u\(esc)[32;1:9u")) == [])
        // An endless parameter string is dropped without buffering it all, however it is split.
        let long = bytes("\(esc)[" + String(repeating: "1;", count: 100) + "u ")
        #expect(parse(long) == [.key(.space, .press)])
        #expect(parse(long, chunks: [1]) == [.key(.space, .press)])
        #expect(parse(long, chunks: [13]) == [.key(.space, .press)])
    }

    @Test("random bytes never trap, and chunking never changes the result")
    func fuzz() {
        var rng = SplitMix64(seed: 0x5157_454C_4348)
        let alphabet: [UInt8] = [0x1B, 0x1B, 0x1B, 0x5B, 0x5B, 0x4F, 0x3F, 0x3B, 0x3A, 0x3C, 0x3E, 0x20, 0x7E, 0x75,
                                 0x63, 0x41, 0x49, 0x31, 0x32, 0x33, 0x39, 0x00, 0x0D, 0x7F, 0x80, 0xC3, 0xA9, 0xE2,
                                 0xF0, 0x9F, 0xFF, 0x71]
        for _ in 0..<2000 {
            let length = Int(rng.next() % 40)
            let input = (0..<length).map { _ in
                rng.next() % 4 == 0 ? UInt8(truncatingIfNeeded: rng.next()) : alphabet[Int(rng.next() % UInt64(alphabet.count))]
            }
            let whole = parse(input)
            let chunks = (0..<4).map { _ in Int(rng.next() % 5) + 1 }
            #expect(parse(input, chunks: chunks) == whole, "input \(input) chunks \(chunks)")
        }
    }
}


