/* stderr logging with a threshold read once from FERRY_LOG (default: warn). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"

static int threshold(void) {
  static int level = -1;
  if (level < 0) {
    const char *e = getenv("FERRY_LOG");
    level = FERRY_LOG_WARN;
    if (e) {
      if (!strcmp(e, "debug")) level = FERRY_LOG_DEBUG;
      else if (!strcmp(e, "info")) level = FERRY_LOG_INFO;
      else if (!strcmp(e, "error")) level = FERRY_LOG_ERROR;
    }
  }
  return level;
}

void ferry__log(enum ferry_log_level level, const char *fmt, ...) {
  if ((int)level < threshold()) return;
  static const char *names[] = {"debug", "info", "warning", "error"};
  fprintf(stderr, "ferry: %s: ", names[level]);
  va_list ap;
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
}
