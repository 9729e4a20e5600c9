#include <alsa/asoundlib.h>
#include "calsa_shim.h"

static void calsa_quiet_handler(const char *file, int line, const char *function, int err, const char *fmt, ...) {
    (void)file; (void)line; (void)function; (void)err; (void)fmt;
}

void calsa_silence_errors(void) { snd_lib_error_set_handler(calsa_quiet_handler); }
void calsa_restore_errors(void) { snd_lib_error_set_handler(NULL); }
