import Glibc
import Synchronization

// Restoring the terminal from signal handlers.
//
// A signal handler can run at any instruction of any thread, including inside malloc or while the Swift
// runtime holds a lock, so it may only call async-signal-safe functions (POSIX.1-2008 §2.4.3) and must not
// allocate, retain/release, take locks or touch Swift-managed memory. A handler also cannot capture context,
// so what it needs has to sit in process-wide storage. That is the one piece of global state in this module,
// and it is safe for these reasons:
//
// 1. Allocated once, never freed. `SignalRestore.storage` is a struct of raw pointers to memory allocated
//    on first use; `TerminalSession.start()` touches it (and the atomics) before installing any handler, so a
//    handler only ever takes the initialised fast path of the global accessor (an atomic load, no lock, no
//    allocation), never the initialiser itself, and the pointers never dangle.
// 2. Written only while no handler can read it. `prepare(...)` fills the buffers before handlers are
//    installed and before `phase` becomes `active`; handlers read the buffers only after loading a non-zero
//    `phase` (sequentially consistent atomics, so the writes happen-before the reads). While handlers are
//    installed the buffers are not written, with one exception: the kitty push sequence is written before
//    `kittyPushed` is set, and at most once per session.
// 3. One owner. `owned` (an atomic flag) admits one TerminalSession at a time, because there is one
//    terminal state to restore per process.
// 4. Exactly-once restore. `phase` decides who restores: the normal path and the handlers both use an
//    atomic exchange/compare-exchange, so the terminal is restored once even when a signal races `restore()`.
// 5. Handlers call only write(2), tcsetattr(3), sigaction(2) (to hand a signal back to its previous
//    disposition, and to reinstall the SIGTSTP handler after a stop: signal(SIG_DFL) generalised to "whatever
//    was there before", still async-signal-safe) and raise(3), plus lock-free atomics and errno save/restore.
//    All byte sequences are precomputed; nothing is formatted or allocated in a handler.
//
// `storage` is `nonisolated(unsafe)` because raw pointers are not Sendable; the rules above are what make
// sharing them with handlers sound. The atomics are Sendable on their own.

/// Process-wide state for the signal handlers; see the comment at the top of this file.
enum SignalRestore {
    /// Whether the terminal is in walkie's mode. `inactive`: nothing to restore. `active`: raw mode etc.
    /// are on. `suspended`: the SIGTSTP handler restored the terminal and the process is (or was) stopped.
    static let phase = Atomic<Int32>(Phase.inactive)
    /// Kitty keyboard flags were pushed: pop them on the way out, push them again on resume.
    static let kittyPushed = Atomic<Bool>(false)
    /// A TerminalSession owns the terminal.
    static let owned = Atomic<Bool>(false)

    enum Phase {
        static let inactive: Int32 = 0
        static let active: Int32 = 1
        static let suspended: Int32 = 2
    }

    /// Byte written to the wake pipe when the window size changed.
    static let resizedByte: UInt8 = 0x57      // "W"
    /// Byte written to the wake pipe after the terminal was re-entered on SIGCONT.
    static let resumedByte: UInt8 = 0x43      // "C"

    static let sequenceCapacity = 128
    static let signalCount = 65               // _NSIG on Linux: signals 1...64

    struct Storage {
        /// [terminal input, terminal output, wake pipe write end]
        let fds: UnsafeMutablePointer<Int32>
        let original: UnsafeMutablePointer<termios>
        let raw: UnsafeMutablePointer<termios>
        let restoreBytes: UnsafeMutablePointer<UInt8>
        let enterBytes: UnsafeMutablePointer<UInt8>
        let kittyPushBytes: UnsafeMutablePointer<UInt8>
        /// Lengths of [restoreBytes, enterBytes, kittyPushBytes].
        let counts: UnsafeMutablePointer<Int>
        /// The disposition each signal had before ours, indexed by signal number.
        let previous: UnsafeMutablePointer<sigaction>
        /// Our SIGTSTP action, reinstalled after each stop.
        let stopAction: UnsafeMutablePointer<sigaction>
    }

