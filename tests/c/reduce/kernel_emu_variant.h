// kernel_emu.cpp: the kernel text for (EMU_OP, EMU_MODE) in a namespace of
// its own, its entry point renamed (it is extern "C").
#if EMU_OP == 0
#define HK_OP_SUM
#elif EMU_OP == 1
#define HK_OP_PROD
#elif EMU_OP == 2
#define HK_OP_MAX
#else
#define HK_OP_MIN
#endif
#if EMU_MODE == 1
#define HK_FINISH
#elif EMU_MODE >= 2
#define HK_SCALE_A
#define HK_SCALE_B
#if EMU_MODE == 3
#define HK_SCALAR_DEV
#endif
#endif
#define hetccl_reduce_kernel EMU_KERNEL(EMU_OP, EMU_MODE)
#define hetccl_reduce_run_kernel EMU_RUN_KERNEL(EMU_OP, EMU_MODE)
namespace EMU_CAT4(ns, EMU_TYPE, EMU_OP, EMU_MODE) {
#include "reduce_kernel.inc"
}
#undef hetccl_reduce_kernel
#undef hetccl_reduce_run_kernel
#undef HK_OP_SUM
#undef HK_OP_PROD
#undef HK_OP_MAX
#undef HK_OP_MIN
#undef HK_FINISH
#undef HK_SCALE_A
#undef HK_SCALE_B
#undef HK_SCALAR_DEV
