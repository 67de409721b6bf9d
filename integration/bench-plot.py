#!/usr/bin/env python3
"""Plot of integration/bench-vs-libfabric's CSV: latency and bandwidth
against message size, one line per implementation.

usage: bench-plot.py CSV OUT.svg
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(path, out):
    series = {}
    with open(path) as f:
        for row in csv.DictReader(f):
            u, m = float(row["usec"]), float(row["mbps"])
            if u == u:
                series.setdefault(row["impl"], []).append((int(row["size"]), u, m))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for impl, pts in sorted(series.items()):
        pts.sort()
        xs = [p[0] for p in pts]
        style = "--" if impl.startswith("raw") else (":" if impl == "libfabric" else "-")
        ax1.plot(xs, [p[1] for p in pts], style, marker="o", ms=3, label=impl)
        ax2.plot(xs, [p[2] for p in pts], style, marker="o", ms=3, label=impl)
    for ax, yl in ((ax1, "usec/xfer (half round trip)"), (ax2, "MB/s")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel(yl)
        ax.grid(True, which="both", alpha=0.3)
    ax1.set_title("latency (lower is better)")
    ax2.set_title("bandwidth (higher is better)")
    ax2.legend(fontsize=8, loc="lower right")
    fig.suptitle("tcp RDM ping-pong on loopback: weft vs libfabric fi_pingpong vs raw sockets")
    fig.tight_layout()
    fig.savefig(out)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    main(sys.argv[1], sys.argv[2])
