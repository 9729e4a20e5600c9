import Glibc

/// Why the interactive terminal could not be opened.
public enum TerminalError: Error, Hashable, Sendable, CustomStringConvertible {
    /// Input or output is not a terminal (piped, redirected, or run from a service).
    case notATerminal
    /// Another TerminalSession is active in this process; there is one terminal state to restore.
    case alreadyActive
    /// A system call failed.
    case systemCall(String, errno: Int32)

    public var description: String {
        switch self {
        case .notATerminal:
            "walkie's interactive screen needs a terminal, but standard input or output is not one. "
                + "Without a terminal, use the non-interactive commands: 'walkie talk' to send a WAV file "
                + "and 'walkie listen' to record what the channel hears."
        case .alreadyActive:
            "The terminal is already in use by another interactive session in this process."
        case .systemCall(let call, let code):
            "\(call) failed: \(String(cString: strerror(code)))"
        }
    }
}

/// What ``TerminalSession/waitForInput(timeout:)`` saw.
public struct TerminalInput: Hashable, Sendable {
    /// Bytes from the terminal, for ``KeyInputParser/feed(_:)``.
    public var bytes: [UInt8] = []
    /// The window changed size (SIGWINCH): read ``TerminalSession/size()`` and redraw.
    public var resized = false
    /// The process was stopped and continued; the terminal was re-entered and the screen is blank or
    /// stale: redraw everything (render with no previous frame).
    public var resumed = false
    /// The terminal is gone (end of file or hang-up): quit.
    public var endOfInput = false

    public init() {}
}

/// Owns the terminal for the interactive screen: the only part of this module that does I/O.
///
/// ``start()`` puts the terminal in raw mode, enters the alternate screen, hides the cursor, enables focus
/// reporting and sends the keyboard probe `ESC[?u ESC[c`. ``restore()`` undoes all of it (and pops kitty
/// flags if ``enableKittyKeyboard(flags:)`` pushed them); it is idempotent and also runs from `deinit`.
///
/// The same restore runs from signal handlers, so the shell gets its terminal back on every way out:
/// SIGINT/SIGTERM/SIGHUP/SIGQUIT (restore, then the signal's previous action, usually terminating), crash
/// signals (SIGSEGV, SIGBUS, SIGILL, SIGTRAP, SIGFPE, SIGABRT; then the Swift runtime's backtrace, readable
/// because the terminal is back to normal), and SIGTSTP (restore, stop, and on SIGCONT re-enter raw mode,
/// the alternate screen and the kitty flags; ``waitForInput(timeout:)`` then reports `resumed`). Signals
/// that were ignored when the session started (`nohup`, a parent that ignores SIGTSTP) stay ignored.
/// SIGKILL cannot be caught: `reset` is the cure there.
///
/// Raw mode turns off ISIG, so Ctrl-C and Ctrl-Z arrive as keys (the kitty protocol with flag 8 would
/// encode them as keys anyway); ``KeyBindings`` maps them to `.quit` and `.suspend`, and ``suspend()``
/// stops the process the way the shell would.
///
/// One session per process at a time. Use it from one thread; it is deliberately not Sendable.
public final class TerminalSession {
    public struct Options: Hashable, Sendable {
        public var alternateScreen: Bool
        public var hideCursor: Bool
        /// `ESC[?1004h`: needed to unkey when the window loses focus.
        public var focusReporting: Bool
        /// Send `ESC[?u ESC[c` in ``start()``; answers arrive as parser events.
        public var probeKeyboard: Bool
        /// Also restore from crash signals. Their previous handlers (the Swift backtracer) still run after.
        public var restoreOnCrash: Bool

        public init(alternateScreen: Bool = true, hideCursor: Bool = true, focusReporting: Bool = true,
                    probeKeyboard: Bool = true, restoreOnCrash: Bool = true) {
            self.alternateScreen = alternateScreen
            self.hideCursor = hideCursor
            self.focusReporting = focusReporting
            self.probeKeyboard = probeKeyboard
            self.restoreOnCrash = restoreOnCrash
        }
    }

    /// The keyboard probe: query kitty flags, then primary device attributes, which every terminal answers.
    public static let keyboardProbe: [UInt8] = Array("\u{1B}[?u\u{1B}[c".utf8)