    nonisolated(unsafe) static let storage: Storage = {
        let storage = Storage(
            fds: .allocate(capacity: 3),
            original: .allocate(capacity: 1),
            raw: .allocate(capacity: 1),
            restoreBytes: .allocate(capacity: sequenceCapacity),
            enterBytes: .allocate(capacity: sequenceCapacity),
            kittyPushBytes: .allocate(capacity: 16),
            counts: .allocate(capacity: 3),
            previous: .allocate(capacity: signalCount),
            stopAction: .allocate(capacity: 1))
        storage.fds.initialize(repeating: -1, count: 3)
        storage.original.initialize(to: termios())
        storage.raw.initialize(to: termios())
        storage.restoreBytes.initialize(repeating: 0, count: sequenceCapacity)
        storage.enterBytes.initialize(repeating: 0, count: sequenceCapacity)
        storage.kittyPushBytes.initialize(repeating: 0, count: 16)
        storage.counts.initialize(repeating: 0, count: 3)
        storage.previous.initialize(repeating: sigaction(), count: signalCount)
        storage.stopAction.initialize(to: sigaction())
        return storage
    }()

    static let kittyPop: StaticString = "\u{1B}[<u"

    // MARK: Normal context

    /// Runs every lazy initialiser the handlers depend on, so none runs inside a handler.
    static func touch() {
        _ = storage
        _ = phase.load(ordering: .sequentiallyConsistent)
        _ = kittyPushed.load(ordering: .sequentiallyConsistent)
        _ = owned.load(ordering: .sequentiallyConsistent)
    }

    /// Fills the storage for a new session. Only while `phase` is inactive and no handler is installed.
    static func prepare(input: Int32, output: Int32, wake: Int32, original: termios, raw: termios,
                        restore: [UInt8], enter: [UInt8]) {
        precondition(restore.count <= sequenceCapacity && enter.count <= sequenceCapacity)
        storage.fds[0] = input
        storage.fds[1] = output
        storage.fds[2] = wake
        storage.original.pointee = original
        storage.raw.pointee = raw
        storage.restoreBytes.update(from: restore, count: restore.count)
        storage.enterBytes.update(from: enter, count: enter.count)
        storage.counts[0] = restore.count
        storage.counts[1] = enter.count
        storage.counts[2] = 0
    }

    /// Stores the kitty push sequence; only while `kittyPushed` is false (handlers ignore it then).
    static func setKittyPush(_ bytes: [UInt8]) {
        precondition(bytes.count <= 16 && !kittyPushed.load(ordering: .sequentiallyConsistent))
        storage.kittyPushBytes.update(from: bytes, count: bytes.count)
        storage.counts[2] = bytes.count
    }

    // MARK: Async-signal-safe

    /// write(2) until done; gives up on errors other than EINTR (a hung-up terminal answers EIO).
    static func writeAll(_ fd: Int32, _ bytes: UnsafePointer<UInt8>, _ count: Int) {
        var offset = 0
        while offset < count {
            let n = write(fd, bytes + offset, count - offset)
            if n > 0 {
                offset += n
            } else if n < 0 && errno == EINTR {
                continue
            } else {
                return
            }
        }
    }

    /// Pops kitty flags if pushed, writes the restore sequence and puts the original termios back.
    static func restoreTerminal() {
        let output = storage.fds[1]
        if kittyPushed.load(ordering: .sequentiallyConsistent) {
            writeAll(output, kittyPop.utf8Start, kittyPop.utf8CodeUnitCount)
        }
        writeAll(output, storage.restoreBytes, storage.counts[0])
        // TCSAFLUSH: wait for the bytes above to reach the terminal, and drop unread input, so keys typed
        // at walkie (a held Space) do not spill into the shell.
        _ = tcsetattr(storage.fds[0], TCSAFLUSH, storage.original)
    }

    /// Raw mode, the enter sequence and (if they were on) kitty flags again.
    static func enterTerminal() {
        let output = storage.fds[1]
        _ = tcsetattr(storage.fds[0], TCSANOW, storage.raw)
        writeAll(output, storage.enterBytes, storage.counts[1])
        if kittyPushed.load(ordering: .sequentiallyConsistent) {
            writeAll(output, storage.kittyPushBytes, storage.counts[2])
        }
    }

