import Glibc
import Testing
@testable import TerminalUI

// TerminalSession against pseudo-terminals. The session's signal state is process-wide, so these run one at a
// time. Signals that end or stop a process are exercised in a child (terminal-ui-demo fixture) so the test
// runner survives; SIGWINCH and SIGCONT are harmless and are sent to this process. (With kill, not raise:
// test code runs on Dispatch worker threads, which block asynchronous signals, so a raise() from there
// would stay pending; kill lets the kernel pick a thread that takes it.)

private let esc = "\u{1B}"
private let enterBytes = "\(esc)[?1049h\(esc)[H\(esc)[2J\(esc)[?25l\(esc)[?1004h"
private let restoreBytes = "\(esc)[0m\(esc)[?1004l\(esc)[?25h\(esc)[?1049l"
private let probeBytes = "\(esc)[?u\(esc)[c"

/// A pseudo-terminal pair; the slave plays the user's terminal device, the master the terminal emulator.
private final class PseudoTerminal {
    let master: Int32
    let slave: Int32
    /// Everything the master has read so far.
    private(set) var output: [UInt8] = []

    init() throws {
        var master: Int32 = -1
        var slave: Int32 = -1
        guard openpty(&master, &slave, nil, nil, nil) == 0 else { throw TerminalError.systemCall("openpty", errno: errno) }
        self.master = master
        self.slave = slave
    }

    deinit {
        close(master)
        close(slave)
    }

    /// Reads from the master until `text` contains `needle` (searching from `offset`) or 10 s pass.
    @discardableResult
    func read(until needle: String, after offset: Int = 0) -> Bool {
        for _ in 0..<1000 {
            if String(decoding: output[min(offset, output.count)...], as: UTF8.self).contains(needle) { return true }
            var ready = pollfd(fd: master, events: Int16(POLLIN), revents: 0)
            guard poll(&ready, 1, 10) > 0 else { continue }
            var buffer = [UInt8](repeating: 0, count: 4096)
            let n = Glibc.read(master, &buffer, buffer.count)
            if n > 0 { output += buffer[0..<n] } else if n < 0 && errno != EINTR && errno != EAGAIN { return false }
        }
        return false
    }

    /// Reads whatever arrives within `milliseconds`.
    func drain(milliseconds: Int32) {
        var ready = pollfd(fd: master, events: Int16(POLLIN), revents: 0)
        while poll(&ready, 1, milliseconds) > 0 {
            var buffer = [UInt8](repeating: 0, count: 4096)
            let n = Glibc.read(master, &buffer, buffer.count)
            guard n > 0 else { return }
            output += buffer[0..<n]
        }
    }

    func type(_ text: String) {
        let bytes = Array(text.utf8)
        _ = bytes.withUnsafeBufferPointer { Glibc.write(master, $0.baseAddress, $0.count) }
    }

    var modes: termios {
        var t = termios()
        _ = tcgetattr(slave, &t)
        return t
    }

    var isRaw: Bool {
        let lflag = modes.c_lflag
        return lflag & tcflag_t(ICANON) == 0 && lflag & tcflag_t(ECHO) == 0 && lflag & tcflag_t(ISIG) == 0
    }

    var isCooked: Bool {
        let lflag = modes.c_lflag
        return lflag & tcflag_t(ICANON) != 0 && lflag & tcflag_t(ECHO) != 0 && lflag & tcflag_t(ISIG) != 0
    }
}

@Suite("TerminalSession", .serialized)
struct TerminalSessionTests {
    @Test("refuses a non-terminal and points to the non-interactive commands")
    func notATerminal() throws {
        var ends: [Int32] = [-1, -1]
        #expect(pipe(&ends) == 0)
        defer { close(ends[0]); close(ends[1]) }
        let error = #expect(throws: TerminalError.self) { try TerminalSession(input: ends[0], output: ends[1]) }
        #expect(error == .notATerminal)
        #expect(error?.description.contains("walkie talk") == true)
        #expect(error?.description.contains("walkie listen") == true)
    }

