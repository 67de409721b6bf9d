# shellcheck shell=bash
# Sourced inside the rxe VM (integration/rxe/vm) by guest-test.sh. The guest
# runs chrooted in the host's root, which is read-only there, and has no
# systemd: podman must keep every piece of state on tmpfs, log events to a
# file and manage cgroups itself.
#
#   WEFT_CONTAINERS_STORAGE  overlay (default; integration/rxe/vm loads the
#                            overlay module at boot) or vfs (a full copy of
#                            the image per container, in RAM)

PODMAN_STATE=/tmp/weft-podman         # images and containers (tmpfs)
PODMAN_RUN=/run/weft-podman           # run-time state (tmpfs)
mkdir -p "$PODMAN_STATE/etc" "$PODMAN_STATE/storage" "$PODMAN_STATE/networks" "$PODMAN_RUN"

# crun and podman need the cgroup2 hierarchy, which the VM does not mount.
if ! grep -q '^[^ ]* /sys/fs/cgroup cgroup2 ' /proc/mounts; then
  mount -t cgroup2 cgroup2 /sys/fs/cgroup
fi

cat > "$PODMAN_STATE/etc/storage.conf" <<EOF
[storage]
driver = "${WEFT_CONTAINERS_STORAGE:-overlay}"
graphroot = "$PODMAN_STATE/storage"
runroot = "$PODMAN_RUN/storage"
EOF

# Not set on purpose: static_dir and volume_path. They default to places
# below graphroot, which is also where `podman container cleanup` (run by
# conmon when a container exits, without this environment) looks; moving
# them makes every attached run wait for conmon's timeout.
cat > "$PODMAN_STATE/etc/containers.conf" <<EOF
[containers]
netns = "host"
cgroupns = "private"
[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = "$PODMAN_RUN/events.log"
tmp_dir = "$PODMAN_RUN/libpod"
[network]
network_config_dir = "$PODMAN_STATE/networks"
EOF

export CONTAINERS_STORAGE_CONF=$PODMAN_STATE/etc/storage.conf
export CONTAINERS_CONF=$PODMAN_STATE/etc/containers.conf
export TMPDIR=/var/tmp
