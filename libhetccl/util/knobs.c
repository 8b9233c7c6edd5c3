/* Knobs (util/knobs.h): the environment, read once against the table.
 *
 * Any thread may read a knob. The environment is parsed on first use
 * (pthread_once) and only again by hetccl_knobs_reload (ncclResetDebugInit).
 * Nothing here logs: logging reads its own settings from this table, so a
 * message from here could re-enter the initialisation that is running.
 * Problems are kept and reported by hetccl_knobs_check (knob_check.c),
 * which comm init calls. */
#include "util/knobs.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

typedef enum { KNOB_OK, KNOB_NOT_INTEGER, KNOB_OUT_OF_RANGE, KNOB_NOT_ALLOWED } knob_status_t;

typedef struct {
  const char *value; /* copy of the environment's text (ENUM: the list's
                      * spelling); NULL when unset, "" or refused */
  const char *given; /* the environment's text as given, for the message
                      * about a refused one; NULL when unset or "" */
  int64_t ival;      /* INT knobs: the value, or the default when refused */
  int word;          /* ENUM knobs: the word's place, or the default's */
  int status;        /* knob_status_t */
} knob_state_t;

/* The type column's expansion (knobs.h) into its five fields. */
#define KNOB_KIND_FIELDS(...) KNOB_KIND_FIELDS_(__VA_ARGS__)
#define KNOB_KIND_FIELDS_(type_, values_, nwords_, nocase_, name_)             \
  .type = type_, .values = values_, .nwords = nwords_, .nocase = nocase_, .type_name = name_

static const hetccl_knob_desc_t knob_table[HETCCL_KNOB_COUNT] = {
#define HETCCL_KNOB_ROW(id, env_, type_, def_, lo, hi, help_)                  \
  [HETCCL_KNOB_##id] = {.env = env_, KNOB_KIND_FIELDS(HETCCL_KNOB_KIND_##type_), \
                        .def = def_, .min = lo, .max = hi, .help = help_},
    HETCCL_KNOBS(HETCCL_KNOB_ROW)
#undef HETCCL_KNOB_ROW
};

static knob_state_t knob_state[HETCCL_KNOB_COUNT];

/* Every copy of an environment value ever made. A reload replaces a knob's
 * copy while another thread may still read the old one, so none is freed;
 * they stay reachable from here (a leak checker sees no leak), and a value
 * that did not change keeps its copy, so repeated reloads do not grow. */
typedef struct knob_text {
  struct knob_text *next;
  char text[];
} knob_text_t;
static knob_text_t *knob_texts;
static int64_t knob_default[HETCCL_KNOB_COUNT];
static int knob_default_word[HETCCL_KNOB_COUNT];
static int defaults_bad = -1; /* first knob whose default fails its own check */
static pthread_once_t knobs_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t reload_lock = PTHREAD_MUTEX_INITIALIZER;

/* Decimal with an optional K/M/G suffix (powers of 1024). */
static knob_status_t parse_int(const char *s, int64_t *out) {
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (end == s) return KNOB_NOT_INTEGER;
  if (errno == ERANGE) return KNOB_OUT_OF_RANGE;
  int shift = 0;
  switch (*end) {
  case 'k': case 'K': shift = 10; end++; break;
  case 'm': case 'M': shift = 20; end++; break;
  case 'g': case 'G': shift = 30; end++; break;
  default: break;
  }
  if (*end != '\0') return KNOB_NOT_INTEGER;
  if (shift && (v > (INT64_MAX >> shift) || v < (INT64_MIN >> shift))) return KNOB_OUT_OF_RANGE;
  *out = (int64_t)v * ((int64_t)1 << shift);
  return KNOB_OK;
}

static knob_status_t check_int(const hetccl_knob_desc_t *d, const char *text, int64_t *out) {
  int64_t v;
  knob_status_t st = parse_int(text, &v);
  if (st != KNOB_OK) return st;
  if (v < d->min || v > d->max) return KNOB_OUT_OF_RANGE;
  *out = v;
  return KNOB_OK;
}

/* Longest word of an ENUM knob's list. */
#define KNOB_WORD_BYTES 32

/* Is text one of d's words? Its place in the list and its spelling there
 * into word, else -1. */
static int enum_find(const hetccl_knob_desc_t *d, const char *text, char word[KNOB_WORD_BYTES]) {
  int place = 0;
  for (const char *w = d->values;; w++, place++) {
    size_t len = strcspn(w, "|");
    if (len == strlen(text) && len < KNOB_WORD_BYTES &&
        (d->nocase ? strncasecmp(w, text, len) : strncmp(w, text, len)) == 0) {
      memcpy(word, w, len);
      word[len] = '\0';
      return place;
    }
    w += len;
    if (*w == '\0') return -1;
  }
}

/* A lasting copy of env ("" and NULL: NULL); the current one if unchanged. */
static const char *keep_text(const char *env, const char *current) {
  if (!env || !env[0]) return NULL;
  if (current && !strcmp(current, env)) return current;
  size_t len = strlen(env) + 1;
  knob_text_t *t = malloc(sizeof(*t) + len);
  if (!t) return NULL; /* read as unset; parsing never logs (see above) */
  memcpy(t->text, env, len);
  t->next = knob_texts;
  knob_texts = t;
  return t->text;
}

/* Check text against d. INT knobs set *ival, ENUM knobs *place; *spelled
 * is the text to keep: an ENUM knob's word as the list spells it (copied
 * into word), else text itself. */
