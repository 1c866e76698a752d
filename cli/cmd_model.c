/* `ferry model`: placeholder until the model catalogue lands. */
#include "cli/cli.h"

int cmd_model(int argc, char **argv) {
  (void)argc;
  (void)argv;
  return cli_fail(FERRY_ERR_UNSUPPORTED, "model: not built yet");
}
