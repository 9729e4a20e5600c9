/// One event as the kernel's evdev interface writes it (`struct input_event`): a timestamp, then type,
/// code and value. Only the type, code and value matter here; the time is the kernel's, not ours.
public struct InputEvent: Equatable, Sendable {
    /// `EV_SYN`: the end of one report (a key and its scan code arrive together before it).
    public static let synchronization: UInt16 = 0
    /// `EV_KEY`: a key or button; value 1 pressed, 0 released, 2 held down (auto-repeat).
    public static let key: UInt16 = 1

    public var type: UInt16
    public var code: UInt16
    public var value: Int32

    public init(type: UInt16, code: UInt16, value: Int32) {
        self.type = type
        self.code = code
        self.value = value
    }

    /// The size of one event: a `struct timeval` (two longs) and 8 bytes, so 24 on 64-bit Linux.
    public static let size = 2 * MemoryLayout<Int>.size + 8

    /// The event in `bytes`, which holds exactly `size` bytes in the machine's byte order.
    public init(_ bytes: UnsafeRawBufferPointer) {
        precondition(bytes.count == Self.size)
        let base = 2 * MemoryLayout<Int>.size
        type = bytes.loadUnaligned(fromByteOffset: base, as: UInt16.self)
        code = bytes.loadUnaligned(fromByteOffset: base + 2, as: UInt16.self)
        value = bytes.loadUnaligned(fromByteOffset: base + 4, as: Int32.self)
    }

    /// The event as the kernel would write it (time zero): for tests, and for feeding a FIFO.
    public var bytes: [UInt8] {
        var out = [UInt8](repeating: 0, count: Self.size)
        let base = 2 * MemoryLayout<Int>.size
        out.withUnsafeMutableBytes { raw in
            raw.storeBytes(of: type, toByteOffset: base, as: UInt16.self)
            raw.storeBytes(of: code, toByteOffset: base + 2, as: UInt16.self)
            raw.storeBytes(of: value, toByteOffset: base + 4, as: Int32.self)
        }
        return out
    }
}

/// Cuts a byte stream into events. A device's reads are whole events, but a FIFO (which stands in for
/// one in tests, and in scripts) may deliver any split; the remainder waits for the next read.
public struct InputEventStream: Sendable {
    private var pending: [UInt8] = []

    public init() {}

    public mutating func feed(_ bytes: UnsafeRawBufferPointer) -> [InputEvent] {
        pending.append(contentsOf: bytes)
        let whole = pending.count / InputEvent.size * InputEvent.size
        guard whole > 0 else { return [] }
        var events: [InputEvent] = []
        events.reserveCapacity(whole / InputEvent.size)
        pending.withUnsafeBytes { raw in
            for offset in stride(from: 0, to: whole, by: InputEvent.size) {
                events.append(InputEvent(UnsafeRawBufferPointer(rebasing: raw[offset ..< offset + InputEvent.size])))
            }
        }
        pending.removeFirst(whole)
        return events
    }

    /// Forgets a partial event: the device went away, and what follows starts afresh.
    public mutating func reset() { pending.removeAll() }
}

/// Which presses and releases a stream of events makes of one push-to-talk key (or of any key, for a
/// device that is only a button: a pedal, a PTT switch). With several keys down at once, the button is
/// down until the last goes up; auto-repeat (value 2) is not a new press.
public struct PushToTalkKeyState: Sendable {
    public let key: KeyCode?
    public private(set) var held: Set<UInt16> = []

    /// - Parameter key: nil: any key of the device.
    public init(key: KeyCode?) { self.key = key }

    public var isPressed: Bool { !held.isEmpty }

    /// true: the button went down; false: it went up; nil: no change.
    public mutating func apply(_ event: InputEvent) -> Bool? {
        guard event.type == InputEvent.key, key == nil || key?.code == event.code else { return nil }
        let was = isPressed
        switch event.value {
        case 1: held.insert(event.code)
        case 0: held.remove(event.code)
        default: return nil
        }
        return was == isPressed ? nil : isPressed
    }

    /// The device went away: whatever was down is up (true if that is a release).
    public mutating func releaseAll() -> Bool {
        defer { held.removeAll() }
        return isPressed
    }
}
