#!/usr/bin/env python3
"""compare.py BASE.json [NEW.json]: two make bench results side by side
(make bench-compare BASE=old.json [NEW=new.json]; NEW defaults to
build/bench/results.json). Every figure of both is printed with its ratio
new/base. A timed figure carries its spread over the rounds (NAME_min and
NAME_max beside NAME): a change larger than the spread of either run is a
gain or a regression, a smaller one is noise. Peak memory (a "peak...bytes"
figure) is measured, not timed: any increase is a regression. A section that
ran before and fails now is a regression. Exit status 1 when there is any
regression, so a course or CI can hold a stage to its figures.

compare.py --summary RESULTS.json prints one results file's judged figures.
"""
import json
import sys
from pathlib import Path

SKIP_SUFFIXES = ("_min", "_max", "_target", "_seconds")


def leaves(node, path=""):
    """(path, value, sibling dict) for every numeric leaf."""
    if isinstance(node, dict):
        for k, v in node.items():
            p = f"{path}.{k}" if path else k
            if isinstance(v, (dict, list)):
                yield from leaves(v, p)
            elif isinstance(v, (int, float)) and not isinstance(v, bool):
                yield p, k, v, node
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from leaves(v, f"{path}[{i}]")


def lower_is_better(key):
    return key.endswith("_ms") or key == "ms" or "_ms_" in key or key.startswith("step_ms")


def figures(results):
    """path -> (value, relative spread or None, lower_is_better, judged)"""
    out = {}
    for name, sec in results.get("sections", {}).items():
        if sec.get("failed"):
            continue
        for path, key, v, parent in leaves(sec, name):
            if key.endswith(SKIP_SUFFIXES) or key.startswith("_"):
                continue
            lo, hi = parent.get(key + "_min"), parent.get(key + "_max")
            if isinstance(lo, (int, float)) and isinstance(hi, (int, float)) and v:
                out[path] = (v, (hi - lo) / abs(v), lower_is_better(key), True)
            elif "peak" in key and "bytes" in key:
                out[path] = (v, 0.0, True, True)
            else:
                out[path] = (v, None, lower_is_better(key), False)
    return out


def load(path):
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        sys.exit(f"bench-compare: cannot read {path}: {e}; make bench writes build/bench/results.json")


def summary(path):
    res = load(path)
    figs = figures(res)
    failed = [n for n, s in res.get("sections", {}).items() if s.get("failed")]
    print(f"{path}: commit {str(res.get('commit'))[:12]}, {res['machine'].get('cpu')}, "
          f"{res['machine'].get('cores')} cores")
    for p, (v, spread, lower, judged) in sorted(figs.items()):
        if judged and spread:
            print(f"  {p:60s} {v:14.6g}  spread {100 * spread:5.1f}%")
    for n in failed:
        print(f"  section {n} FAILED (exit {res['sections'][n].get('exit')}): see its log")


def main():
    args = sys.argv[1:]
    if args[:1] == ["--summary"] and len(args) == 2:
        return summary(args[1])
    if len(args) not in (1, 2):
        sys.exit("usage: compare.py BASE.json [NEW.json]   (or --summary RESULTS.json)")
    base_path, new_path = args[0], args[1] if len(args) == 2 else "build/bench/results.json"
    base, new = load(base_path), load(new_path)
    if base.get("machine", {}).get("cpu") != new.get("machine", {}).get("cpu"):
        print(f"note: different machines ({base['machine'].get('cpu')} vs {new['machine'].get('cpu')}): "
              "ratios compare the machines as much as the code")
    fb, fn = figures(base), figures(new)
    regressions = gains = 0
    print(f"{'figure':60s} {'base':>12s} {'new':>12s} {'new/base':>9s}  verdict")
    for p in sorted(set(fb) | set(fn)):
        if p not in fb or p not in fn:
            print(f"{p:60s} {'-' if p not in fb else f'{fb[p][0]:.6g}':>12s} "
                  f"{'-' if p not in fn else f'{fn[p][0]:.6g}':>12s} {'':>9s}  only in one")
            continue
        (vb, sb, lower, judged), (vn, sn, _, _) = fb[p], fn[p]
        ratio = vn / vb if vb else float("inf") if vn else 1.0
        verdict = ""
        if judged:
            threshold = max(sb or 0.0, sn or 0.0)
            worse = ratio > 1 + threshold if lower else ratio < 1 - threshold
            better = ratio < 1 - threshold if lower else ratio > 1 + threshold
            verdict = "REGRESSION" if worse else "gain" if better else f"within spread ({100 * threshold:.1f}%)"
            regressions += worse
            gains += better
        print(f"{p:60s} {vb:12.6g} {vn:12.6g} {ratio:9.3f}  {verdict}")
    for name, sec in new.get("sections", {}).items():
        ran_before = name in base.get("sections", {}) and not base["sections"][name].get("failed")
        if sec.get("failed") and ran_before:
            print(f"section {name}: ran in the base, FAILED now (exit {sec.get('exit')}): REGRESSION")
            regressions += 1
    print(f"{regressions} regression(s), {gains} gain(s) beyond the measured spread")
    sys.exit(1 if regressions else 0)


if __name__ == "__main__":
    main()
