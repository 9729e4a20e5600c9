import ArgumentParser
import CUDPBatch
import Foundation
import WireNIO
#if canImport(Glibc)
import Glibc
#endif

/// What the fan-out costs the kernel alone on this machine: N datagrams the size of a sealed
/// 80-byte copy, already built, sent with one thread's `sendmmsg` to N loopback sockets, as the
/// server's relay sends them but with no sealing, no connection state and no other work. The
/// server's fan-out figures are read against it: with one sending thread the server cannot spend
/// less CPU per datagram, nor reach its last listener sooner.
///
/// A reader thread waits in `poll` on all N sockets and drains them, as the listeners do:
/// on loopback, delivering into a socket and waking its reader is part of the send's cost, paid in
/// the sender's time. Bursts go 20 ms apart, as the talker's packets do.
struct KernelFloor {
    /// The size on the wire of a relayed 80-byte Opus payload: its audio header, a short header
    /// with an 8-byte connection ID, a DATAGRAM frame and the AEAD tag.
    static let datagramSize = 114

    struct Result {
        /// The sending thread's CPU per datagram (`CLOCK_THREAD_CPUTIME_ID` around the sends).
        var cpuMicroseconds: Double
        /// Wall time of a whole burst, until the last datagram's send returns: p50, p99.
        var burstP50: Double
        var burstP99: Double

        func row(destinations: Int) -> String {
            "\(String(destinations).padding(toLength: 9, withPad: " ", startingAt: 0))  "
                + "\(fixed(cpuMicroseconds)) µs".padding(toLength: 12, withPad: " ", startingAt: 0)
                + "  \(fixed(burstP50 * 1e6, 0))/\(fixed(burstP99 * 1e6, 0)) µs"
        }
    }

    let destinations: Int
    let bursts: Int

    func run() throws -> Result {
        // Sender and receivers are made as the server makes its socket (DF set, non-blocking).
        var receivers: [CInt] = []
        defer { receivers.forEach { _ = close($0) } }
        let addresses = UnsafeMutablePointer<sockaddr_in>.allocate(capacity: destinations)
        defer { addresses.deallocate() }
        for index in 0..<destinations {
            let receiver = try boundUDPSocket(host: "127.0.0.1", port: 0)
            receivers.append(receiver)
            var size = socklen_t(MemoryLayout<sockaddr_in>.size)
            let named = (addresses + index).withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(receiver, $0, &size) }
            guard named == 0 else { throw ValidationError("getsockname: \(String(cString: strerror(errno)))") }
        }
        let sender = try boundUDPSocket(host: "127.0.0.1", port: 0)
        defer { _ = close(sender) }
        let reader = try Reader(sockets: receivers)
        defer { reader.stop() }

        let bytes = UnsafeMutableRawPointer.allocate(byteCount: Self.datagramSize * destinations, alignment: 16)
        defer { bytes.deallocate() }
        bytes.initializeMemory(as: UInt8.self, repeating: 0x5A, count: Self.datagramSize * destinations)
        let messages = UnsafeMutablePointer<cudp_message>.allocate(capacity: destinations)
        defer { messages.deallocate() }
        for index in 0..<destinations {
            messages[index] = cudp_message(bytes: bytes + index * Self.datagramSize, length: Self.datagramSize,
                                           address: UnsafeRawPointer(addresses + index),
                                           address_length: UInt32(MemoryLayout<sockaddr_in>.size))
        }

        var walls: [Double] = []
        var cpu = 0.0
        for _ in 0 ..< bursts {
            let cpu0 = clock(CLOCK_THREAD_CPUTIME_ID), wall0 = clock(CLOCK_MONOTONIC)
            var index = 0
            while index < destinations {
                let sent = cudp_send_batch(sender, messages + index, UInt32(destinations - index))
                guard sent > 0 else { throw ValidationError("sendmmsg: \(String(cString: strerror(-sent)))") }
                index += Int(sent)
            }
            walls.append(clock(CLOCK_MONOTONIC) - wall0)
            cpu += clock(CLOCK_THREAD_CPUTIME_ID) - cpu0
            Thread.sleep(forTimeInterval: 0.02)
        }
        walls.sort()
        return Result(cpuMicroseconds: cpu * 1e6 / Double(bursts * destinations),
                      burstP50: percentile(walls, 0.5), burstP99: percentile(walls, 0.99))
    }

    private func clock(_ id: clockid_t) -> Double {
        var time = timespec()
        clock_gettime(id, &time)
        return Double(time.tv_sec) + Double(time.tv_nsec) / 1e9
    }

    /// A thread blocked in `poll` on the receiving sockets that reads whatever arrives, until
    /// `stop()` writes to its pipe.
    struct Reader {
        let stopPipe: (read: CInt, write: CInt)
        let done = DispatchSemaphore(value: 0)

        init(sockets: [CInt]) throws {
            var ends: [CInt] = [0, 0]
            guard pipe(&ends) == 0 else { throw ValidationError("pipe: \(String(cString: strerror(errno)))") }
            stopPipe = (ends[0], ends[1])
            let stop = ends[0]
            let done = self.done
            Thread.detachNewThread {
                var descriptors = (sockets + [stop]).map { pollfd(fd: $0, events: Int16(POLLIN), revents: 0) }
                var buffer = [UInt8](repeating: 0, count: 2048)
                loop: while true {
                    guard poll(&descriptors, nfds_t(descriptors.count), -1) >= 0 || errno == EINTR else { break }
                    for index in descriptors.indices where descriptors[index].revents != 0 {
                        descriptors[index].revents = 0
                        if descriptors[index].fd == stop { break loop }
                        while recv(descriptors[index].fd, &buffer, buffer.count, CInt(MSG_DONTWAIT)) > 0 {}
                    }
                }
                done.signal()
            }
        }

        func stop() {
            var one: UInt8 = 1
            _ = write(stopPipe.write, &one, 1)
            done.wait()
            _ = close(stopPipe.read)
            _ = close(stopPipe.write)
        }
    }
}
