/* The command line: nccl-tests' options with nccl-tests' meanings (its
 * README and usage text are the reference); one it has that hetccl-perf
 * cannot honour is refused by name, never ignored. hetccl-perf's own
 * options are long ones that nccl-tests does not use. */
#define _GNU_SOURCE
#include <getopt.h>
#include <libgen.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "perf.h"

static void usage(FILE *f)
{
  fprintf(f,
    "usage: hetccl-perf COLLECTIVE [options]\n"
    "  COLLECTIVE: all_reduce all_gather broadcast reduce reduce_scatter alltoall\n"
    "              gather scatter sendrecv (or run as a link named all_reduce_perf ...)\n"
    "nccl-tests' options, with their meanings:\n"
    "  -t, --nthreads T          threads per process (default 1)\n"
    "  -g, --ngpus G             ranks per thread, one group over G communicators (default 1)\n"
    "  -b, --minbytes N          smallest size (K, M, G suffixes; default 32M)\n"
    "  -e, --maxbytes N          largest size (default 32M)\n"
    "  -i, --stepbytes N         step between sizes when -f is 1 (default 1M)\n"
    "  -f, --stepfactor F        multiply the size by F each step (default 1: use -i)\n"
    "  -o, --op OP               sum prod max min avg, or all (default sum)\n"
    "  -d, --datatype T          int8 uint8 int32 uint32 int64 uint64 half float double\n"
    "                            bfloat16 f8e4m3 f8e5m2, or all (default float)\n"
    "  -r, --root R              root rank of broadcast, reduce, gather, scatter (default 0)\n"
    "  -n, --iters N             timed iterations per size (default 20)\n"
    "  -w, --warmup_iters N      untimed iterations before each timed run (default 5)\n"
    "  -m, --agg_iters N         operations in one group per iteration (default 1); the\n"
    "                            time is per operation\n"
    "  -N, --run_cycles N        run the sweep N times, 0 for ever (default 1)\n"
    "  -a, --average 0-3         time reported: 0 rank 0, 1 mean, 2 min, 3 max over ranks\n"
    "                            (default 1)\n"
    "  -p, --parallel_init 0|1   each thread makes its own ranks (ncclCommInitRank in a\n"
    "                            group) rather than one ncclCommInitAll (default 0)\n"
    "  -c, --check N             check every output element, N times per size (default 1)\n"
    "  -z, --blocking 0-3        0 none; after each iteration 1 wait and barrier, 2 wait,\n"
    "                            3 wait and barrier, the barrier left out of the time\n"
    "  -y, --stream_null 0|1     the default (NULL) stream with -g 1 and CUDA memory\n"
    "  -T, --timeout S           a size whose test runs past S seconds ends the program\n"
    "                            (status 1; default 0: none)\n"
    "  -C, --report_cputime 0|1  report the time to issue the operations, not to finish\n"
    "  -S, --report_timestamps 0|1  a timestamp at the end of each row\n"
    "  -R, --local_register 0|1  register the buffers with ncclCommRegister (1)\n"
    "  -u, --unalign N           buffers start N elements past an aligned address\n"
    "  -J, --output_file FILE    also write every row as JSON to FILE (hetccl plot reads it;\n"
    "                            --json is the same)\n"
    "  -h, --help\n"
    "Refused with an error (hetccl-perf cannot honour them): -G N > 0 (CUDA graphs),\n"
    "-R 2 (symmetric windows), -x (CTA policy), -D N > 0 and -V (device implementations),\n"
    "-M 1 (GPU memory report), -I 1 and -K N > 0 (per-iteration timing), NCCL_TESTS_SPLIT.\n"
    "hetccl-perf's own:\n"
    "      --mem_type host|cuda  buffer memory (default host; cuda loads libcudart at run time)\n"
    "      --progress S|off      a progress line on stderr once a sweep has run S seconds\n"
    "                            (default 2)\n"
    "Environment: NCCL_TESTS_MIN_BW=B fails the run (status 1) when the average bus\n"
    "bandwidth is below 0.9 * B GB/s, as nccl-tests does.\n"
    "Ranks: under `hetccl run -n N` (HETCCL_LAUNCH_* set) process p runs ranks\n"
    "p*T*G .. p*T*G+T*G-1 of N*T*G; otherwise one process runs T*G ranks made by\n"
    "ncclCommInitAll. The library is $HETCCL_PERF_LIB, else libhetccl.so beside the\n"
    "program or in ../libhetccl/.\n");
}