    @Test("start sets raw mode and sends the setup and probe; restore puts everything back, once")
    func rawModeAndRestore() throws {
        let pty = try PseudoTerminal()
        let before = pty.modes
        #expect(pty.isCooked)
        let session = try TerminalSession(input: pty.slave, output: pty.slave)
        try session.start()
        #expect(pty.isRaw)
        #expect(pty.modes.c_iflag & tcflag_t(IXON | ICRNL) == 0)
        #expect(pty.read(until: enterBytes + probeBytes))

        session.enableKittyKeyboard()
        #expect(session.kittyKeyboardEnabled)
        #expect(pty.read(until: "\(esc)[>11u"))

        // Keys typed at the terminal come out of waitForInput unchanged.
        pty.type(" \(esc)[32;1:3u")
        var input = session.waitForInput(timeout: 2_000_000_000)
        #expect(input.bytes == Array(" \(esc)[32;1:3u".utf8))
        #expect(!input.resized && !input.resumed && !input.endOfInput)
        input = session.waitForInput(timeout: 1_000_000)
        #expect(input == TerminalInput())                        // timeout, nothing happened

        let mark = pty.output.count
        session.restore()
        #expect(pty.read(until: "\(esc)[<u" + restoreBytes, after: mark))
        let after = pty.modes
        #expect(after.c_lflag == before.c_lflag && after.c_iflag == before.c_iflag && after.c_oflag == before.c_oflag)
        #expect(!session.kittyKeyboardEnabled)

        // Idempotent: nothing more is written. The session, or a new one, can start again.
        pty.drain(milliseconds: 50)
        let end = pty.output.count
        session.restore()
        pty.drain(milliseconds: 200)
        #expect(pty.output.count == end)
        try session.start()
        #expect(pty.isRaw)
        session.restore()
        #expect(pty.isCooked)
        let again = try TerminalSession(input: pty.slave, output: pty.slave, options: .init(probeKeyboard: false))
        try again.start()
        again.restore()
    }

    @Test("keys typed before the screen starts are dropped, a cooked-mode Ctrl-D among them")
    func typeAheadIsDropped() throws {
        let pty = try PseudoTerminal()
        #expect(pty.isCooked)
        // Typed while walkie was still joining: a Ctrl-D (which the line discipline queues as a 0
        // byte, read as Ctrl-Space in raw mode) and a space.
        pty.type("\u{04} ")
        usleep(50_000)
        let session = try TerminalSession(input: pty.slave, output: pty.slave, options: .init(probeKeyboard: false))
        try session.start()
        defer { session.restore() }
        let input = session.waitForInput(timeout: 200_000_000)
        #expect(input.bytes.isEmpty && !input.endOfInput, "\(input.bytes)")
        // What is typed once the screen is up arrives as ever.
        pty.type("q")
        #expect(session.waitForInput(timeout: 2_000_000_000).bytes == Array("q".utf8))
    }

    @Test("one session per process")
    func oneSession() throws {
        let pty = try PseudoTerminal()
        let first = try TerminalSession(input: pty.slave, output: pty.slave)
        try first.start()
        defer { first.restore() }
        let second = try TerminalSession(input: pty.slave, output: pty.slave)
        #expect(throws: TerminalError.alreadyActive) { try second.start() }
    }

    @Test("SIGWINCH wakes the loop with resized; size() reads the terminal")
    func resize() throws {
        let pty = try PseudoTerminal()
        var size = winsize(ws_row: 12, ws_col: 40, ws_xpixel: 0, ws_ypixel: 0)
        _ = ioctl(pty.master, UInt(TIOCSWINSZ), &size)
        let session = try TerminalSession(input: pty.slave, output: pty.slave)
        try session.start()
        defer { session.restore() }
        #expect(session.size() == (columns: 40, rows: 12))
        kill(getpid(), SIGWINCH)
        let input = session.waitForInput(timeout: 2_000_000_000)
        #expect(input.resized)
    }

