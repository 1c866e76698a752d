#!/bin/sh
# Every public header compiles on its own, in C11 with the project's warnings: it includes what
# it uses, so a program may include any one of them first.
# usage: check_headers.sh CC INCLUDE_DIR
set -u
cc=$1
inc=$2
failed=0
for h in "$inc"/ferry/*.h; do
  if ! "$cc" -std=c11 -Wall -Wextra -Werror -Wshadow -fsyntax-only -I "$inc" -x c "$h"; then
    echo "header does not compile alone: $h"
    failed=1
  fi
done
[ $failed = 0 ] && echo "every header of $inc/ferry compiles alone"
exit $failed
