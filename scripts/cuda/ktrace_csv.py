"""Read a ktrace CSV (start,end,stream,name per kernel, as the GPU ran them;
scripts/cuda/ktrace.sh writes it) for ktrace-summary.py and
ktrace-layer.py: load(path) returns the kernels as (start, end, name,
stream) tuples sorted by start, times in ns, names demangled with c++filt
when it is there and shortened (namespaces, "void", the parameter list,
casts in template arguments dropped)."""
import csv, re, subprocess


def load(path):
    rows = list(csv.DictReader(open(path)))
    names = sorted({r["name"] for r in rows})
    plain = {}
    try:  # CUPTI reports mangled names
        out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True).stdout
        plain = dict(zip(names, out.split("\n")))
    except (OSError, subprocess.CalledProcessError):
        pass
    ev = []
    for r in rows:
        name = re.sub(r"\((int|bool|unsigned int)\)", "", plain.get(r["name"], r["name"]))
        name = re.sub(r"ds4mv::|\(anonymous namespace\)::|<unnamed>::|^void ", "", name)
        name = re.sub(r"\(.*", "", name)
        ev.append((int(r["start"]), int(r["end"]), name, int(r["stream"])))
    ev.sort()
    return ev
