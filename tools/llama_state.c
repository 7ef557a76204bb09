/* llama_state.c - llama.cpp state files (llama_state.h). */
#include "llama_state.h"
