import ClusterPlacement
import Foundation
import KeyFiles

extension ServerConfiguration {
    /// The file a generated node id is kept in.
    public static let nodeIDFileName = "node-id"

    /// An address that means "every address of this machine": clients cannot be sent to it.
    static func isWildcard(_ host: String) -> Bool {
        ["0.0.0.0", "::", "[::]", "*", ""].contains(host)
    }

    /// Where redirects send clients to reach this node.
    public var advertisedHost: String { advertiseHost ?? Self.unbracketed(host) }

    /// This node's id: the configured one, or one made at the first start and kept in the data
    /// directory, so that a restarted node is the same node to the cluster.
    public func resolveNodeID() throws(ConfigurationError) -> NodeID {
        if let nodeID { return NodeID(nodeID) }
        let path = URL(fileURLWithPath: dataDirectory).appendingPathComponent(Self.nodeIDFileName).path
        if let kept = try? String(contentsOfFile: path, encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines), !kept.isEmpty {
            return NodeID(kept)
        }
        let host = ProcessInfo.processInfo.hostName.split(separator: ".").first.map(String.init) ?? "node"
        let made = "\(host)-\(UUID().uuidString.prefix(8).lowercased())"
        do {
            if try KeyFiles.createOnce(at: path, contents: Array((made + "\n").utf8)) == .exists {
                return NodeID((try? String(contentsOfFile: path, encoding: .utf8))?.trimmingCharacters(in: .whitespacesAndNewlines) ?? made)
            }
        } catch {
            throw .dataDirectory(path: dataDirectory, reason: "cannot keep the node id in \(path) (\(error.description))")
        }
        return NodeID(made)
    }
}