/* "64", "1K", "32M", "2G", "4KiB", "8MB" (all powers of 1024, as nccl-tests) */
static int parse_size(const char *s, size_t *out)
{
  char *end;
  double v = strtod(s, &end);
  if (end == s || v < 0)
    return -1;
  double mult = 1;
  switch (*end) {
  case 'k': case 'K': mult = 1024.0; end++; break;
  case 'm': case 'M': mult = 1024.0 * 1024; end++; break;
  case 'g': case 'G': mult = 1024.0 * 1024 * 1024; end++; break;
  default: break;
  }
  if (strcmp(end, "") != 0 && strcmp(end, "B") != 0 && strcmp(end, "iB") != 0)
    return -1;
  *out = (size_t)(v * mult);
  return 0;
}

static int parse_int(const char *s, int lo, int hi, int *out)
{
  char *end;
  long v = strtol(s, &end, 10);
  if (end == s || *end || v < lo || v > hi)
    return -1;
  *out = (int)v;
  return 0;
}

static int parse_types(struct perf_options *o, const char *arg)
{
  o->ntypes = 0;
  if (strcmp(arg, "all") == 0) {
    for (int i = 0; perf_dtype_at(i) && o->ntypes < PERF_MAX_TYPES; i++)
      o->types[o->ntypes++] = perf_dtype_at(i);
    return 0;
  }
  if (!(o->types[0] = perf_dtype_find(arg)))
    return -1;
  o->ntypes = 1;
  return 0;
}

static int parse_ops(struct perf_options *o, const char *arg)
{
  o->nops = 0;
  if (strcmp(arg, "all") == 0) {
    for (int i = 0; perf_redop_at(i) && o->nops < PERF_MAX_OPS; i++)
      o->ops[o->nops++] = perf_redop_at(i);
    return 0;
  }
  if (!(o->ops[0] = perf_redop_find(arg)))
    return -1;
  o->nops = 1;
  return 0;
}

static int bad(const char *flag, const char *arg)
{
  fprintf(stderr, "hetccl-perf: bad value for %s: '%s' (see --help)\n", flag, arg);
  return -1;
}

/* An nccl-tests option hetccl-perf cannot honour: one line, and no run. */
static int refuse(const char *flag, const char *arg, const char *why)
{
  fprintf(stderr, "hetccl-perf: %s %s: not supported: %s\n", flag, arg, why);
  return -1;
}

/* An integer option that only its default value makes sense for here. */
static int only(const char *flag, const char *arg, int allowed, const char *why)
{
  int v;
  if (parse_int(arg, INT32_MIN, INT32_MAX, &v))
    return bad(flag, arg);
  return v == allowed ? 0 : refuse(flag, arg, why);
}

static int parse_mem(struct perf_options *o, const char *arg)
{
  if (strcmp(arg, "host") == 0)
    o->mem = PERF_MEM_HOST;
  else if (strcmp(arg, "cuda") == 0)
    o->mem = PERF_MEM_CUDA;
  else
    return bad("--mem_type", arg);
  return 0;
}

/* -m is nccl-tests' agg_iters; it was hetccl-perf's memory type. */
static int parse_agg(struct perf_options *o, const char *arg)
{
  if (strcmp(arg, "host") == 0 || strcmp(arg, "cuda") == 0) {
    fprintf(stderr, "hetccl-perf: -m %s: -m is the aggregation count (--agg_iters) as in "
                    "nccl-tests; the buffer memory is --mem_type %s\n", arg, arg);
    return -1;
  }
  return parse_int(arg, 1, 1 << 20, &o->agg_iters) ? bad("-m", arg) : 0;
}

enum { OPT_PROGRESS = 256, OPT_MEM_TYPE };