    /// Kitty flags walkie pushes: 1 disambiguate + 2 report event types + 8 report all keys as escape codes
    /// (without 8 there are no release events for plain keys such as Space).
    public static let pushToTalkKittyFlags = 11

    public let input: Int32
    public let output: Int32
    public let options: Options

    private var started = false
    private var finished = false
    private var wakeRead: Int32 = -1
    private var wakeWrite: Int32 = -1
    private var installedSignals: [Int32] = []

    /// Checks that `input` and `output` are terminals; nothing is changed until ``start()``.
    /// - Throws: ``TerminalError/notATerminal``, whose message points to `walkie talk`/`walkie listen`.
    public init(input: Int32 = STDIN_FILENO, output: Int32 = STDOUT_FILENO, options: Options = Options()) throws {
        guard isatty(input) == 1, isatty(output) == 1 else { throw TerminalError.notATerminal }
        self.input = input
        self.output = output
        self.options = options
    }

    deinit {
        restore()
    }

    /// Whether kitty flags are pushed.
    public var kittyKeyboardEnabled: Bool {
        SignalRestore.kittyPushed.load(ordering: .sequentiallyConsistent) && started && !finished
    }

    /// Raw mode, alternate screen, hidden cursor, focus reporting, signal handlers, and the keyboard probe.
    /// Does nothing while already started; after ``restore()`` it starts afresh.
    public func start() throws {
        guard !started || finished else { return }
        SignalRestore.touch()
        guard SignalRestore.owned.compareExchange(expected: false, desired: true,
                                                  ordering: .sequentiallyConsistent).exchanged else {
            throw TerminalError.alreadyActive
        }
        var original = termios()
        guard tcgetattr(input, &original) == 0 else {
            let code = errno
            SignalRestore.owned.store(false, ordering: .sequentiallyConsistent)
            throw TerminalError.systemCall("tcgetattr", errno: code)
        }
        var pipeEnds: [Int32] = [-1, -1]
        guard pipe(&pipeEnds) == 0 else {
            let code = errno
            SignalRestore.owned.store(false, ordering: .sequentiallyConsistent)
            throw TerminalError.systemCall("pipe", errno: code)
        }
        wakeRead = pipeEnds[0]
        wakeWrite = pipeEnds[1]
        finished = false
        // Non-blocking both ways: a handler must never block on a full pipe, and draining stops when empty.
        for fd in pipeEnds {
            _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
            _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
        }
        SignalRestore.kittyPushed.store(false, ordering: .sequentiallyConsistent)
        SignalRestore.prepare(input: input, output: output, wake: wakeWrite,
                              original: original, raw: Self.rawMode(from: original),
                              restore: restoreSequence, enter: enterSequence)
        started = true
        // Active before the handlers go in and the terminal changes: a signal in between restores what is not
        // changed yet (harmless) rather than leaving a changed terminal behind.
        SignalRestore.phase.store(SignalRestore.Phase.active, ordering: .sequentiallyConsistent)
        installHandlers()
        SignalRestore.enterTerminal()
        // Keys typed before the screen was up (while walkie was joining) are dropped, not read as the
        // screen's: nothing said what they would do, and the line discipline leaves a Ctrl-D typed in
        // cooked mode in the queue as a 0 byte, which reads as Ctrl-Space, the talk key with Ctrl, and
        // latched a transmission (found by an operator pressing Ctrl-D to give up a slow join).
        _ = tcflush(input, TCIFLUSH)
        if options.probeKeyboard { write(Self.keyboardProbe) }
    }

    /// Pushes kitty keyboard flags (call it when ``KeyboardProbe`` reports `.kitty`). Once per session;
    /// they are popped by ``restore()`` and pushed again after a stop.
    public func enableKittyKeyboard(flags: Int = TerminalSession.pushToTalkKittyFlags) {
        guard started, !finished, !SignalRestore.kittyPushed.load(ordering: .sequentiallyConsistent) else { return }
        let push = Array("\u{1B}[>\(flags)u".utf8)
        SignalRestore.setKittyPush(push)
        // Flag first, then bytes: a stop in between pops a stack that has nothing of ours (harmless) and pushes
        // again on resume, rather than resuming without the flags while walkie believes they are on.
        SignalRestore.kittyPushed.store(true, ordering: .sequentiallyConsistent)
        write(push)
    }

