/* `ferry model manifest DIR [--check]`: the SHA-256 of every file of a model folder, which a hot
 * reload checks before it serves the folder (the sha256sum format: `sha256sum -c` reads it). */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "common/error.h"
#include "ferry/store.h"

int cmd_model_manifest(int argc, char **argv) {
  const char *dir = NULL;
  int check = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      printf("Usage: ferry model manifest DIR [--check]\n"
             "Write DIR/%s: the SHA-256 of config.json, the safetensors files and their index, in\n"
             "sha256sum's format. A hot reload (ferry ctl reload, --reload-at, --reload-from) refuses a\n"
             "folder whose files do not match it. --check verifies instead of writing.\n",
             FERRY_MANIFEST_NAME);
      return CLI_OK;
    }
    if (!strcmp(argv[i], "--check")) check = 1;
    else if (!dir && argv[i][0] != '-') dir = argv[i];
    else return cli_usage_error("model manifest", "unexpected argument '%s'", argv[i]);
  }
  if (!dir) return cli_usage_error("model manifest", "missing DIR");
  size_t files = 0;
  ferry_status st = check ? ferry_manifest_verify(dir, &files) : ferry_manifest_write(dir);
  if (st != FERRY_OK) return cli_fail(st, NULL);
  if (check) printf("%s: %zu file(s) match %s\n", dir, files, FERRY_MANIFEST_NAME);
  else printf("wrote %s/%s\n", dir, FERRY_MANIFEST_NAME);
  return CLI_OK;
}
