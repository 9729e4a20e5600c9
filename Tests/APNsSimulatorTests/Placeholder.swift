import Testing
@testable import APNsSimulator
