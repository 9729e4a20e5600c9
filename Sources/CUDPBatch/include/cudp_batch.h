#ifndef CUDP_BATCH_H
#define CUDP_BATCH_H

#include <stddef.h>

/// One datagram of a batch: its bytes and its destination (a sockaddr_in or sockaddr_in6).
/// Declared here rather than exposing `struct mmsghdr`, which glibc only declares under
/// _GNU_SOURCE, and Swift's Glibc module is built without it.
typedef struct {
    const void *bytes;
    size_t length;
    const void *address;
    unsigned int address_length;
} cudp_message;

/// At most this many datagrams go to the kernel per call (the headers live on the stack).
#define CUDP_BATCH_CHUNK 256

/// Sends up to CUDP_BATCH_CHUNK of `messages` with one sendmmsg(2), never blocking, retrying on
/// EINTR. Returns how many the kernel took (> 0), or -errno for the first one it refused.
int cudp_send_batch(int fd, const cudp_message *messages, unsigned int count);

#endif
