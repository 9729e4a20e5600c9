import Foundation

/// Reads a PEM file's text, or says which of the ways it can fail it is: the server's certificate
/// and key (`ServerIdentity.load`) and a client's CA file (PTTClient) each word the failure for
/// their own flags and advice.
public enum PEMText {
    public enum Problem: Error, Sendable, Equatable {
        case missing, directory, unreadable, notText
    }

    public static func read(_ path: String) throws(Problem) -> String {
        var isDirectory: ObjCBool = false
        guard FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory) else { throw .missing }
        guard !isDirectory.boolValue else { throw .directory }
        guard let data = FileManager.default.contents(atPath: path) else { throw .unreadable }
        guard let text = String(data: data, encoding: .utf8) else { throw .notText }
        return text
    }
}
