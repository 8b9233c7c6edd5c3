// kernel_emu.cpp: the four modes of operator EMU_OP.
#define EMU_MODE 0
#include "kernel_emu_variant.h"
#undef EMU_MODE
#define EMU_MODE 1
#include "kernel_emu_variant.h"
#undef EMU_MODE
#define EMU_MODE 2
#include "kernel_emu_variant.h"
#undef EMU_MODE
#define EMU_MODE 3
#include "kernel_emu_variant.h"
#undef EMU_MODE
