# shellcheck shell=bash
# Sourced by the rxe VM's interleaved comparisons (ab-msg-inline,
# footprint-cost). two SERVER CLIENT: runs SERVER pinned to vCPU 0, then
# after 2 s CLIENT pinned to vCPU 1, each a `bash -c` command in which
# @P@ stands for the next port after $port; prints the client's output.
two() {
  port=$((port+1)); local s=${1//@P@/$port} c=${2//@P@/$port}
  # Bounded: a client that fails to connect (a server slow to start on
  # a loaded host) would otherwise leave its server waiting for ever.
  timeout 300 taskset -c 0 bash -c "$s" >/dev/null 2>&1 & local pid=$!
  sleep 2
  timeout 300 taskset -c 1 bash -c "$c" 2>/dev/null
  wait $pid 2>/dev/null
}
