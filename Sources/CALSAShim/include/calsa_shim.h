#ifndef CALSA_SHIM_H
#define CALSA_SHIM_H

/* ALSA reports errors by printing "ALSA lib ..." lines on stderr through a
   variadic handler. Swift cannot write a C-variadic callback, so this shim
   installs a handler that discards them (a terminal UI must not be garbled).
   Errors still reach us as return codes. */
void calsa_silence_errors(void);
/* Restores ALSA's default stderr handler (for debugging). */
void calsa_restore_errors(void);
#endif
