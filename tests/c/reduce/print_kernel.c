/* Writes the device reduction kernel's text (runtime/reduce_kernel.c) to
 * the file named by argv[1], for kernel_emu.cpp to compile on the host. */
#include <stdio.h>

extern const char hetccl_rtc_kernel_source[];

int main(int argc, char **argv) {
  FILE *f = argc > 1 ? fopen(argv[1], "w") : NULL;
  if (!f) return 1;
  int ok = fputs(hetccl_rtc_kernel_source, f) >= 0;
  return fclose(f) == 0 && ok ? 0 : 1;
}