static int parse_one(struct perf_options *o, int c, const char *arg)
{
  switch (c) {
  case 'b': return parse_size(arg, &o->min_bytes) ? bad("-b", arg) : 0;
  case 'e': return parse_size(arg, &o->max_bytes) ? bad("-e", arg) : 0;
  case 'i': return parse_size(arg, &o->step_bytes) ? bad("-i", arg) : 0;
  case 'f': {
    char *end;
    o->step_factor = strtod(arg, &end);
    return end == arg || *end || o->step_factor < 1 ? bad("-f", arg) : 0;
  }
  case 'n': return parse_int(arg, 1, 1 << 30, &o->iters) ? bad("-n", arg) : 0;
  case 'w': return parse_int(arg, 0, 1 << 30, &o->warmup) ? bad("-w", arg) : 0;
  case 'm': return parse_agg(o, arg);
  case 'N': return parse_int(arg, 0, 1 << 30, &o->run_cycles) ? bad("-N", arg) : 0;
  case 'c': return parse_int(arg, 0, 1 << 20, &o->check) ? bad("-c", arg) : 0;
  case 'd': return parse_types(o, arg) ? bad("-d", arg) : 0;
  case 'o':
    if (strcmp(arg, "mulsum") == 0)
      return refuse("-o", arg, "hetccl-perf makes no ncclRedOpCreatePreMulSum operator");
    return parse_ops(o, arg) ? bad("-o", arg) : 0;
  case 'r': return parse_int(arg, 0, 1 << 30, &o->root) ? bad("-r", arg) : 0;
  case 't': return parse_int(arg, 1, 1024, &o->threads) ? bad("-t", arg) : 0;
  case 'g': return parse_int(arg, 1, 1024, &o->gpus) ? bad("-g", arg) : 0;
  case 'z': return parse_int(arg, 0, 3, &o->blocking) ? bad("-z", arg) : 0;
  case 'a': return parse_int(arg, 0, 3, &o->average) ? bad("-a", arg) : 0;
  case 'p': return parse_int(arg, 0, 1, &o->parallel_init) ? bad("-p", arg) : 0;
  case 'y': return parse_int(arg, 0, 1, &o->stream_null) ? bad("-y", arg) : 0;
  case 'T': return parse_int(arg, 0, 1 << 30, &o->timeout_s) ? bad("-T", arg) : 0;
  case 'C': return parse_int(arg, 0, 1, &o->report_cputime) ? bad("-C", arg) : 0;
  case 'S': return parse_int(arg, 0, 1, &o->report_timestamps) ? bad("-S", arg) : 0;
  case 'u': return parse_int(arg, 0, 1 << 20, &o->unalign) ? bad("-u", arg) : 0;
  case 'R': {
    int v;
    if (parse_int(arg, 0, 2, &v))
      return bad("-R", arg);
    if (v == 2)
      return refuse("-R", arg, "hetccl-perf registers no symmetric windows (-R 1: "
                               "ncclCommRegister)");
    o->local_register = v;
    return 0;
  }
  case 'G': return only("-G", arg, 0, "hetccl-perf captures no CUDA graphs");
  case 'x': return refuse("-x", arg, "hetccl-perf sets no CTA policy (it makes its "
                                     "communicators without a config)");
  case 'D': return only("-D", arg, 0, "hetccl-perf has no device-API implementations");
  case 'V': return refuse("-V", arg, "hetccl-perf has no device-API implementations");
  case 'M': return only("-M", arg, 0, "hetccl-perf reports no GPU memory use");
  case 'I': return only("-I", arg, 0, "hetccl-perf records no per-iteration CUDA events");
  case 'K': return only("-K", arg, 0, "per-iteration timing (-I) is not supported");
  case 'J':
    if (!*arg)
      return bad("-J", arg);
    o->json_path = arg;
    return 0;
  case OPT_MEM_TYPE: return parse_mem(o, arg);
  case OPT_PROGRESS: {
    char *end;
    if (strcmp(arg, "off") == 0) {
      o->progress_after = -1;
      return 0;
    }
    o->progress_after = strtod(arg, &end);
    return end == arg || *end || o->progress_after < 0 ? bad("--progress", arg) : 0;
  }
  default: return -1;
  }
}

static void defaults(struct perf_options *o)
{
  memset(o, 0, sizeof *o);
  o->min_bytes = o->max_bytes = 32u << 20;
  o->step_bytes = 1u << 20;
  o->step_factor = 1;
  o->iters = 20;
  o->warmup = 5;
  o->agg_iters = 1;
  o->run_cycles = 1;
  o->check = 1;
  o->threads = o->gpus = 1;
  o->average = 1;
  o->mem = PERF_MEM_HOST;
  o->progress_after = 2;
  parse_types(o, "float");
  parse_ops(o, "sum");
}

