@main struct Bench { static func main() {} }