static knob_status_t check_value(const hetccl_knob_desc_t *d, const char *text, int64_t *ival,
                                 int *place, char word[KNOB_WORD_BYTES], const char **spelled) {
  *spelled = text;
  if (d->type == HETCCL_KNOB_INT) return check_int(d, text, ival);
  if (d->type != HETCCL_KNOB_ENUM) return KNOB_OK;
  int found = enum_find(d, text, word);
  if (found < 0) return KNOB_NOT_ALLOWED;
  *place = found;
  *spelled = word;
  return KNOB_OK;
}

/* Callers serialise: the first load runs under pthread_once, reloads under
 * reload_lock after it. */
static void read_environment(void) {
  for (int i = 0; i < HETCCL_KNOB_COUNT; i++) {
    const hetccl_knob_desc_t *d = &knob_table[i];
    const char *env = getenv(d->env), *spelled = env;
    int64_t ival = knob_default[i];
    int place = knob_default_word[i];
    knob_status_t st = KNOB_OK;
    char word[KNOB_WORD_BYTES];
    if (env && env[0] && (st = check_value(d, env, &ival, &place, word, &spelled)) != KNOB_OK) {
      /* Refused: readers see the default; the check names what was given. */
      ival = knob_default[i];
      place = knob_default_word[i];
      spelled = NULL;
    }
    const char *given = keep_text(env, __atomic_load_n(&knob_state[i].given, __ATOMIC_RELAXED));
    const char *copy =
        keep_text(spelled, __atomic_load_n(&knob_state[i].value, __ATOMIC_RELAXED));
    __atomic_store_n(&knob_state[i].ival, ival, __ATOMIC_RELAXED);
    __atomic_store_n(&knob_state[i].word, place, __ATOMIC_RELAXED);
    __atomic_store_n(&knob_state[i].status, (int)st, __ATOMIC_RELAXED);
    __atomic_store_n(&knob_state[i].given, given, __ATOMIC_RELAXED);
    __atomic_store_n(&knob_state[i].value, copy, __ATOMIC_RELEASE);
  }
}

static void knobs_load(void) {
  for (int i = 0; i < HETCCL_KNOB_COUNT; i++) {
    const hetccl_knob_desc_t *d = &knob_table[i];
    char word[KNOB_WORD_BYTES];
    const char *spelled;
    knob_default[i] = 0;
    knob_default_word[i] = HETCCL_KNOB_NO_WORD;
    if (d->def[0] == '\0' && d->type != HETCCL_KNOB_INT) continue; /* "" = unset */
    if (check_value(d, d->def, &knob_default[i], &knob_default_word[i], word, &spelled) !=
            KNOB_OK &&
        defaults_bad < 0)
      defaults_bad = i;
  }
  read_environment();
}

static void knobs_ensure(void) { pthread_once(&knobs_once, knobs_load); }

const hetccl_knob_desc_t *hetccl_knob_desc(hetccl_knob_t id) {
  return (unsigned)id < HETCCL_KNOB_COUNT ? &knob_table[id] : NULL;
}

int64_t hetccl_knob_int(hetccl_knob_t id) {
  if ((unsigned)id >= HETCCL_KNOB_COUNT) return 0;
  knobs_ensure();
  return __atomic_load_n(&knob_state[id].ival, __ATOMIC_RELAXED);
}

int hetccl_knob_enum(hetccl_knob_t id) {
  if ((unsigned)id >= HETCCL_KNOB_COUNT || knob_table[id].type != HETCCL_KNOB_ENUM)
    return HETCCL_KNOB_NO_WORD;
  knobs_ensure();
  return __atomic_load_n(&knob_state[id].word, __ATOMIC_RELAXED);
}

const char *hetccl_knob_str(hetccl_knob_t id) {
  if ((unsigned)id >= HETCCL_KNOB_COUNT) return "";
  knobs_ensure();
  const char *v = __atomic_load_n(&knob_state[id].value, __ATOMIC_ACQUIRE);
  return v ? v : knob_table[id].def;
}

int hetccl_knob_is_set(hetccl_knob_t id) {
  if ((unsigned)id >= HETCCL_KNOB_COUNT) return 0;
  knobs_ensure();
  return __atomic_load_n(&knob_state[id].value, __ATOMIC_ACQUIRE) != NULL;
}

hetccl_knob_t hetccl_knob_or_nccl(hetccl_knob_t ours, hetccl_knob_t nccls) {
  return !hetccl_knob_is_set(ours) && hetccl_knob_is_set(nccls) ? nccls : ours;
}

void hetccl_knobs_reload(void) {
  knobs_ensure();
  pthread_mutex_lock(&reload_lock);
  read_environment();
  pthread_mutex_unlock(&reload_lock);
}

int hetccl_knob_refused(hetccl_knob_t id, const char **given, const char **why) {
  if ((unsigned)id >= HETCCL_KNOB_COUNT) return 0;
  knobs_ensure();
  int st = __atomic_load_n(&knob_state[id].status, __ATOMIC_RELAXED);
  if (st == KNOB_OK) return 0;
  const char *text = __atomic_load_n(&knob_state[id].given, __ATOMIC_RELAXED);
  *given = text ? text : "";
  *why = st == KNOB_NOT_ALLOWED ? "not one of"
         : st == KNOB_NOT_INTEGER ? "not an integer"
                                  : "out of range";
  return 1;
}

int hetccl_knob_bad_default(void) {
  knobs_ensure();
  return defaults_bad;
}
