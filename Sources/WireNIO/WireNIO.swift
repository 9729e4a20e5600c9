/// SwiftNIO UDP adapters that drive `Wire` connections and endpoints (issue 3).
public enum WireNIO {}
