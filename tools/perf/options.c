/* The command line, with nccl-tests' flag letters where they exist. */
#define _GNU_SOURCE
#include <getopt.h>
#include <libgen.h>
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
    "  -b, --minbytes N        smallest size (K, M, G suffixes; default 32M)\n"
    "  -e, --maxbytes N        largest size (default 32M)\n"
    "  -i, --stepbytes N       step between sizes when -f is 1 (default 1M)\n"
    "  -f, --stepfactor F      multiply the size by F each step (default 1: use -i)\n"
    "  -n, --iters N           timed iterations per size (default 20)\n"
    "  -w, --warmup_iters N    untimed iterations before each timed run (default 5)\n"
    "  -c, --check 0|1         check every output element (default 1)\n"
    "  -d, --datatype T        int8 uint8 int32 uint32 int64 uint64 half float double\n"
    "                          bfloat16 f8e4m3 f8e5m2, or all (default float)\n"
    "  -o, --op OP             sum prod max min avg, or all (default sum)\n"
    "  -r, --root R            root rank of broadcast, reduce, gather, scatter (default 0)\n"
    "  -t, --nthreads T        threads per process (default 1)\n"
    "  -g, --ngpus G           ranks per thread, one group over G communicators (default 1)\n"
    "  -z, --blocking 0|1      wait for each operation before the next (default 0)\n"
    "  -a, --average 0-3       time reported: 0 rank 0, 1 mean, 2 min, 3 max over ranks\n"
    "                          (default 1)\n"
    "  -m, --memory host|cuda  buffer memory (default host; cuda loads libcudart at run time)\n"
    "  -J, --json FILE         also write every row as JSON to FILE (hetccl plot reads it)\n"
    "      --progress S|off    a progress line on stderr once a sweep has run S seconds\n"
    "                          (default 2)\n"
    "  -h, --help\n"
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

int perf_options_parse(struct perf_options *o, int argc, char **argv)
{
  static const struct option longopts[] = {
    {"minbytes", required_argument, 0, 'b'},  {"maxbytes", required_argument, 0, 'e'},
    {"stepbytes", required_argument, 0, 'i'}, {"stepfactor", required_argument, 0, 'f'},
    {"iters", required_argument, 0, 'n'},     {"warmup_iters", required_argument, 0, 'w'},
    {"check", required_argument, 0, 'c'},     {"datatype", required_argument, 0, 'd'},
    {"op", required_argument, 0, 'o'},        {"root", required_argument, 0, 'r'},
    {"nthreads", required_argument, 0, 't'},  {"ngpus", required_argument, 0, 'g'},
    {"blocking", required_argument, 0, 'z'},  {"average", required_argument, 0, 'a'},
    {"memory", required_argument, 0, 'm'},    {"help", no_argument, 0, 'h'},
    {"json", required_argument, 0, 'J'},      {"progress", required_argument, 0, 'P'},
    {0, 0, 0, 0},
  };
  memset(o, 0, sizeof *o);
  o->min_bytes = o->max_bytes = 32u << 20;
  o->step_bytes = 1u << 20;
  o->step_factor = 1;
  o->iters = 20;
  o->warmup = 5;
  o->check = 1;
  o->threads = o->gpus = 1;
  o->average = 1;
  o->mem = PERF_MEM_HOST;
  o->progress_after = 2;
  parse_types(o, "float");
  parse_ops(o, "sum");

  int c;
  while ((c = getopt_long(argc, argv, "b:e:i:f:n:w:c:d:o:r:t:g:z:a:m:J:h", longopts, NULL)) != -1) {
    switch (c) {
    case 'b': if (parse_size(optarg, &o->min_bytes)) return bad("-b", optarg); break;
    case 'e': if (parse_size(optarg, &o->max_bytes)) return bad("-e", optarg); break;
    case 'i': if (parse_size(optarg, &o->step_bytes)) return bad("-i", optarg); break;
    case 'f': {
      char *end;
      o->step_factor = strtod(optarg, &end);
      if (end == optarg || *end || o->step_factor < 1)
        return bad("-f", optarg);
      break;
    }
    case 'n': if (parse_int(optarg, 1, 1 << 30, &o->iters)) return bad("-n", optarg); break;
    case 'w': if (parse_int(optarg, 0, 1 << 30, &o->warmup)) return bad("-w", optarg); break;
    case 'c': if (parse_int(optarg, 0, 1, &o->check)) return bad("-c", optarg); break;
    case 'd': if (parse_types(o, optarg)) return bad("-d", optarg); break;
    case 'o': if (parse_ops(o, optarg)) return bad("-o", optarg); break;
    case 'r': if (parse_int(optarg, 0, 1 << 30, &o->root)) return bad("-r", optarg); break;
    case 't': if (parse_int(optarg, 1, 1024, &o->threads)) return bad("-t", optarg); break;
    case 'g': if (parse_int(optarg, 1, 1024, &o->gpus)) return bad("-g", optarg); break;
    case 'z': if (parse_int(optarg, 0, 1, &o->blocking)) return bad("-z", optarg); break;
    case 'a': if (parse_int(optarg, 0, 3, &o->average)) return bad("-a", optarg); break;
    case 'm':
      if (strcmp(optarg, "host") == 0)
        o->mem = PERF_MEM_HOST;
      else if (strcmp(optarg, "cuda") == 0)
        o->mem = PERF_MEM_CUDA;
      else
        return bad("-m", optarg);
      break;
    case 'J':
      if (!*optarg)
        return bad("-J", optarg);
      o->json_path = optarg;
      break;
    case 'P': {
      char *end;
      if (strcmp(optarg, "off") == 0) {
        o->progress_after = -1;
        break;
      }
      o->progress_after = strtod(optarg, &end);
      if (end == optarg || *end || o->progress_after < 0)
        return bad("--progress", optarg);
      break;
    }
    case 'h': usage(stdout); return 1;
    default: usage(stderr); return -1;
    }
  }
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