    /// Puts the terminal back as it was. Idempotent; safe to call whether or not ``start()`` succeeded.
    public func restore() {
        guard started, !finished else { return }
        finished = true
        let previous = SignalRestore.phase.exchange(SignalRestore.Phase.inactive, ordering: .sequentiallyConsistent)
        if previous == SignalRestore.Phase.active {
            SignalRestore.restoreTerminal()
        }
        // `suspended` means the stop handler already restored it and the resume path will see `inactive`.
        SignalRestore.kittyPushed.store(false, ordering: .sequentiallyConsistent)
        uninstallHandlers()
        SignalRestore.storage.fds[2] = -1
        close(wakeRead)
        close(wakeWrite)
        wakeRead = -1
        wakeWrite = -1
        SignalRestore.owned.store(false, ordering: .sequentiallyConsistent)
    }

    /// Stops the process like Ctrl-Z in a shell would: the terminal is restored, and re-entered when the
    /// shell continues the process (`fg`); ``waitForInput(timeout:)`` then reports `resumed`.
    /// Unkey before calling it: a stopped process sends no audio, but the server would still see a talker.
    public func suspend() {
        guard started, !finished else { return }
        // kill, not raise: if this thread blocks SIGTSTP (Dispatch and Swift concurrency worker threads block
        // asynchronous signals), raise would leave it pending forever; kill lets the kernel pick a thread.
        _ = kill(getpid(), SIGTSTP)
    }

    /// Writes bytes to the terminal, all of them (retrying short writes and EINTR).
    public func write(_ bytes: [UInt8]) {
        bytes.withUnsafeBufferPointer { buffer in
            guard let base = buffer.baseAddress else { return }
            var offset = 0
            while offset < buffer.count {
                let n = Glibc.write(output, base + offset, buffer.count - offset)
                if n > 0 {
                    offset += n
                } else if n < 0 && errno == EINTR {
                    continue
                } else if n < 0 && errno == EAGAIN {
                    // Someone made the terminal non-blocking: wait until it takes more.
                    var ready = pollfd(fd: output, events: Int16(POLLOUT), revents: 0)
                    _ = poll(&ready, 1, 100)
                } else {
                    return
                }
            }
        }
    }

    public func write(_ text: String) {
        write(Array(text.utf8))
    }

    /// The terminal's size in columns and rows (80×24 if the terminal does not say).
    public func size() -> (columns: Int, rows: Int) {
        var size = winsize()
        guard ioctl(output, UInt(TIOCGWINSZ), &size) == 0, size.ws_col > 0, size.ws_row > 0 else { return (80, 24) }
        return (Int(size.ws_col), Int(size.ws_row))
    }

    /// Waits until the terminal sends bytes, a signal needs attention, or `timeout` nanoseconds pass
    /// (nil: no limit), and returns what happened. Call with the earliest of the hold-to-talk deadline, the
    /// parser's escape timeout and the next screen refresh.
    public func waitForInput(timeout: UInt64?) -> TerminalInput {
        var result = TerminalInput()
        guard started, !finished else { result.endOfInput = true; return result }
        var fds = [pollfd(fd: input, events: Int16(POLLIN), revents: 0),
                   pollfd(fd: wakeRead, events: Int16(POLLIN), revents: 0)]
        // Round up so we never wake just before a deadline and spin.
        let milliseconds = timeout.map { Int32(clamping: ($0 + 999_999) / 1_000_000) } ?? -1
        let ready = poll(&fds, 2, milliseconds)
        if ready < 0 && errno != EINTR { result.endOfInput = true; return result }
        drainWakePipe(into: &result)
        if ready > 0, fds[0].revents != 0 {
            var buffer = [UInt8](repeating: 0, count: 4096)
            let n = read(input, &buffer, buffer.count)
            if n > 0 {
                result.bytes = Array(buffer[0..<n])
            } else if n == 0 || (errno != EINTR && errno != EAGAIN) {
                result.endOfInput = true                    // EOF, or EIO after a hang-up
            }
        }
        return result
    }

    // MARK: - Private

