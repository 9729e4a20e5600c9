import Testing
import TerminalUI

@Suite("KeyBindings and KeyboardProbe")
struct KeyCommandTests {
    let bindings = KeyBindings()

    @Test("the PTT key maps with every event type and any modifiers")
    func pushToTalk() {
        #expect(bindings.command(for: .key(.space, .press)) == .pushToTalk(.press))
        #expect(bindings.command(for: .key(.space, .repeat)) == .pushToTalk(.repeat))
        #expect(bindings.command(for: .key(.space, .release, modifiers: .shift)) == .pushToTalk(.release))
        let custom = KeyBindings(pushToTalk: .function(5))
        #expect(custom.command(for: .key(.function(5), .press)) == .pushToTalk(.press))
        #expect(custom.command(for: .key(.space, .press)) == nil)
    }

    @Test("commands: q, b, m, Esc, Ctrl-C, Ctrl-Z, Ctrl-L")
    func commands() {
        #expect(bindings.command(for: .key(.character("q"), .press)) == .quit)
        #expect(bindings.command(for: .key(.character("q"), .press, modifiers: .capsLock)) == .quit)
        #expect(bindings.command(for: .key(.character("b"), .press)) == .background)
        #expect(bindings.command(for: .key(.character("m"), .press)) == .toggleMute)
        #expect(bindings.command(for: .key(.escape, .press)) == .cancelTransmit)
        #expect(bindings.command(for: .key(.character("c"), .press, modifiers: .ctrl)) == .quit)
        #expect(bindings.command(for: .key(.character("z"), .press, modifiers: .ctrl)) == .suspend)
        #expect(bindings.command(for: .key(.character("l"), .press, modifiers: .ctrl)) == .redraw)
    }

    @Test("releases, modifier-only keys, chords and unbound keys mean nothing")
    func ignored() {
        #expect(bindings.command(for: .key(.character("q"), .release)) == nil)
        #expect(bindings.command(for: .key(.code(57441), .press, modifiers: .shift)) == nil)
        #expect(bindings.command(for: .key(.character("q"), .press, modifiers: .alt)) == nil)
        #expect(bindings.command(for: .key(.character("x"), .press)) == nil)
        #expect(bindings.command(for: .focusOut) == nil)
    }

    @Test("key names round-trip for --ptt-key")
    func keyNames() {
        #expect(Key(name: "space") == .space)
        #expect(Key(name: "F5") == .function(5))
        #expect(Key(name: "t") == .character("t"))
        #expect(Key(name: "Enter") == .enter)
        #expect(Key(name: "nonsense") == nil)
        for key in [Key.space, .enter, .escape, .tab, .function(12), .character("t"), .pageDown] {
            #expect(Key(name: key.name) == key)
        }
    }

    @Test("probe: kitty reply means supported, even after the DA reply")
    func probe() {
        var kitty = KeyboardProbe()
        let kittyReply = kitty.handle(.kittyFlags(0))
        let kittyDA = kitty.handle(.deviceAttributes)
        #expect(kittyReply && !kittyDA)
        #expect(kitty.support == .kitty)

        var xterm = KeyboardProbe()
        let xtermDA = xterm.handle(.deviceAttributes)
        #expect(xtermDA)
        #expect(xterm.support == .legacy)
        // A late kitty reply still turns the protocol on.
        let late = xterm.handle(.kittyFlags(0))
        #expect(late)
        #expect(xterm.support == .kitty)

        var quiet = KeyboardProbe()
        let key = quiet.handle(.key(.space, .press))
        #expect(!key)
        #expect(quiet.support == .unknown)
    }
}
