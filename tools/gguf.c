/* gguf.c - GGUF metadata (gguf.h). */
#include "gguf.h"
