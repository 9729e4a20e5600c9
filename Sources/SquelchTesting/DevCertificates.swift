import Foundation

/// The dev certificates and APNs key, made once per test process by certs/make-dev-certs.sh in a temporary
/// directory (the repository's certs/ may not exist on a fresh clone).
public enum DevCertificates {
    public static let directory: String = {
        // Sources/SquelchTesting/DevCertificates.swift → the repository root.
        let repository = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent()
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("squelch-apns-certs-\(UUID())").path
        let script = Process()
        script.executableURL = repository.appendingPathComponent("certs/make-dev-certs.sh")
        script.arguments = [directory]
        script.standardOutput = FileHandle.nullDevice
        do { try script.run() } catch { fatalError("cannot run certs/make-dev-certs.sh: \(error)") }
        script.waitUntilExit()
        precondition(script.terminationStatus == 0, "certs/make-dev-certs.sh failed")
        return directory
    }()

    public static var p8: String { "\(directory)/AuthKey_DEVKEY0001.p8" }
    public static var ca: String { "\(directory)/ca.pem" }
    public static var simulatorCertificate: String { "\(directory)/apns-sim.pem" }
    public static var simulatorKey: String { "\(directory)/apns-sim.key" }
}
