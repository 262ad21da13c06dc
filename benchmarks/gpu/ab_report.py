"""Side-by-side report of a run_ab.sh folder: the base tree's figures and this tree's, case by case.

    python benchmarks/gpu/ab_report.py --out OUT [--tolerance-pct 2]      # reads OUT/{base,new}, writes OUT/ab.{md,json}

- Engine decode (OUT/<tree>/engine_r*/engine_bench.json): ms/step of every (shape, mode, batch, context) case, the
  mean over the rounds and the best round; TTFT likewise.
- Kernels (OUT/<tree>/mla_decode_r*/mla_decode_h200.json, OUT/<tree>/moe_r*/moe_h200.json): time per call of every
  case in each round (MLA decode: time_us; MoE: time_us_graph per GB its active experts' weights hold, since the
  benchmark routes with a fresh seed each run and the active experts differ).
The change is new / base - 1 on the round means (a negative change is faster). A case is flagged when this tree is
slower by more than --tolerance-pct; the exit status is 1 when any case is flagged or a tree's results are missing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

TREES = ("base", "new")


def engine_cases(folder: Path) -> dict[str, dict[str, list[float]]]:
    """{"decode ...": {tree: [ms per step of each round]}, "ttft ...": ...} from the rounds' engine_bench.json."""
    cases: dict[str, dict[str, list[float]]] = {}
    for tree in TREES:
        for path in sorted((folder / tree).glob("engine_r*/engine_bench.json")):
            result = json.loads(path.read_text())
            for shape, s in result.get("shapes", {}).items():
                for mode, m in s.get("modes", {}).items():
                    for d in m.get("decode", []):
                        if d.get("status") == "ok":
                            key = f"decode {shape} {mode} batch {d['batch']} ctx {d['context']} (ms/step)"
                            cases.setdefault(key, {}).setdefault(tree, []).append(d["ms_per_step"])
                    for t in m.get("ttft", []):
                        if t.get("status") == "ok" and t.get("ttft_ms_min") is not None:
                            key = f"ttft {shape} {mode} ctx {t['context']} (ms, best repeat)"
                            cases.setdefault(key, {}).setdefault(tree, []).append(t["ttft_ms_min"])
    return cases


def kernel_cases(folder: Path) -> dict[str, dict[str, list[float]]]:
    cases: dict[str, dict[str, list[float]]] = {}
    for tree in TREES:
        for mla in sorted((folder / tree).glob("mla_decode_r*/mla_decode_h200.json")):
            for p in json.loads(mla.read_text()).get("perf", []):
                key = (f"mla_decode {p.get('tag')} h{p['heads']} batch {p['batch']} ctx {p['context']} "
                       f"{p.get('kernel')} (us)")
                cases.setdefault(key, {}).setdefault(tree, []).append(p["time_us"])
        for moe in sorted((folder / tree).glob("moe_r*/moe_h200.json")):
            for p in json.loads(moe.read_text()).get("perf", []):
                # moe_bench draws its routing from a fresh seed each run, so the active experts (the bytes a call must
                # read) differ between runs: the time per byte is what compares.
                key = f"moe {p['model']} {p.get('tag')} T={p['tokens']} {p.get('path')} (us per GB read, graph)"
                cases.setdefault(key, {}).setdefault(tree, []).append(1e9 * p["time_us_graph"] / p["bytes"])
    return cases


def rows(cases: dict[str, dict[str, list[float]]], tolerance_pct: float) -> list[dict]:
    out = []
    for key, by_tree in cases.items():
        base, new = by_tree.get("base", []), by_tree.get("new", [])
        row = {"case": key, "base": base, "new": new}
        if base and new:
            row["change_pct"] = 100.0 * (statistics.mean(new) / statistics.mean(base) - 1.0)
            row["best_change_pct"] = 100.0 * (min(new) / min(base) - 1.0)
            row["flagged"] = row["change_pct"] > tolerance_pct
        else:
            row["flagged"] = True  # a case one tree lacks is a difference too
        out.append(row)
    return out


def fmt(values: list[float]) -> str:
    return " / ".join(f"{v:.3f}" for v in values) if values else "missing"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--tolerance-pct", type=float, default=2.0)
    ap.add_argument("--base-commit", default="unknown")
    ap.add_argument("--new-commit", default="unknown")
    args = ap.parse_args()

    sections = {"Engine": rows(engine_cases(args.out), args.tolerance_pct),
                "Kernels": rows(kernel_cases(args.out), args.tolerance_pct)}
    flagged = [r["case"] for rs in sections.values() for r in rs if r["flagged"]]
    lines = [f"# A/B: base {args.base_commit} against {args.new_commit}", "",
             f"Each figure is one round; the change compares the round means (negative: faster). Flagged: slower by "
             f"more than {args.tolerance_pct:g}%, or missing in one tree.", ""]
    for title, rs in sections.items():
        lines += [f"## {title}", "", "| case | base | new | change | best vs best | |", "|---|---|---|---:|---:|---|"]
        for r in rs:
            change = f"{r['change_pct']:+.2f}%" if "change_pct" in r else ""
            best = f"{r['best_change_pct']:+.2f}%" if "best_change_pct" in r else ""
            lines.append(f"| {r['case']} | {fmt(r['base'])} | {fmt(r['new'])} | {change} | {best} | "
                         f"{'FLAGGED' if r['flagged'] else ''} |")
        lines.append("")
    lines.append(f"{len(flagged)} flagged of {sum(len(rs) for rs in sections.values())} cases.")
    (args.out / "ab.md").write_text("\n".join(lines) + "\n")
    (args.out / "ab.json").write_text(json.dumps(
        {"base_commit": args.base_commit, "new_commit": args.new_commit, "tolerance_pct": args.tolerance_pct,
         "sections": sections, "flagged": flagged}, indent=2))
    print("\n".join(lines))
    empty = not any(sections.values())
    return 1 if flagged or empty else 0


if __name__ == "__main__":
    sys.exit(main())
