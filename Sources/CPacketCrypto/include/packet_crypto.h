#ifndef PACKET_CRYPTO_H
#define PACKET_CRYPTO_H
#include <stddef.h>
#include <stdint.h>

/* In-place packet protection on libcrypto's EVP interface. swift-crypto's AEADs return a new
   buffer per call (about 3 us for 100 bytes here); these keep one cipher context per key and
   seal or open in place, so the data path allocates nothing.

   suite: 1 = AES-128-GCM, 2 = ChaCha20-Poly1305 (tags are 16 bytes, nonces 12 bytes). */
typedef struct sq_aead sq_aead;
typedef struct sq_hp sq_hp;

/* encrypt = 1 for a sealing context, 0 for an opening one. NULL on a bad suite or key length. */
sq_aead *sq_aead_new(int suite, const uint8_t *key, size_t key_len, int encrypt);
void sq_aead_free(sq_aead *ctx);
/* Encrypts `inout` in place and writes the 16-byte tag. 1 on success. */
int sq_aead_seal(sq_aead *ctx, const uint8_t *nonce, const uint8_t *aad, size_t aad_len,
                 uint8_t *inout, size_t len, uint8_t *tag);
/* Decrypts `inout` in place. 1 when the tag verifies, 0 otherwise (then `inout` is garbage). */
int sq_aead_open(sq_aead *ctx, const uint8_t *nonce, const uint8_t *aad, size_t aad_len,
                 uint8_t *inout, size_t len, const uint8_t *tag);

/* Header protection (RFC 9001 5.4): a 5-byte mask from a 16-byte ciphertext sample. */
sq_hp *sq_hp_new(int suite, const uint8_t *key, size_t key_len);
void sq_hp_free(sq_hp *ctx);
int sq_hp_mask(sq_hp *ctx, const uint8_t *sample, uint8_t *mask);
#endif
