/* `cmake --install BUILD --prefix P` makes an installation that works where it is: ferry.pc
 * names P (pkg-config reads it back), and the installed ferry finds hardware profiles in
 * P/share/ferry/hw, also one that only the installation has. Skips without cmake. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fsutil.h"
#include "testutil.h"

static int sh(const char *cmd) { return system(cmd); }

static void test_install_prefix(void **state) {
  (void)state;
  const char *bin = getenv("FERRY_BIN");
  if (!bin || system("cmake --version >/dev/null 2>&1") != 0) {
    print_message("SKIP: no cmake or FERRY_BIN\n");
    return;
  }
  char build[1024];
  snprintf(build, sizeof build, "%s", bin);
  char *slash = strrchr(build, '/');
  assert_non_null(slash);
  *slash = '\0';
  char *dir = tu_mkdtemp("install");
  char cmd[4096], path[1200];
  snprintf(cmd, sizeof cmd, "cmake --install '%s' --prefix '%s/p' >'%s/install.log' 2>&1", build, dir, dir);
  if (sh(cmd) != 0) fail_msg("%s failed (see %s/install.log)", cmd, dir);
  /* ferry.pc, wherever GNUInstallDirs put the libraries */
  snprintf(cmd, sizeof cmd, "find '%s/p' -name ferry.pc > '%s/pc.txt'", dir, dir);
  assert_int_equal(sh(cmd), 0);
  snprintf(path, sizeof path, "%s/pc.txt", dir);
  char *found = NULL;
  size_t len;
  assert_int_equal(ferry__read_file(path, 4096, &found, &len, NULL), FERRY_OK);
  found[strcspn(found, "\n")] = '\0';
  assert_true(found[0]);
  char *pc = NULL;
  assert_int_equal(ferry__read_file(found, 1 << 16, &pc, &len, NULL), FERRY_OK);
  char want[1200];
  snprintf(want, sizeof want, "prefix=%s/p\n", dir);
  if (strncmp(pc, want, strlen(want))) fail_msg("%s starts\n%.200s\nexpected %s", found, pc, want);
  free(pc);
  if (system("pkg-config --version >/dev/null 2>&1") == 0) {
    char *pcdir = found;
    *strrchr(pcdir, '/') = '\0';
    snprintf(cmd, sizeof cmd, "PKG_CONFIG_PATH='%s' pkg-config --variable=prefix ferry > '%s/prefix.txt'", pcdir, dir);
    assert_int_equal(sh(cmd), 0);
    snprintf(path, sizeof path, "%s/prefix.txt", dir);
    char *prefix = NULL;
    assert_int_equal(ferry__read_file(path, 4096, &prefix, &len, NULL), FERRY_OK);
    snprintf(want, sizeof want, "%s/p\n", dir);
    assert_string_equal(prefix, want);
    free(prefix);
  }
  free(found);
  /* a profile only the installation has: found by the installed binary, named from there */
  snprintf(cmd, sizeof cmd,
           "sed 's/\"name\": \"t4\"/\"name\": \"only-installed\"/' '%s/p/share/ferry/hw/t4.json' > "
           "'%s/p/share/ferry/hw/only-installed.json' && cd / && FERRY_HW_PATH= '%s/p/bin/ferry' hw show only-installed "
           "> '%s/show.txt' 2>&1",
           dir, dir, dir, dir);
  if (sh(cmd) != 0) fail_msg("the installed ferry did not find a profile in its share folder (%s)", cmd);
  snprintf(path, sizeof path, "%s/show.txt", dir);
  char *show = NULL;
  assert_int_equal(ferry__read_file(path, 1 << 16, &show, &len, NULL), FERRY_OK);
  snprintf(want, sizeof want, "%s/p/bin/../share/ferry/hw/only-installed.json", dir);
  if (!tu_contains(show, want)) fail_msg("hw show:\n%s\nexpected the file %s", show, want);
  free(show);
  tu_rmtree(dir);
  free(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_install_prefix)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
