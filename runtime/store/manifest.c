/* Model-folder manifests: the SHA-256 of every file of a model version, in the format of
 * `sha256sum` ("HEX  NAME" per line), so a hot reload checks what it is about to serve before
 * anything changes, and the file can be written or checked with coreutils as well. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/fsutil.h"
#include "common/sha256.h"
#include "common/strbuf.h"
#include "ferry/store.h"

/* Files a manifest covers: everything a model folder is read from. */
static int covered(const char *name) {
  size_t n = strlen(name);
  return !strcmp(name, "config.json") || !strcmp(name, "model.safetensors.index.json") ||
         (n > 12 && !strcmp(name + n - 12, ".safetensors"));
}

static ferry_status sha256_file(const char *path, char hex[65]) { return ferry__sha256_file(path, hex, NULL); }

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The covered files of dir, sorted (owned array of owned names). */
static ferry_status list_covered(const char *dir, char ***out, size_t *n_out) {
  DIR *d = opendir(dir);
  if (!d) return ferry__fail(errno == ENOENT ? FERRY_ERR_NOT_FOUND : FERRY_ERR_IO, "%s: cannot open the folder: %s", dir,
                             strerror(errno));
  char **names = NULL;
  size_t n = 0, cap = 0;
  ferry_status st = FERRY_OK;
  struct dirent *ent;
  while ((ent = readdir(d))) {
    if (!covered(ent->d_name)) continue;
    if (n == cap) {
      cap = cap ? cap * 2 : 16;
      char **grown = ferry__reallocarray(names, cap, sizeof *names);
      if (!grown) {
        st = ferry__fail(FERRY_ERR_NOMEM, "out of memory");
        break;
      }
      names = grown;
    }
    if (!(names[n] = ferry__strdup(ent->d_name))) {
      st = ferry__fail(FERRY_ERR_NOMEM, "out of memory");
      break;
    }
    n++;
  }
  closedir(d);
  if (st == FERRY_OK && n > 1) qsort(names, n, sizeof *names, cmp_str); /* qsort takes no NULL, even for 0 */
  if (st != FERRY_OK) {
    for (size_t i = 0; i < n; i++) ferry_free(names[i]);
    ferry_free(names);
    return st;
  }
  *out = names;
  *n_out = n;
  return FERRY_OK;
}

static void free_names(char **names, size_t n) {
  for (size_t i = 0; i < n; i++) ferry_free(names[i]);
  ferry_free(names);
}

ferry_status ferry_manifest_write(const char *dir) {
  if (!dir) return ferry__fail(FERRY_ERR_INVALID, "manifest_write: NULL folder");
  char **names = NULL;
  size_t n = 0;
  ferry_status st = list_covered(dir, &names, &n);
  if (st != FERRY_OK) return st;
  struct ferry_strbuf sb = {0};
  for (size_t i = 0; i < n && st == FERRY_OK; i++) {
    char *path = ferry__path_join(dir, names[i]), hex[65];
    st = path ? sha256_file(path, hex) : ferry__fail(FERRY_ERR_NOMEM, "out of memory");
    if (st == FERRY_OK) ferry__sb_printf(&sb, "%s  %s\n", hex, names[i]);
    ferry_free(path);
  }
  if (st == FERRY_OK && !n) st = ferry__fail(FERRY_ERR_NOT_FOUND, "%s: no model files (config.json, *.safetensors) to list", dir);
  if (st == FERRY_OK && sb.oom) st = ferry__fail(FERRY_ERR_NOMEM, "out of memory");
  if (st == FERRY_OK) {
    char *path = ferry__path_join(dir, FERRY_MANIFEST_NAME);
    st = path ? ferry__write_file_atomic(path, sb.p ? sb.p : "", sb.len, NULL) : ferry__fail(FERRY_ERR_NOMEM, "out of memory");
    ferry_free(path);
  }
  ferry__sb_free(&sb);
  free_names(names, n);
  return st;
}

ferry_status ferry_manifest_verify(const char *dir, size_t *files_checked) {
  if (!dir) return ferry__fail(FERRY_ERR_INVALID, "manifest_verify: NULL folder");
  char *mpath = ferry__path_join(dir, FERRY_MANIFEST_NAME), *text = NULL;
  size_t len = 0;
  if (!mpath) return ferry__fail(FERRY_ERR_NOMEM, "out of memory");
  ferry_status st = ferry__read_file(mpath, 1u << 20, &text, &len, NULL);
  if (st != FERRY_OK) {
    st = ferry__fail(st == FERRY_ERR_NOT_FOUND ? FERRY_ERR_NOT_FOUND : st,
                     "%s: no manifest: a reload verifies every file against its SHA-256 (write one with 'ferry model "
                     "manifest %s')",
                     mpath, dir);
    ferry_free(mpath);
    return st;
  }
  char **names = NULL;
  size_t n = 0, listed = 0;
  st = list_covered(dir, &names, &n);
  unsigned char *seen = st == FERRY_OK ? ferry__calloc(n ? n : 1, 1) : NULL;
  if (st == FERRY_OK && !seen) st = ferry__fail(FERRY_ERR_NOMEM, "out of memory");
  int line_no = 0;
  for (char *line = text, *next; st == FERRY_OK && line && *line; line = next) {
    next = strchr(line, '\n');
    if (next) *next++ = '\0';
    line_no++;
    if (!*line) continue;
    /* "HEX  NAME" (sha256sum's text mode) or "HEX *NAME" (its binary mode) */
    size_t hl = strspn(line, "0123456789abcdef");
    const char *name = line + hl + 2;
    if (hl != 64 || line[64] != ' ' || (line[65] != ' ' && line[65] != '*') || !*name || strchr(name, '/')) {
      st = ferry__fail(FERRY_ERR_FORMAT, "%s:%d: expected '<64 lowercase hex digits>  <file name>' (sha256sum format)",
                       mpath, line_no);
      break;
    }
    char *path = ferry__path_join(dir, name), hex[65];
    if (!path) {
      st = ferry__fail(FERRY_ERR_NOMEM, "out of memory");
      break;
    }
    st = sha256_file(path, hex);
    if (st == FERRY_OK && strncmp(hex, line, 64))
      st = ferry__fail(FERRY_ERR_FORMAT, "%s: SHA-256 %s does not match the manifest's %.64s (%s line %d): the file is "
                                         "corrupt or not the version listed",
                       path, hex, line, mpath, line_no);
    ferry_free(path);
    for (size_t i = 0; i < n; i++)
      if (!strcmp(names[i], name)) seen[i] = 1;
    listed++;
  }
  for (size_t i = 0; st == FERRY_OK && i < n; i++)
    if (!seen[i])
      st = ferry__fail(FERRY_ERR_FORMAT, "%s/%s is not in the manifest %s: an unverified file would be served", dir,
                       names[i], mpath);
  if (st == FERRY_OK && files_checked) *files_checked = listed;
  ferry_free(seen);
  free_names(names, n);
  ferry_free(text);
  ferry_free(mpath);
  return st;
}
