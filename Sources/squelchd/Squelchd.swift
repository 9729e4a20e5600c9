@main struct Squelchd { static func main() {} }