    /// The bytes that set the screen up; written on start and again after a stop.
    private var enterSequence: [UInt8] {
        var text = ""
        if options.alternateScreen { text += "\u{1B}[?1049h\u{1B}[H\u{1B}[2J" }
        if options.hideCursor { text += "\u{1B}[?25l" }
        if options.focusReporting { text += "\u{1B}[?1004h" }
        return Array(text.utf8)
    }

    /// The inverse of `enterSequence` (kitty flags are popped separately, first).
    private var restoreSequence: [UInt8] {
        var text = "\u{1B}[0m"
        if options.focusReporting { text += "\u{1B}[?1004l" }
        if options.hideCursor { text += "\u{1B}[?25h" }
        if options.alternateScreen { text += "\u{1B}[?1049l" }
        return Array(text.utf8)
    }

    /// Raw input (no echo, no line editing, no signal keys, no flow control, 8-bit), one byte at a time.
    /// Output processing stays on, so a stray "\n" in a message still returns the carriage.
    static func rawMode(from original: termios) -> termios {
        var raw = original
        raw.c_iflag &= ~tcflag_t(BRKINT | ICRNL | INPCK | ISTRIP | IXON)
        raw.c_cflag |= tcflag_t(CS8)
        raw.c_lflag &= ~tcflag_t(ECHO | ICANON | IEXTEN | ISIG)
        withUnsafeMutableBytes(of: &raw.c_cc) { cc in
            cc[Int(VMIN)] = 1
            cc[Int(VTIME)] = 0
        }
        return raw
    }

    private func installHandlers() {
        let asynchronous = [SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGTSTP, SIGCONT, SIGWINCH]
        let crash = options.restoreOnCrash ? [SIGSEGV, SIGBUS, SIGILL, SIGTRAP, SIGFPE, SIGABRT] : []
        // While one of our handlers runs, the other asynchronous ones wait, so two never interleave their
        // writes. SIGTSTP's handler must not block SIGTSTP itself (it re-raises it to stop).
        var mask = sigset_t()
        sigemptyset(&mask)
        for signal in asynchronous { sigaddset(&mask, signal) }

        for signal in asynchronous + crash {
            var action = sigaction()
            let handler: @convention(c) (Int32) -> Void
            var flags = SA_RESTART | SA_ONSTACK
            var actionMask = mask
            switch signal {
            case SIGTSTP:
                handler = terminalStopHandler
                flags |= SA_NODEFER
                sigdelset(&actionMask, SIGTSTP)
            case SIGCONT: handler = terminalContinueHandler
            case SIGWINCH: handler = terminalResizeHandler
            default: handler = terminalTerminationHandler
            }
            action.__sigaction_handler.sa_handler = handler
            action.sa_mask = actionMask
            action.sa_flags = Int32(flags)

            let previous = SignalRestore.storage.previous + Int(signal)
            guard sigaction(signal, nil, previous) == 0 else { continue }
            // Leave ignored signals ignored: `nohup` and job-control-less parents mean it.
            if previous.pointee.sa_flags & Int32(SA_SIGINFO) == 0,
               let current = previous.pointee.__sigaction_handler.sa_handler,
               unsafeBitCast(current, to: Int.self) == unsafeBitCast(SIG_IGN, to: Int.self) {
                continue
            }
            if signal == SIGTSTP { SignalRestore.storage.stopAction.pointee = action }
            if sigaction(signal, &action, nil) == 0 { installedSignals.append(signal) }
        }
    }

    private func uninstallHandlers() {
        for signal in installedSignals {
            _ = sigaction(signal, SignalRestore.storage.previous + Int(signal), nil)
        }
        installedSignals = []
    }

    private func drainWakePipe(into result: inout TerminalInput) {
        var buffer = [UInt8](repeating: 0, count: 64)
        while true {
            let n = read(wakeRead, &buffer, buffer.count)
            guard n > 0 else { return }
            for byte in buffer[0..<n] {
                if byte == SignalRestore.resizedByte { result.resized = true }
                if byte == SignalRestore.resumedByte { result.resumed = true }
            }
        }
    }
}

/// Monotonic time in nanoseconds, the clock ``HoldToTalk`` expects.
public func monotonicNanoseconds() -> UInt64 {
    var now = timespec()
    clock_gettime(CLOCK_MONOTONIC, &now)
    return UInt64(now.tv_sec) * 1_000_000_000 + UInt64(now.tv_nsec)
}
