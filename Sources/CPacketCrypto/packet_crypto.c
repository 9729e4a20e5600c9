#include "packet_crypto.h"
#include <openssl/evp.h>
#include <stdlib.h>
#include <string.h>

struct sq_aead { EVP_CIPHER_CTX *ctx; int encrypt; };
struct sq_hp { EVP_CIPHER_CTX *ctx; int suite; };

static const EVP_CIPHER *aead_cipher(int suite, size_t key_len) {
    if (suite == 1 && key_len == 16) return EVP_aes_128_gcm();
    if (suite == 2 && key_len == 32) return EVP_chacha20_poly1305();
    return NULL;
}

sq_aead *sq_aead_new(int suite, const uint8_t *key, size_t key_len, int encrypt) {
    const EVP_CIPHER *cipher = aead_cipher(suite, key_len);
    if (!cipher) return NULL;
    sq_aead *a = calloc(1, sizeof *a);
    if (!a) return NULL;
    a->ctx = EVP_CIPHER_CTX_new();
    a->encrypt = encrypt;
    /* The key schedule runs once here; each packet only resets the nonce. */
    if (!a->ctx || EVP_CipherInit_ex(a->ctx, cipher, NULL, NULL, NULL, encrypt) != 1 ||
        EVP_CIPHER_CTX_ctrl(a->ctx, EVP_CTRL_AEAD_SET_IVLEN, 12, NULL) != 1 ||
        EVP_CipherInit_ex(a->ctx, NULL, NULL, key, NULL, encrypt) != 1) {
        sq_aead_free(a);
        return NULL;
    }
    return a;
}

void sq_aead_free(sq_aead *a) {
    if (!a) return;
    EVP_CIPHER_CTX_free(a->ctx);
    free(a);
}

int sq_aead_seal(sq_aead *a, const uint8_t *nonce, const uint8_t *aad, size_t aad_len,
                 uint8_t *inout, size_t len, uint8_t *tag) {
    int n = 0;
    if (!a->encrypt || len > 0x7fffffff || aad_len > 0x7fffffff) return 0;
    if (EVP_EncryptInit_ex(a->ctx, NULL, NULL, NULL, nonce) != 1) return 0;
    if (aad_len && EVP_EncryptUpdate(a->ctx, NULL, &n, aad, (int)aad_len) != 1) return 0;
    if (len && EVP_EncryptUpdate(a->ctx, inout, &n, inout, (int)len) != 1) return 0;
    if (EVP_EncryptFinal_ex(a->ctx, inout + len, &n) != 1) return 0;
    return EVP_CIPHER_CTX_ctrl(a->ctx, EVP_CTRL_AEAD_GET_TAG, 16, tag) == 1;
}

int sq_aead_open(sq_aead *a, const uint8_t *nonce, const uint8_t *aad, size_t aad_len,
                 uint8_t *inout, size_t len, const uint8_t *tag) {
    int n = 0;
    uint8_t tag_copy[16];
    if (a->encrypt || len > 0x7fffffff || aad_len > 0x7fffffff) return 0;
    memcpy(tag_copy, tag, 16);
    if (EVP_DecryptInit_ex(a->ctx, NULL, NULL, NULL, nonce) != 1) return 0;
    if (aad_len && EVP_DecryptUpdate(a->ctx, NULL, &n, aad, (int)aad_len) != 1) return 0;
    if (len && EVP_DecryptUpdate(a->ctx, inout, &n, inout, (int)len) != 1) return 0;
    if (EVP_CIPHER_CTX_ctrl(a->ctx, EVP_CTRL_AEAD_SET_TAG, 16, tag_copy) != 1) return 0;
    return EVP_DecryptFinal_ex(a->ctx, inout + len, &n) == 1;
}

sq_hp *sq_hp_new(int suite, const uint8_t *key, size_t key_len) {
    const EVP_CIPHER *cipher = NULL;
    if (suite == 1 && key_len == 16) cipher = EVP_aes_128_ecb();
    if (suite == 2 && key_len == 32) cipher = EVP_chacha20();
    if (!cipher) return NULL;
    sq_hp *h = calloc(1, sizeof *h);
    if (!h) return NULL;
    h->suite = suite;
    h->ctx = EVP_CIPHER_CTX_new();
    if (!h->ctx || EVP_EncryptInit_ex(h->ctx, cipher, NULL, key, NULL) != 1) {
        sq_hp_free(h);
        return NULL;
    }
    EVP_CIPHER_CTX_set_padding(h->ctx, 0);
    return h;
}

void sq_hp_free(sq_hp *h) {
    if (!h) return;
    EVP_CIPHER_CTX_free(h->ctx);
    free(h);
}

int sq_hp_mask(sq_hp *h, const uint8_t *sample, uint8_t *mask) {
    uint8_t out[16];
    int n = 0;
    if (h->suite == 1) {
        /* AES-ECB of the sample; the first five bytes are the mask. */
        if (EVP_EncryptUpdate(h->ctx, out, &n, sample, 16) != 1 || n != 16) return 0;
    } else {
        /* ChaCha20 keystream with counter = sample[0..4] (little-endian) and nonce = sample[4..16];
           libcrypto's 16-byte ChaCha20 IV is exactly that layout. */
        static const uint8_t zeros[5] = {0};
        if (EVP_EncryptInit_ex(h->ctx, NULL, NULL, NULL, sample) != 1) return 0;
        if (EVP_EncryptUpdate(h->ctx, out, &n, zeros, 5) != 1 || n != 5) return 0;
    }
    memcpy(mask, out, 5);
    return 1;
}