    @Test("after a stop, SIGCONT re-enters raw mode, the screen and the kitty flags")
    func continueAfterStop() throws {
        let pty = try PseudoTerminal()
        let session = try TerminalSession(input: pty.slave, output: pty.slave)
        try session.start()
        defer { session.restore() }
        session.enableKittyKeyboard()
        #expect(pty.read(until: "\(esc)[>11u"))

        // What the SIGTSTP handler does before the process stops (raising SIGTSTP here would stop the runner).
        var mark = pty.output.count
        #expect(SignalRestore.phase.compareExchange(expected: SignalRestore.Phase.active, desired: SignalRestore.Phase.suspended,
                                                    ordering: .sequentiallyConsistent).exchanged)
        SignalRestore.restoreTerminal()
        #expect(pty.isCooked)
        #expect(pty.read(until: "\(esc)[<u" + restoreBytes, after: mark))

        mark = pty.output.count
        kill(getpid(), SIGCONT)
        // The handler may run on another thread; its last step is the wake-up.
        #expect(session.waitForInput(timeout: 2_000_000_000).resumed)
        #expect(pty.isRaw)
        #expect(pty.read(until: enterBytes + "\(esc)[>11u", after: mark))

        // SIGCONT without our stop (after SIGSTOP): raw mode is asserted again, and a repaint requested.
        var cooked = pty.modes
        cooked.c_lflag |= tcflag_t(ICANON | ECHO)
        _ = tcsetattr(pty.slave, TCSANOW, &cooked)
        kill(getpid(), SIGCONT)
        #expect(session.waitForInput(timeout: 2_000_000_000).resumed)
        #expect(pty.isRaw)
    }
}

// MARK: - Real signals, in a child process

/// Wait status decoding (the W* macros are not imported into Swift).
private enum WaitStatus: Equatable {
    case exited(Int32), signaled(Int32), stopped(Int32), other(Int32)

    init(_ status: Int32) {
        let low = status & 0x7F
        if low == 0 { self = .exited((status >> 8) & 0xFF) }
        else if status & 0xFF == 0x7F { self = .stopped((status >> 8) & 0xFF) }
        else if low != 0x7F { self = .signaled(low) }
        else { self = .other(status) }
    }
}

private final class Child {
    let pid: pid_t
    let pty: PseudoTerminal

    init(_ arguments: [String]) throws {
        pty = try PseudoTerminal()
        pid = try Child.spawn(arguments, terminal: pty.slave, master: pty.master)
    }

    static var executable: String {
        var buffer = [CChar](repeating: 0, count: 4096)
        let n = readlink("/proc/self/exe", &buffer, buffer.count - 1)
        let path = n > 0 ? String(decoding: buffer[0..<n].map { UInt8(bitPattern: $0) }, as: UTF8.self) : ""
        let directory = path.split(separator: "/", omittingEmptySubsequences: false).dropLast().joined(separator: "/")
        return directory + "/terminal-ui-demo"
    }

