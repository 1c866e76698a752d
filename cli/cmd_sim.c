/* `ferry sim`: the same options, engine and outputs as `ferry run`, on the discrete-event
 * executor of a hardware profile (run_exec.c picks the executor from the command name). */
#include "cli/cli.h"
#include "cli/run_common.h"

int cmd_sim(int argc, char **argv) {
  struct run_args a;
  int rc = run_parse(argc, argv, "sim", &a);
  if (rc) return rc < 0 ? CLI_OK : rc;
  return a.sensitivity > 0 ? run_sensitivity(&a) : run_repeat(&a);
}
