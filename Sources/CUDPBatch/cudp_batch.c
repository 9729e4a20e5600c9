#define _GNU_SOURCE
#include "cudp_batch.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

int cudp_send_batch(int fd, const cudp_message *messages, unsigned int count) {
    struct mmsghdr headers[CUDP_BATCH_CHUNK];
    struct iovec vectors[CUDP_BATCH_CHUNK];
    if (count > CUDP_BATCH_CHUNK) count = CUDP_BATCH_CHUNK;
    if (count == 0) return 0;
    memset(headers, 0, sizeof(struct mmsghdr) * count);
    for (unsigned int i = 0; i < count; i++) {
        vectors[i].iov_base = (void *)messages[i].bytes;
        vectors[i].iov_len = messages[i].length;
        headers[i].msg_hdr.msg_name = (void *)messages[i].address;
        headers[i].msg_hdr.msg_namelen = (socklen_t)messages[i].address_length;
        headers[i].msg_hdr.msg_iov = &vectors[i];
        headers[i].msg_hdr.msg_iovlen = 1;
    }
    int sent;
    do {
        sent = sendmmsg(fd, headers, count, MSG_DONTWAIT);
    } while (sent < 0 && errno == EINTR);
    return sent < 0 ? -errno : sent;
}