    /// Re-enters the terminal after a stop, unless `restore()` ended the session meanwhile: the terminal is
    /// set up first and the phase claimed afterwards, so if `restore()` won, we undo our own writes and
    /// the terminal still ends restored.
    static func resumeIfSuspended() -> Bool {
        guard phase.load(ordering: .sequentiallyConsistent) == Phase.suspended else { return false }
        enterTerminal()
        if phase.compareExchange(expected: Phase.suspended, desired: Phase.active,
                                 ordering: .sequentiallyConsistent).exchanged {
            return true
        }
        restoreTerminal()
        return false
    }

    static func notify(_ byte: UInt8) {
        let fd = storage.fds[2]
        guard fd >= 0 else { return }
        var value = byte
        _ = write(fd, &value, 1)              // non-blocking pipe: if it is full, a wake-up is pending anyway
    }
}

// MARK: - Handlers (async-signal-safe; see the top of the file)

/// SIGINT, SIGTERM, SIGHUP, SIGQUIT and crash signals: restore once, then let the signal do what it would
/// have done without us (terminate, dump core, or reach the Swift runtime's crash backtracer).
func terminalTerminationHandler(_ signal: Int32) {
    let savedErrno = errno
    if SignalRestore.phase.exchange(SignalRestore.Phase.inactive, ordering: .sequentiallyConsistent)
        == SignalRestore.Phase.active {
        SignalRestore.restoreTerminal()
    }
    if signal > 0 && signal < Int32(SignalRestore.signalCount) {
        _ = sigaction(signal, SignalRestore.storage.previous + Int(signal), nil)
    }
    // The signal is blocked while this handler runs (or will fault again for a synchronous crash), so it is
    // delivered with the previous disposition as soon as the handler returns.
    _ = raise(signal)
    errno = savedErrno
}

/// SIGTSTP (Ctrl-Z from a shell, or `TerminalSession.suspend()`): restore, stop for real, and re-enter
/// when continued. Installed with SA_NODEFER so the re-raised SIGTSTP stops the process inside this call.
func terminalStopHandler(_ signal: Int32) {
    let savedErrno = errno
    if SignalRestore.phase.compareExchange(expected: SignalRestore.Phase.active,
                                           desired: SignalRestore.Phase.suspended,
                                           ordering: .sequentiallyConsistent).exchanged {
        SignalRestore.restoreTerminal()
    }
    _ = sigaction(SIGTSTP, SignalRestore.storage.previous + Int(SIGTSTP), nil)
    _ = raise(SIGTSTP)
    // Continued, or the stop was discarded (an orphaned process group ignores SIGTSTP): either way the
    // terminal is ours again.
    _ = sigaction(SIGTSTP, SignalRestore.storage.stopAction, nil)
    if SignalRestore.resumeIfSuspended() { SignalRestore.notify(SignalRestore.resumedByte) }
    errno = savedErrno
}

/// SIGCONT: after our own stop, re-enter (if the stop handler has not already); after SIGSTOP, which we
/// cannot catch, the shell may have reset the terminal modes, so set raw mode again. Either way the screen
/// needs a full repaint.
func terminalContinueHandler(_ signal: Int32) {
    let savedErrno = errno
    switch SignalRestore.phase.load(ordering: .sequentiallyConsistent) {
    case SignalRestore.Phase.suspended:
        if SignalRestore.resumeIfSuspended() { SignalRestore.notify(SignalRestore.resumedByte) }
    case SignalRestore.Phase.active:
        _ = tcsetattr(SignalRestore.storage.fds[0], TCSANOW, SignalRestore.storage.raw)
        SignalRestore.notify(SignalRestore.resumedByte)
    default:
        break
    }
    errno = savedErrno
}

/// SIGWINCH: wake the event loop so it re-reads the size and redraws.
func terminalResizeHandler(_ signal: Int32) {
    let savedErrno = errno
    SignalRestore.notify(SignalRestore.resizedByte)
    errno = savedErrno
}
