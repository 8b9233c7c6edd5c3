/* hetccl-perf: the JSON file of every row (-J FILE) and the progress line.
 *
 * Runs on the printing rank's thread only (global rank 0, thread 0), the
 * one that prints the table; nothing here talks to other ranks.
 *
 * JSON: one document, written as the sweep goes (the header when the file
 * is opened, a row per size, the totals at the end), so its rows are those
 * of the table, with the same numbers:
 *   {"program": "hetccl-perf", "collective": ..., "library": ..., "nccl_version": ...,
 *    "memory": ..., "nranks": ..., "processes": ..., "threads": ..., "gpus": ...,
 *    "iters": ..., "warmup": ..., "check": ..., "average": ...,
 *    "rows": [{"size": B, "count": N, "type": ..., "redop": ..., "root": R,
 *              "oop": {"time_us": T, "algbw": A, "busbw": B, "wrong": W or null},
 *              "ip": {...}}, ...],
 *    "wrong": W, "avg_busbw": B}
 * A run that dies leaves an unterminated document; the exit status says so.
 *
 * Progress: once a sweep has run --progress seconds (2), a line on stderr after
 * each size (at most one a second; rewritten in place on a terminal, one
 * line every PROGRESS_EVERY_S otherwise), so that the table on stdout stays
 * clean and a long run shows it is alive. */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "perf.h"

#define PROGRESS_EVERY_S 10.0

static FILE *json;
static int rows_written;
static double start_s, last_progress_s;
static double progress_after;
static int progress_tty, progress_shown;

static double now_s(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void json_string(FILE *f, const char *s)
{
  fputc('"', f);
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\')
      fprintf(f, "\\%c", c);
    else if (c < 0x20)
      fprintf(f, "\\u%04x", c);
    else
      fputc(c, f);
  }
  fputc('"', f);
}

int perf_report_open(const char *path, const struct perf_report_info *info)
{
  start_s = last_progress_s = now_s();
  progress_after = info->progress_after;
  progress_tty = isatty(STDERR_FILENO);
  if (!path)
    return 0;
  json = fopen(path, "w");
  if (!json) {
    fprintf(stderr, "hetccl-perf: cannot write -J %s: %m\n", path);
    return -1;
  }
  fprintf(json, "{\"program\": \"hetccl-perf\", \"collective\": ");
  json_string(json, info->collective);
  fprintf(json, ", \"library\": ");
  json_string(json, info->library);
  fprintf(json, ", \"nccl_version\": %d, \"memory\": \"%s\", \"nranks\": %d, "
                "\"processes\": %d, \"threads\": %d, \"gpus\": %d, \"iters\": %d, "
                "\"warmup\": %d, \"check\": %d, \"average\": %d,\n \"rows\": [",
          info->nccl_version, info->memory, info->nranks, info->processes, info->threads,
          info->gpus, info->iters, info->warmup, info->check, info->average);
  fflush(json);
  return 0;
}

static void json_result(const struct perf_report_result *r)
{
  fprintf(json, "{\"time_us\": %.3f, \"algbw\": %.6g, \"busbw\": %.6g, \"wrong\": ", r->time_us,
          r->algbw, r->busbw);
  if (r->checked)
    fprintf(json, "%.0f}", r->wrong);
  else
    fprintf(json, "null}");
}

void perf_report_row(const struct perf_report_row *row)
{
  if (json) {
    fprintf(json, "%s\n  {\"size\": %zu, \"count\": %zu, \"type\": \"%s\", \"redop\": \"%s\", "
                  "\"root\": %d, \"oop\": ",
            rows_written ? "," : "", row->size, row->count, row->type, row->redop, row->root);
    json_result(&row->oop);
    fprintf(json, ", \"ip\": ");
    json_result(&row->ip);
    fprintf(json, "}");
    fflush(json);
    rows_written++;
  }
  double now = now_s();
  if (progress_after < 0 || now - start_s < progress_after)
    return;
  if (now - last_progress_s < (progress_tty ? 1.0 : PROGRESS_EVERY_S) && progress_shown)
    return;
  last_progress_s = now;
  progress_shown = 1;
  fprintf(stderr, "%shetccl-perf: %s %s %s: size %zu B done (%d of %d rows, %.1f s)%s",
          progress_tty ? "\r" : "", row->collective, row->type, row->redop, row->size,
          row->index + 1, row->total, now - start_s, progress_tty ? "\033[K" : "\n");
  fflush(stderr);
}

void perf_report_close(double wrong, double avg_busbw)
{
  if (progress_shown && progress_tty)
    fprintf(stderr, "\r\033[K");
  if (!json)
    return;
  fprintf(json, "\n ],\n \"wrong\": %.0f, \"avg_busbw\": %.6g}\n", wrong, avg_busbw);
  fclose(json);
  json = NULL;
}
