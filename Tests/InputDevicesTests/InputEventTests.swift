import InputDevices
import Testing

struct InputEventTests {
    @Test func keyNamesAsTheKernelSpellsThemOrShorterOrAsCodes() {
        #expect(KeyCode(name: "KEY_F13")?.code == 183)
        #expect(KeyCode(name: "f13")?.code == 183)
        #expect(KeyCode(name: "PlayPause")?.code == 164)
        #expect(KeyCode(name: "btn_0")?.code == 0x100)
        #expect(KeyCode(name: "0xb7")?.code == 183)
        #expect(KeyCode(name: "183")?.code == 183)
        #expect(KeyCode(name: "KEY_NOSUCHKEY") == nil)
        #expect(KeyCode(name: "768") == nil, "past KEY_MAX")
        #expect(KeyCode(name: "") == nil)
        #expect(KeyCode(code: 183)?.description == "KEY_F13")
        // An alias shares its code; the description is the kernel's first name for it.
        #expect(KeyCode(name: "KEY_MIN_INTERESTING") == nil, "not a key of its own")
        #expect(KeyCode(name: "BTN_MISC")?.code == KeyCode(name: "BTN_0")?.code)
        #expect(KeyCode(code: 0x2fe)?.description == "key code 766")
    }

    @Test func eventsAreCutFromAnySplitOfTheStream() {
        let sent = [InputEvent(type: 4, code: 4, value: 0x70068), InputEvent(type: 1, code: 183, value: 1),
                    InputEvent(type: 0, code: 0, value: 0), InputEvent(type: 1, code: 183, value: 0)]
        let bytes = sent.flatMap(\.bytes)
        #expect(bytes.count == 4 * InputEvent.size)
        for chunk in [1, 5, InputEvent.size - 1, InputEvent.size, 50, bytes.count] {
            var stream = InputEventStream()
            var got: [InputEvent] = []
            for start in stride(from: 0, to: bytes.count, by: chunk) {
                got += bytes[start ..< min(start + chunk, bytes.count)].withUnsafeBytes { stream.feed($0) }
            }
            #expect(got == sent, "chunks of \(chunk)")
        }
        // A partial event is forgotten by a reset (the device went away mid-event).
        var stream = InputEventStream()
        _ = bytes[0 ..< 10].withUnsafeBytes { stream.feed($0) }
        stream.reset()
        #expect(bytes[InputEvent.size ..< 2 * InputEvent.size].withUnsafeBytes { stream.feed($0) } == [sent[1]])
    }

    @Test func oneKeyPressesAndReleasesAndIgnoresRepeatsAndOtherKeys() {
        var button = PushToTalkKeyState(key: KeyCode(name: "KEY_F13"))
        #expect(button.apply(InputEvent(type: 1, code: 57, value: 1)) == nil, "another key")
        #expect(button.apply(InputEvent(type: 4, code: 183, value: 1)) == nil, "not a key event")
        #expect(button.apply(InputEvent(type: 1, code: 183, value: 1)) == true)
        #expect(button.apply(InputEvent(type: 1, code: 183, value: 2)) == nil, "auto-repeat")
        #expect(button.apply(InputEvent(type: 1, code: 183, value: 1)) == nil, "already down")
        #expect(button.apply(InputEvent(type: 1, code: 183, value: 0)) == false)
        #expect(button.apply(InputEvent(type: 1, code: 183, value: 0)) == nil)
        #expect(button.apply(InputEvent(type: 1, code: 183, value: 1)) == true)
        let released = button.releaseAll(), again = button.releaseAll()
        #expect(released, "unplugged while down: a release")
        #expect(!again)
    }

    @Test func anyKeyIsDownUntilTheLastGoesUp() {
        var pedal = PushToTalkKeyState(key: nil)
        #expect(pedal.apply(InputEvent(type: 1, code: 48, value: 1)) == true)
        #expect(pedal.apply(InputEvent(type: 1, code: 49, value: 1)) == nil)
        #expect(pedal.apply(InputEvent(type: 1, code: 48, value: 0)) == nil, "49 is still down")
        #expect(pedal.apply(InputEvent(type: 1, code: 49, value: 0)) == false)
    }
}
