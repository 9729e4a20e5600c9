/// A min-heap of timed events; events at the same time come out in the order they were pushed, so a
/// seeded run repeats exactly.
struct EventQueue<Payload> {
    private struct Entry {
        var time: Int64
        var sequence: UInt64
        var payload: Payload

        func precedes(_ other: Entry) -> Bool {
            time != other.time ? time < other.time : sequence < other.sequence
        }
    }

    private var heap: [Entry] = []
    private var pushed: UInt64 = 0

    var isEmpty: Bool { heap.isEmpty }

    mutating func push(at time: Int64, _ payload: Payload) {
        heap.append(Entry(time: time, sequence: pushed, payload: payload))
        pushed += 1
        var child = heap.count - 1
        while child > 0 {
            let parent = (child - 1) / 2
            guard heap[child].precedes(heap[parent]) else { break }
            heap.swapAt(child, parent)
            child = parent
        }
    }

    mutating func pop() -> (time: Int64, payload: Payload)? {
        guard !heap.isEmpty else { return nil }
        heap.swapAt(0, heap.count - 1)
        let top = heap.removeLast()
        var parent = 0
        while true {
            let left = 2 * parent + 1, right = left + 1
            var smallest = parent
            if left < heap.count, heap[left].precedes(heap[smallest]) { smallest = left }
            if right < heap.count, heap[right].precedes(heap[smallest]) { smallest = right }
            if smallest == parent { break }
            heap.swapAt(parent, smallest)
            parent = smallest
        }
        return (top.time, top.payload)
    }
}
