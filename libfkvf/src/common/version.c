#include "fkvf.h"

FKVF_API unsigned fkvf_version_number(void) { return FKVF_VERSION_NUMBER; }
FKVF_API const char *fkvf_version_string(void) { return FKVF_VERSION_STRING; }
