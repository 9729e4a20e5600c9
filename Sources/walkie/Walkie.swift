@main struct Walkie { static func main() {} }
