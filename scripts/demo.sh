#!/bin/sh
# The main job: generate the tiny MoE model and show its memory plan.
set -eu
out=${1:-build/demo}
ferry=build/ferry
mkdir -p "$out"
"$ferry" model show tiny-moe
