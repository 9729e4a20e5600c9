/// A first-in, first-out queue that reuses its storage: the events connections, the endpoint and the
/// client hand out through `nextEvent()`, and the endpoint's output (connections with something to
/// send, stateless replies), which `poll` serves in the order it was queued.
struct FIFOQueue<Element> {
    private var items: [Element] = []
    private var head = 0

    var first: Element? { head < items.count ? items[head] : nil }

    mutating func append(_ element: Element) { items.append(element) }

    mutating func next() -> Element? {
        guard head < items.count else { return nil }
        let element = items[head]
        head += 1
        if head == items.count {
            items.removeAll(keepingCapacity: true)
            head = 0
        } else if head >= 64, head * 2 >= items.count {
            // Never drained to empty (a poll loop cut short while more is queued): drop the served
            // prefix before it outgrows the queue itself.
            items.removeFirst(head)
            head = 0
        }
        return element
    }
}
