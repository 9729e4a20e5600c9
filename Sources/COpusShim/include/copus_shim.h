#ifndef COPUS_SHIM_H
#define COPUS_SHIM_H
#include <opus/opus.h>

/* opus_encoder_ctl and opus_decoder_ctl are C variadics, which Swift cannot call.
   Every SET request takes one opus_int32 and most GET requests one opus_int32*,
   so four fixed-arity wrappers cover all the requests we use. */
int copus_encoder_set(OpusEncoder *st, int request, opus_int32 value);
int copus_encoder_get(OpusEncoder *st, int request, opus_int32 *value);
int copus_decoder_set(OpusDecoder *st, int request, opus_int32 value);
int copus_decoder_get(OpusDecoder *st, int request, opus_int32 *value);
int copus_encoder_reset(OpusEncoder *st);
int copus_decoder_reset(OpusDecoder *st);
#endif
