import Crypto
import Foundation
import NIOCore
import NIOPosix
import SwiftASN1
import SquelchTesting
import Synchronization
import Wire
import WireNIO
@_exported import WireTesting
import X509

/// Runs `body` with a fresh two-thread event loop group under `withTimeout`, and always shuts the
/// group down.
func withEventLoopGroup(timeout seconds: Double = 30, _ body: @escaping @Sendable (MultiThreadedEventLoopGroup) async throws -> Void) async throws {
    let group = MultiThreadedEventLoopGroup(numberOfThreads: 2)
    let outcome: Result<Void, any Error>
    do {
        try await withTimeout(seconds) { try await body(group) }
        outcome = .success(())
    } catch {
        outcome = .failure(error)
    }
    try await group.shutdownGracefully()
    try outcome.get()
}

/// Collects everything an async sequence yields, so a test can wait (with a timeout) for what it
/// expects without owning the iterator.
final class Recorder<Element: Sendable>: Sendable {
    actor Storage {
        var items: [Element] = []
        var finished = false
        func append(_ item: Element) { items.append(item) }
        func finish() { finished = true }
    }

    let storage = Storage()
    let task: Task<Void, Never>

    init<S: AsyncSequence & Sendable>(_ sequence: S) where S.Element == Element {
        let storage = storage
        task = Task {
            do {
                for try await item in sequence { await storage.append(item) }
            } catch {}
            await storage.finish()
        }
    }

    deinit { task.cancel() }

    var items: [Element] { get async { await storage.items } }
    var finished: Bool { get async { await storage.finished } }

    /// Polls until the sequence has ended.
    func waitUntilFinished(_ what: String, timeout seconds: Double = 10) async throws {
        let deadline = ContinuousClock.now + .seconds(seconds)
        while await !storage.finished {
            guard ContinuousClock.now < deadline else { throw TimedOut(description: "timed out waiting for \(what) to end") }
            try await Task.sleep(for: .milliseconds(5))
        }
    }

    /// Polls until `done` holds for the items so far; throws after `seconds` with what was seen.
    @discardableResult
    func wait(_ what: String, timeout seconds: Double = 10, until done: @Sendable ([Element]) -> Bool) async throws -> [Element] {
        let deadline = ContinuousClock.now + .seconds(seconds)
        while true {
            let items = await storage.items
            if done(items) { return items }
            guard ContinuousClock.now < deadline else {
                throw TimedOut(description: "timed out waiting for \(what); saw \(items)")
            }
            try await Task.sleep(for: .milliseconds(5))
        }
    }
}

/// What the test server's delegate reports.
enum ServerRecord: Sendable, Equatable {
    case event(Endpoint.Handle, ConnectionEvent)
    case datagram(Endpoint.Handle, [UInt8])
    case rebound
}

/// Records everything into a stream; optionally echoes each datagram back from the event loop, as the
/// relay's fan-out would (the reply leaves in the same flush as the read cycle).
final class RecordingDelegate: WireServerDelegate {
    let sink: AsyncStream<ServerRecord>.Continuation
    let echoPrefix: [UInt8]?

    init(sink: AsyncStream<ServerRecord>.Continuation, echoPrefix: [UInt8]? = nil) {
        self.sink = sink
        self.echoPrefix = echoPrefix
    }

    func wireServer(_ server: WireServer, handle: Endpoint.Handle, event: ConnectionEvent) {
        sink.yield(.event(handle, event))
    }

    func wireServer(_ server: WireServer, handle: Endpoint.Handle, datagram payload: UnsafeRawBufferPointer) {
        sink.yield(.datagram(handle, Array(payload)))
        if let echoPrefix {
            (echoPrefix + Array(payload)).withUnsafeBytes { _ = server.sendDatagram($0, to: handle) }
        }
    }

    func wireServer(_ server: WireServer, didRebindAfter error: (any Error)?) {
        sink.yield(.rebound)
    }
}

/// A server on 127.0.0.1 with a recording delegate.
func startServer(secrets: ServerSecrets, port: Int = 0, echoPrefix: [UInt8]? = nil, options: UDPOptions = UDPOptions(),
                 group: any EventLoopGroup) async throws -> (WireServer, Recorder<ServerRecord>) {
    let (stream, sink) = AsyncStream.makeStream(of: ServerRecord.self)
    let server = try await WireServer.start(host: "127.0.0.1", port: port, secrets: secrets,
                                            delegate: RecordingDelegate(sink: sink, echoPrefix: echoPrefix), options: options,
                                            group: group)
    return (server, Recorder(stream))
}

/// A fresh event loop group (under `withEventLoopGroup`'s timeout), a server on it with a recording
/// delegate, and a client for it, not yet connected: how most tests here begin.
func withServerAndClient(_ body: @escaping @Sendable (WireServer, Recorder<ServerRecord>, WireClientChannel) async throws -> Void) async throws {
    let pki = try TestPKI()
    let secrets = try pki.secrets()
    try await withEventLoopGroup { group in
        let (server, records) = try await startServer(secrets: secrets, group: group)
        let client = try WireClientChannel(configuration: pki.client(), server: server.localAddress, group: group)
        try await body(server, records, client)
    }
}

extension Recorder<ServerRecord> {
    /// The handle of the first connection the server reports connected.
    func connectedHandle(_ what: String) async throws -> Endpoint.Handle {
        try await wait(what) { !$0.connectedHandles.isEmpty }.connectedHandles[0]
    }
}

extension [ServerRecord] {
    var connectedHandles: [Endpoint.Handle] {
        compactMap { if case .event(let handle, .connected) = $0 { return handle } else { return nil } }
    }

    func controls(_ handle: Endpoint.Handle) -> [[UInt8]] {
        compactMap { if case .event(handle, .control(let message)) = $0 { return message } else { return nil } }
    }

    func datagrams(_ handle: Endpoint.Handle) -> [[UInt8]] {
        compactMap { if case .datagram(handle, let payload) = $0 { return payload } else { return nil } }
    }
}

extension [ClientEvent] {
    var controls: [[UInt8]] {
        compactMap { if case .connection(.control(let message)) = $0 { return message } else { return nil } }
    }
}

func bytes(_ text: String) -> [UInt8] { Array(text.utf8) }

/// A UDP socket bound to a port, from outside NIO, as another process would hold it.
final class Squatter: Sendable {
    private let fd = Mutex<CInt>(-1)

    var descriptor: CInt { fd.withLock { $0 } }

    func bind(port: Int) {
        let socket = Glibc.socket(AF_INET, Int32(SOCK_DGRAM.rawValue), 0)
        guard socket >= 0 else { return }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Glibc.bind(socket, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard bound == 0 else {
            _ = Glibc.close(socket)
            return
        }
        fd.withLock { $0 = socket }
    }

    func release() {
        fd.withLock { fd in
            if fd >= 0 { _ = Glibc.close(fd) }
            fd = -1
        }
    }
}
