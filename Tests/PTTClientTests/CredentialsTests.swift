import APNsSimulatorEmbedding
import Audio
import ChannelProtocol
import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import ImpairmentKit
import JitterBuffer
import enum NIOCore.SocketAddress
import NIOConcurrencyHelpers
import Opus
import PTTClient
import SquelchTesting
import Testing
import Wire
import WireTesting
import X509

@Suite struct CredentialsTests {
    /// The credentials are saved for restoration; an app restored from another directory (a service,
    /// a shell elsewhere) must still find its CA.
    @Test func aRelativeCAPathIsMadeAbsoluteAgainstTheCurrentDirectory() throws {
        let here = FileManager.default.currentDirectoryPath
        let relative = ChannelCredentials(host: "127.0.0.1", port: 7700, caPath: "certs/../certs/ca.pem", token: "t")
        #expect(relative.caPath == URL(fileURLWithPath: here).appendingPathComponent("certs/ca.pem").standardizedFileURL.path)
        #expect(relative.caPath.hasPrefix("/"))
        let absolute = ChannelCredentials(host: "127.0.0.1", port: 7700, caPath: "/etc/squelch/ca.pem", token: "t")
        #expect(absolute.caPath == "/etc/squelch/ca.pem")
        // Saved and read back as it was made.
        let saved = try JSONDecoder().decode(ChannelCredentials.self, from: JSONEncoder().encode(relative))
        #expect(saved == relative)
    }
}
