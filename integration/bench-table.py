#!/usr/bin/env python3
"""Markdown tables from integration/bench-vs-libfabric's CSV.

usage: bench-table.py CSV                      print the tables
       bench-table.py --splice DOC --stamp S CSV
                                               replace the block between the
                                               bench-vs-libfabric markers in DOC
"""
import csv
import sys

BEGIN = "<!-- bench-vs-libfabric:begin -->"
END = "<!-- bench-vs-libfabric:end -->"
COLS = [
    ("libfabric", "libfabric"),
    ("weft-interrupt", "interrupt"),
    ("weft-busy-poll", "busy-poll"),
    ("weft-inline", "inline"),
    ("weft-inline-async", "inline async"),
    ("weft-interrupt-async", "interrupt async"),
    ("raw-spin", "raw spin"),
    ("raw-block", "raw block"),
    ("raw-tokio", "raw tokio"),
]
# (label, numerator, denominator, metric): the targets, as ratios.
RATIOS = [
    ("inline / libfabric (lat)", "weft-inline", "libfabric", "usec"),
    ("busy-poll / libfabric (lat)", "weft-busy-poll", "libfabric", "usec"),
    ("inline / raw spin (lat)", "weft-inline", "raw-spin", "usec"),
    ("busy-poll / raw spin (lat)", "weft-busy-poll", "raw-spin", "usec"),
    ("interrupt / raw block (lat)", "weft-interrupt", "raw-block", "usec"),
    ("raw tokio / raw block (lat)", "raw-tokio", "raw-block", "usec"),
    ("inline async / inline post (lat)", "weft-inline-async", "weft-inline", "usec"),
    ("interrupt async / interrupt post (lat)", "weft-interrupt-async", "weft-interrupt", "usec"),
    ("best weft / libfabric (bw)", "best", "libfabric", "mbps"),
    ("best weft / raw spin (bw)", "best", "raw-spin", "mbps"),
]


def load(path):
    data = {}
    with open(path) as f:
        for row in csv.DictReader(f):
            d = data.setdefault(int(row["size"]), {})
            d[row["impl"]] = (float(row["usec"]), float(row["mbps"]))
    return data


def val(d, impl, metric):
    if impl == "best":
        ws = [v[1] for k, v in d.items() if k.startswith("weft-") and v[1] == v[1]]
        return max(ws) if ws else float("nan")
    v = d.get(impl)
    if v is None:
        return float("nan")
    return v[0] if metric == "usec" else v[1]


def fmt(x):
    return "-" if x != x else (f"{x:.2f}" if x < 100 else f"{x:.0f}")


def size_name(s):
    return f"{s >> 20} MiB" if s >= 1 << 20 and s % (1 << 20) == 0 else (
        f"{s >> 10} KiB" if s >= 1024 and s % 1024 == 0 else f"{s} B")


def tables(data):
    out = []
    for metric, title in (("usec", "usec/xfer (half round trip)"), ("mbps", "MB/s")):
        out.append(f"**{title}**\n")
        out.append("| size | " + " | ".join(c[1] for c in COLS) + " |")
        out.append("|---" * (len(COLS) + 1) + "|")
        for s in sorted(data):
            out.append(f"| {size_name(s)} | " + " | ".join(fmt(val(data[s], c[0], metric)) for c in COLS) + " |")
        out.append("")
    out.append("**Ratios** (below 1 is better for latency, above 1 better for bandwidth)\n")
    out.append("| size | " + " | ".join(r[0] for r in RATIOS) + " |")
    out.append("|---" * (len(RATIOS) + 1) + "|")
    for s in sorted(data):
        cells = []
        for _, a, b, m in RATIOS:
            x, y = val(data[s], a, m), val(data[s], b, m)
            cells.append(fmt(x / y) if x == x and y == y and y > 0 else "-")
        out.append(f"| {size_name(s)} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv):
    if len(argv) == 2:
        print(tables(load(argv[1])))
        return 0
    if len(argv) == 6 and argv[1] == "--splice" and argv[3] == "--stamp":
        doc, stamp, path = argv[2], argv[4], argv[5]
        text = open(doc).read()
        if BEGIN not in text or END not in text:
            print(f"{doc}: markers {BEGIN} / {END} missing", file=sys.stderr)
            return 1
        head, rest = text.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        block = f"{BEGIN}\n_{stamp}_\n\n{tables(load(path))}\n{END}"
        open(doc, "w").write(head + block + tail)
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
