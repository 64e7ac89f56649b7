// engram_version(): the release this build of the library belongs to (engram/version.h).
#include "engram/version.h"

extern "C" const char* engram_version(void) { return ENGRAM_VERSION; }
