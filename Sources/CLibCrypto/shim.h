#ifndef CLIBCRYPTO_SHIM_H
#define CLIBCRYPTO_SHIM_H
#include <openssl/evp.h>
#endif