    private static func spawn(_ arguments: [String], terminal: Int32, master: Int32) throws -> pid_t {
        let path = executable
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_adddup2(&actions, terminal, 0)
        posix_spawn_file_actions_adddup2(&actions, terminal, 1)
        posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0)
        posix_spawn_file_actions_addclose(&actions, master)

        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        var defaults = sigset_t()
        sigemptyset(&defaults)
        for signal in [SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGTSTP, SIGCONT, SIGWINCH] { sigaddset(&defaults, signal) }
        var mask = sigset_t()
        sigemptyset(&mask)
        posix_spawnattr_setsigdefault(&attributes, &defaults)
        posix_spawnattr_setsigmask(&attributes, &mask)
        // Its own process group, whose parent (this runner) is in another group of the same session, so
        // the group is not orphaned and SIGTSTP really stops it.
        posix_spawnattr_setpgroup(&attributes, 0)
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK))

        var environment = ["SWIFT_BACKTRACE=enable=no"]
        if let libraries = getenv("LD_LIBRARY_PATH") { environment.append("LD_LIBRARY_PATH=" + String(cString: libraries)) }
        let argv: [UnsafeMutablePointer<CChar>?] = ([path, "fixture"] + arguments).map { strdup($0) } + [nil]
        let envp: [UnsafeMutablePointer<CChar>?] = environment.map { strdup($0) } + [nil]
        defer { (argv + envp).forEach { free($0) } }
        var pid: pid_t = 0
        let result = posix_spawn(&pid, path, &actions, &attributes, argv, envp)
        guard result == 0 else { throw TerminalError.systemCall("posix_spawn \(path)", errno: result) }
        return pid
    }

    /// waitpid with a 10 s limit; `options` may add WUNTRACED.
    func wait(options: Int32 = 0) -> WaitStatus? {
        for _ in 0..<1000 {
            var status: Int32 = 0
            let result = waitpid(pid, &status, options | WNOHANG)
            if result == pid { return WaitStatus(status) }
            if result < 0 { return nil }
            usleep(10_000)
        }
        return nil
    }

    deinit {
        kill(pid, SIGKILL)
        var status: Int32 = 0
        waitpid(pid, &status, 0)
    }
}

@Suite("TerminalSession signal handlers (child process)", .serialized)
struct TerminalSignalTests {
    @Test("the terminal-ui-demo fixture is built next to the tests")
    func fixture() {
        #expect(access(Child.executable, X_OK) == 0, "build terminal-ui-demo first (swift build)")
    }

    @Test("q quits normally and restores")
    func normalQuit() throws {
        let child = try Child([])
        #expect(child.pty.read(until: "READY"))
        #expect(child.pty.isRaw)
        child.pty.type("q")
        #expect(child.wait() == .exited(0))
        #expect(child.pty.read(until: restoreBytes + "DONE"))
        #expect(child.pty.isCooked)
    }

    @Test("SIGTERM restores, then terminates by the signal", arguments: [SIGTERM, SIGINT, SIGHUP, SIGQUIT])
    func terminationSignals(signal: Int32) throws {
        let child = try Child(["kitty"])
        #expect(child.pty.read(until: "\(esc)[>11uREADY"))
        #expect(child.pty.isRaw)
        let mark = child.pty.output.count
        kill(child.pid, signal)
        #expect(child.wait() == .signaled(signal))
        #expect(child.pty.read(until: "\(esc)[<u" + restoreBytes, after: mark))
        #expect(child.pty.isCooked)
    }

    @Test("SIGTSTP restores and stops; SIGCONT re-enters with the kitty flags")
    func stopAndContinue() throws {
        let child = try Child(["kitty"])
        #expect(child.pty.read(until: "\(esc)[>11uREADY"))
        var mark = child.pty.output.count
        kill(child.pid, SIGTSTP)
        #expect(child.wait(options: WUNTRACED) == .stopped(SIGTSTP))
        #expect(child.pty.read(until: "\(esc)[<u" + restoreBytes, after: mark))
        #expect(child.pty.isCooked)

        mark = child.pty.output.count
        kill(child.pid, SIGCONT)
        #expect(child.pty.read(until: enterBytes + "\(esc)[>11u", after: mark))
        #expect(child.pty.read(until: "RESUMED", after: mark))
        #expect(child.pty.isRaw)

        // And it still restores on the way out.
        mark = child.pty.output.count
        kill(child.pid, SIGINT)
        #expect(child.wait() == .signaled(SIGINT))
        #expect(child.pty.read(until: "\(esc)[<u" + restoreBytes, after: mark))
        #expect(child.pty.isCooked)
    }

    @Test("a crash restores before the process dies")
    func crash() throws {
        let child = try Child(["crash"])
        #expect(child.pty.read(until: "READY"))
        let status = child.wait()
        #expect(status == .signaled(SIGILL) || status == .signaled(SIGTRAP), "\(String(describing: status))")
        #expect(child.pty.read(until: restoreBytes))
        #expect(child.pty.isCooked)
    }
}
