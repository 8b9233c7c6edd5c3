/* The knob table's readers (libhetccl/util/knobs.h), built from its source:
 * an ENUM knob reads as a value generated from its word list, any case
 * where the row allows it; a value the table refuses is never what a
 * reader sees (every accessor gives the default, the variable reads as
 * unset), while the check (util/knob_check.c, not built here) learns what
 * was given and why. Each case sets the environment and reloads the table.
 *
 * Exit status 0 on success. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/knobs.h"

#include "../common/check.h"

static void set(const char *var, const char *value) {
  if (value) setenv(var, value, 1);
  else unsetenv(var);
  hetccl_knobs_reload();
}

int main(void) {
  const char *given, *why;

  /* Defaults, and the generated values in their list's order. */
  set("HETCCL_TRANSPORT", NULL);
  CHECK(hetccl_knob_enum(HETCCL_KNOB_TRANSPORT) == HETCCL_KNOB_TRANSPORT_auto, "default auto");
  CHECK(HETCCL_KNOB_TRANSPORT_auto == 0 && HETCCL_KNOB_TRANSPORT_ib == 3 &&
            HETCCL_KNOB_TRANSPORT_COUNT == 4, "values in the list's order");
  CHECK(!strcmp(hetccl_knob_desc(HETCCL_KNOB_TRANSPORT)->values, "auto|shm|socket|ib") &&
            !strcmp(hetccl_knob_desc(HETCCL_KNOB_TRANSPORT)->type_name, "enum:auto|shm|socket|ib"),
        "the table's text is the list's");
  set("NCCL_DEBUG", NULL);
  set("HETCCL_DEBUG", NULL);
  CHECK(hetccl_knob_enum(HETCCL_KNOB_DEBUG) == HETCCL_KNOB_NO_WORD, "unset with no default");

  /* A word, as the list spells it or (NOCASE) in any case. */
  set("HETCCL_TRANSPORT", "socket");
  CHECK(hetccl_knob_enum(HETCCL_KNOB_TRANSPORT) == HETCCL_KNOB_TRANSPORT_socket, "socket");
  CHECK(hetccl_knob_is_set(HETCCL_KNOB_TRANSPORT), "set");
  set("NCCL_DEBUG", "info");
  CHECK(hetccl_knob_enum(HETCCL_KNOB_NCCL_DEBUG) == HETCCL_KNOB_DEBUG_INFO, "any case, twin list");
  CHECK(!strcmp(hetccl_knob_str(HETCCL_KNOB_NCCL_DEBUG), "INFO"), "spelled as the list does");
  set("NCCL_SOCKET_FAMILY", "6");
  CHECK(hetccl_knob_enum(HETCCL_KNOB_SOCKET_FAMILY) == HETCCL_KNOB_SOCKET_FAMILY_6, "6");
  CHECK(!hetccl_knob_refused(HETCCL_KNOB_SOCKET_FAMILY, &given, &why), "6 is allowed");

  /* Refused: the default everywhere a reader looks; the check's words. */
  set("HETCCL_TRANSPORT", "Socket"); /* the row ignores no case */
  CHECK(hetccl_knob_enum(HETCCL_KNOB_TRANSPORT) == HETCCL_KNOB_TRANSPORT_auto, "refused: auto");
  CHECK(!strcmp(hetccl_knob_str(HETCCL_KNOB_TRANSPORT), "auto"), "refused: text of the default");
  CHECK(!hetccl_knob_is_set(HETCCL_KNOB_TRANSPORT), "refused: reads as unset");
  CHECK(hetccl_knob_refused(HETCCL_KNOB_TRANSPORT, &given, &why) && !strcmp(given, "Socket") &&
            !strcmp(why, "not one of"), "the check learns what was given");
  set("HETCCL_DEBUG", "loud");
  CHECK(hetccl_knob_enum(HETCCL_KNOB_DEBUG) == HETCCL_KNOB_NO_WORD, "refused, no default");
  CHECK(hetccl_knob_or_nccl(HETCCL_KNOB_DEBUG, HETCCL_KNOB_NCCL_DEBUG) == HETCCL_KNOB_NCCL_DEBUG,
        "a refused ours gives way to NCCL's, as unset");
  set("HETCCL_TIMEOUT", "12x");
  CHECK(hetccl_knob_int(HETCCL_KNOB_TIMEOUT) == 300, "refused INT: its default");
  CHECK(!strcmp(hetccl_knob_str(HETCCL_KNOB_TIMEOUT), "300"), "refused INT: the default's text");
  CHECK(hetccl_knob_refused(HETCCL_KNOB_TIMEOUT, &given, &why) && !strcmp(given, "12x") &&
            !strcmp(why, "not an integer"), "the check learns the INT as given");

  /* Set right again: the refusal is gone. */
  set("HETCCL_TRANSPORT", "ib");
  CHECK(hetccl_knob_enum(HETCCL_KNOB_TRANSPORT) == HETCCL_KNOB_TRANSPORT_ib, "ib");
  CHECK(!hetccl_knob_refused(HETCCL_KNOB_TRANSPORT, &given, &why), "no refusal left");
  CHECK(hetccl_knob_enum(HETCCL_KNOB_TIMEOUT) == HETCCL_KNOB_NO_WORD, "an INT knob has no word");
  CHECK(hetccl_knob_bad_default() < 0, "every default passes its own check");

  if (failures) fprintf(stderr, "%d failure(s)\n", failures);
  else printf("knobs: ok\n");
  return failures ? 1 : 0;
}
