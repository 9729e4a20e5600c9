import Foundation
import Hummingbird
import HummingbirdTesting
import Testing
@testable import PTTServer

@Suite struct AdminAPITests {
    /// Over a real socket on 127.0.0.1 (`.live`), not the in-process router.
    @Test func healthzAnswersWithVersionAndCertificate() async throws {
        let app = Application(router: AdminAPI.router(identitySummary: "CN=test"),
                              configuration: .init(address: .hostname("127.0.0.1", port: 0)))
        try await app.test(.live) { client in
            try await client.execute(uri: "/healthz", method: .get) { response in
                #expect(response.status == .ok)
                let health = try JSONDecoder().decode(AdminAPI.Health.self, from: Data(buffer: response.body))
                #expect(health.status == "ok")
                #expect(health.certificate == "CN=test")
                #expect(health.uptimeSeconds >= 0)
            }
            try await client.execute(uri: "/nope", method: .get) { response in
                #expect(response.status == .notFound)
            }
        }
    }

    @Test func configurationRefusesBadValuesWithAdvice() throws {
        var config = ServerConfiguration()
        config.adminPort = 70_000
        #expect(throws: ServerConfiguration.ConfigurationError.self) { try config.prepare() }

        let file = FileManager.default.temporaryDirectory.appendingPathComponent("squelch-notadir-\(UUID())").path
        _ = FileManager.default.createFile(atPath: file, contents: Data())
        config = ServerConfiguration()
        config.dataDirectory = file
        let error = #expect(throws: ServerConfiguration.ConfigurationError.self) { try config.prepare() }
        #expect(String(describing: try #require(error)).contains("--data-dir"))
    }

    @Test func dataDirectoryIsCreatedPrivate() throws {
        var config = ServerConfiguration()
        config.dataDirectory = FileManager.default.temporaryDirectory.appendingPathComponent("squelch-data-\(UUID())/nested").path
        try config.prepare()
        let attributes = try FileManager.default.attributesOfItem(atPath: config.dataDirectory)
        #expect((attributes[.posixPermissions] as? NSNumber)?.intValue == 0o700)
    }
}