/* NCCL_TESTS_SPLIT runs groups of ranks side by side in nccl-tests. */
static int check_env(struct perf_options *o)
{
  const char *names[] = {"NCCL_TESTS_SPLIT", "NCCL_TESTS_SPLIT_MASK"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    const char *v = getenv(names[i]);
    if (v && *v) {
      fprintf(stderr, "hetccl-perf: %s=%s: not supported: hetccl-perf does not split its "
                      "ranks into groups\n", names[i], v);
      return -1;
    }
  }
  const char *bw = getenv("NCCL_TESTS_MIN_BW");
  o->min_bw = -1;
  if (bw && *bw) {
    char *end;
    o->min_bw = strtod(bw, &end);
    if (end == bw || *end || o->min_bw < 0) {
      fprintf(stderr, "hetccl-perf: NCCL_TESTS_MIN_BW=%s is not a bandwidth in GB/s\n", bw);
      return -1;
    }
  }
  return 0;
}

int perf_options_parse(struct perf_options *o, int argc, char **argv)
{
  static const struct option longopts[] = {
    {"nthreads", required_argument, 0, 't'},       {"ngpus", required_argument, 0, 'g'},
    {"minbytes", required_argument, 0, 'b'},       {"maxbytes", required_argument, 0, 'e'},
    {"stepbytes", required_argument, 0, 'i'},      {"stepfactor", required_argument, 0, 'f'},
    {"iters", required_argument, 0, 'n'},          {"agg_iters", required_argument, 0, 'm'},
    {"warmup_iters", required_argument, 0, 'w'},   {"run_cycles", required_argument, 0, 'N'},
    {"parallel_init", required_argument, 0, 'p'},  {"check", required_argument, 0, 'c'},
    {"op", required_argument, 0, 'o'},             {"datatype", required_argument, 0, 'd'},
    {"root", required_argument, 0, 'r'},           {"blocking", required_argument, 0, 'z'},
    {"stream_null", required_argument, 0, 'y'},    {"timeout", required_argument, 0, 'T'},
    {"cudagraph", required_argument, 0, 'G'},      {"report_cputime", required_argument, 0, 'C'},
    {"report_timestamps", required_argument, 0, 'S'},
    {"output_file", required_argument, 0, 'J'},    {"json", required_argument, 0, 'J'},
    {"average", required_argument, 0, 'a'},        {"local_register", required_argument, 0, 'R'},
    {"cta_policy", required_argument, 0, 'x'},
    {"device_implementation", required_argument, 0, 'D'},
    {"device_cta_count", required_argument, 0, 'V'},
    {"memory", required_argument, 0, 'M'},         {"unalign", required_argument, 0, 'u'},
    {"per_iter_timing", required_argument, 0, 'I'},
    {"per_iter_skip", required_argument, 0, 'K'},
    {"mem_type", required_argument, 0, OPT_MEM_TYPE},
    {"progress", required_argument, 0, OPT_PROGRESS},
    {"help", no_argument, 0, 'h'},
    {0, 0, 0, 0},
  };
  defaults(o);
  static const char shortopts[] = "t:g:b:e:i:f:n:m:w:N:p:I:K:c:o:d:r:z:y:T:hG:C:a:R:x:D:V:J:S:M:u:";
  int c;
  while ((c = getopt_long(argc, argv, shortopts, longopts, NULL)) != -1) {
    if (c == 'h') {
      usage(stdout);
      return 1;
    }
    if (c == '?' || c == ':') { /* getopt said which option */
      fprintf(stderr, "hetccl-perf: see --help for the options (nccl-tests' set)\n");
      return -1;
    }
    if (parse_one(o, c, optarg))
      return -1;
  }
  if (check_env(o))
    return -1;
  if (optind < argc) {
    o->coll = perf_coll_find(argv[optind]);
    if (!o->coll || optind + 1 < argc) {
      fprintf(stderr, "hetccl-perf: unknown collective or extra argument: '%s'\n",
              argv[o->coll ? optind + 1 : optind]);
      usage(stderr);
      return -1;
    }
  } else {
    o->coll = perf_coll_find(basename(argv[0]));
    if (!o->coll) {
      fprintf(stderr, "hetccl-perf: name a collective\n");
      usage(stderr);
      return -1;
    }
  }
  if (o->max_bytes < o->min_bytes) {
    fprintf(stderr, "hetccl-perf: -e %zu is below -b %zu\n", o->max_bytes, o->min_bytes);
    return -1;
  }
  if (o->step_factor == 1 && o->step_bytes == 0)
    o->step_bytes = 1; /* progress even with -f 1 -i 0 */
  return 0;
}
