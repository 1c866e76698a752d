/* `ferry ctl`: talk to a running `ferry run --control-socket PATH`: stage a weight reload
 * (the server verifies the folder before anything changes) or ask its status. One command per
 * connection, one line back. */
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "cli/cli.h"

static void usage(FILE *f) {
  fprintf(f,
          "Usage: ferry ctl --socket PATH reload DIR\n"
          "       ferry ctl --socket PATH status\n"
          "Control a serving 'ferry run --control-socket PATH'.\n\n"
          "  reload DIR   swap in the weights of DIR (same architecture; every file checked against\n"
          "               DIR/manifest.sha256, strict safetensors validation, the residency plan): staged\n"
          "               now, swapped once the requests running on the old weights finish. A folder\n"
          "               that fails a check is refused with the reason and the old weights keep serving.\n"
          "  status       the weights version serving and the memory-pressure level\n\n"
          "Exit status: 0 when the server answered ok, 1 when it refused or could not be reached.\n");
}

int cmd_ctl(int argc, char **argv) {
  const char *sock = NULL;
  int i = 1;
  for (; i < argc; i++) {
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      usage(stdout);
      return CLI_OK;
    }
    if (!strcmp(argv[i], "--socket") && i + 1 < argc) sock = argv[++i];
    else if (!strncmp(argv[i], "--socket=", 9)) sock = argv[i] + 9;
    else break;
  }
  if (!sock) return cli_usage_error("ctl", "missing --socket PATH (the --control-socket of the run)");
  if (i >= argc) return cli_usage_error("ctl", "missing a command: reload DIR or status");
  char line[PATH_MAX + 32];
  if (!strcmp(argv[i], "reload") && i + 2 == argc) {
    char dir[PATH_MAX];
    /* the server runs elsewhere: it gets an absolute path */
    if (!realpath(argv[i + 1], dir)) return cli_fail(FERRY_ERR_NOT_FOUND, "%s: %s", argv[i + 1], strerror(errno));
    snprintf(line, sizeof line, "reload %s\n", dir);
  } else if (!strcmp(argv[i], "status") && i + 1 == argc) {
    snprintf(line, sizeof line, "status\n");
  } else {
    return cli_usage_error("ctl", "expected 'reload DIR' or 'status'");
  }
  struct sockaddr_un addr;
  memset(&addr, 0, sizeof addr);
  addr.sun_family = AF_UNIX;
  if (strlen(sock) >= sizeof addr.sun_path) return cli_usage_error("ctl", "--socket %s: path too long", sock);
  snprintf(addr.sun_path, sizeof addr.sun_path, "%s", sock);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
    int e = errno;
    if (fd >= 0) close(fd);
    return cli_fail(FERRY_ERR_IO, "--socket %s: cannot connect: %s (is a ferry run serving with --control-socket?)", sock,
                    strerror(e));
  }
  size_t len = strlen(line);
  for (size_t off = 0; off < len;) {
    ssize_t w = write(fd, line + off, len - off);
    if (w <= 0) {
      close(fd);
      return cli_fail(FERRY_ERR_IO, "--socket %s: write failed", sock);
    }
    off += (size_t)w;
  }
  /* verifying a large folder takes a while: wait up to ten minutes for the answer */
  char reply[4096];
  size_t n = 0;
  while (n + 1 < sizeof reply) {
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, 600000) <= 0) break;
    ssize_t got = read(fd, reply + n, sizeof reply - 1 - n);
    if (got <= 0) break;
    n += (size_t)got;
    if (memchr(reply, '\n', n)) break;
  }
  close(fd);
  reply[n] = '\0';
  if (!n) return cli_fail(FERRY_ERR_IO, "--socket %s: no answer", sock);
  fputs(reply, stdout);
  if (reply[n - 1] != '\n') fputc('\n', stdout);
  return !strncmp(reply, "ok", 2) ? CLI_OK : CLI_FAIL;
}
