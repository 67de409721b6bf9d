#!/bin/bash
# Runs inside the weft-rxe VM, chrooted into the (read-only) host root, started
# by the initramfs /init (integration/rxe/init). Mounts the --rw exports, sets
# up the soft-RoCE devices, then runs the command of the run (ctl/cmd) with the
# host's environment (ctl/env.sh) in its directory (ctl/cwd).
# Its own messages go to the serial console; the command's stdout/stderr go to
# ctl/stdout and ctl/stderr, which the host streams; ctl/status gets the status.
# shellcheck disable=SC2015 # "a && b || fail" is meant: fail if either fails
CTL=/run/weft-rxe
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
fail() { echo "WEFT_RXE_SETUP_ERROR: $*"; exit 125; }

# --- file systems -----------------------------------------------------------
CWD=$(cat $CTL/cwd)
case "$CWD" in
  /tmp/*|/var/tmp/*)  # tmpfs in the guest: show the host's directory, read-only
    mkdir -p "$CWD" && mount -o bind,ro "/run/host$CWD" "$CWD" \
      || fail "cannot make $CWD visible" ;;
esac
# read-write exports, tab-separated "tag<TAB>dir", parents before children
while IFS=$'\t' read -r tag dir; do
  [ -n "$tag" ] || continue
  mkdir -p "$dir" 2>/dev/null
  mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000,cache=none "$tag" "$dir" \
    || fail "cannot mount --rw $dir"
done < $CTL/rw.list

# --- network: lo, and a veth pair that behaves like two hosts ----------------
ip link set lo up || fail "ip link set lo up"
ip link add veth0 mtu 9000 type veth peer name veth1 mtu 9000 || fail "ip link add veth0/veth1"
ip addr add 10.66.0.1/24 dev veth0 && ip addr add 10.66.0.2/24 dev veth1 || fail "ip addr add"
for c in all default veth0 veth1; do echo 0 > /proc/sys/net/ipv4/conf/$c/rp_filter; done
for c in veth0 veth1; do
  echo 1 > /proc/sys/net/ipv4/conf/$c/accept_local
  echo 1 > /proc/sys/net/ipv4/conf/$c/arp_ignore
  echo 2 > /proc/sys/net/ipv4/conf/$c/arp_announce
done
ip link set veth0 up && ip link set veth1 up || fail "ip link set veth up"
# Both addresses are local, so by default the kernel sends 10.66.0.2 <->
# 10.66.0.1 through lo and RoCE packets from rxe2 never reach rxe1. Send
# locally generated traffic between them out of the other end of the pair.
ip rule add pref 100 lookup local && ip rule del pref 0 \
  && ip rule add pref 10 to 10.66.0.1 iif lo lookup 166 \
  && ip rule add pref 11 to 10.66.0.2 iif lo lookup 166 \
  && ip route add 10.66.0.1 dev veth1 src 10.66.0.2 table 166 \
  && ip route add 10.66.0.2 dev veth0 src 10.66.0.1 table 166 \
  || fail "policy routing for the veth pair"

# --- soft-RoCE devices -----------------------------------------------------
rdma link add rxe0 type rxe netdev lo || fail "rdma link add rxe0 (lo)"
rdma link add rxe1 type rxe netdev veth0 || fail "rdma link add rxe1 (veth0)"
rdma link add rxe2 type rxe netdev veth1 || fail "rdma link add rxe2 (veth1)"
gid_index() { # DEV IPV4 -> index of the RoCE v2 GID ::ffff:IPV4
  local want f
  # shellcheck disable=SC2086 # split the address into its four numbers
  want=$(printf '0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x' ${2//./ })
  for f in /sys/class/infiniband/"$1"/ports/1/gids/*; do
    [ "$(cat "$f" 2>/dev/null)" = "$want" ] && { echo "${f##*/}"; return 0; }
  done
  return 1
}
for _ in $(seq 50); do
  LO_GID=$(gid_index rxe0 127.0.0.1) && SERVER_GID=$(gid_index rxe1 10.66.0.1) \
    && CLIENT_GID=$(gid_index rxe2 10.66.0.2) && break
  sleep 0.1
done
[ -n "${CLIENT_GID:-}" ] || fail "the RoCE GIDs did not appear: $(rdma link 2>&1)"

# --- the command -------------------------------------------------------------
ulimit -l unlimited || fail "ulimit -l unlimited"
ulimit -c 0
# shellcheck disable=SC1091
. $CTL/env.sh
if [ -n "${TMPDIR:-}" ] && [ ! -w "$TMPDIR" ]; then unset TMPDIR; fi
export RXE_VM=1 \
  WEFT_RXE_LO_DEV=rxe0 WEFT_RXE_LO_IP=127.0.0.1 WEFT_RXE_LO_GID="$LO_GID" \
  WEFT_RXE_SERVER_DEV=rxe1 WEFT_RXE_SERVER_IP=10.66.0.1 WEFT_RXE_SERVER_GID="$SERVER_GID" \
  WEFT_RXE_CLIENT_DEV=rxe2 WEFT_RXE_CLIENT_IP=10.66.0.2 WEFT_RXE_CLIENT_GID="$CLIENT_GID"
cd "$CWD" || fail "cannot cd to $CWD"
echo "WEFT_RXE_SETUP_OK"
bash -c "$(cat $CTL/cmd)" </dev/null >>$CTL/stdout 2>>$CTL/stderr
rc=$?
echo "$rc" > $CTL/status
exit "$rc"
