/// A local APNs that answers as Apple's does, for the wake path on Linux (issue 5).
public enum APNsSimulator {}
