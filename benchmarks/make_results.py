"""Write benchmarks/results/RESULTS.md from the JSON results next to it.

    python benchmarks/make_results.py [--results benchmarks/results] [--output .../RESULTS.md]

``dlprim-bench --json`` records (one per device) give the headline table and a table per suite;
the per-family benchmark scripts' records (``"benchmark": "gemm"`` and the like) are listed
with their rows. Numbers are copied, not recomputed: the JSON files are the source of truth.
"""
import argparse
import json
import math
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _fmt(value, spec):
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return format(value, spec)


def _rate(value):
    """A rate or time: thousands separated when large, four significant digits otherwise."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return f"{value:,.0f}" if abs(value) >= 1e4 else format(value, ".4g")


def _geomean(values):
    values = [v for v in values if v and v > 0]
    if not values:
        return None
    return math.exp(sum(math.log(v) for v in values) / len(values))


def _row_by_name(record, suite, name):
    for row in record["rows"]:
        if row["suite"] == suite and row["name"] == name and row["status"] == "ok":
            return row
    return None


def _device_label(record):
    device = record["device"]
    return f"{device['name']} ({device['platform']}, driver {device['driver_version']})"


def headline(records):
    """One line per dlprim-bench record: peaks, best GEMM rate, speed vs torch per suite."""
    suites = ("gemm", "conv", "ops", "fusion")
    lines = ["| device | mode | FP32 peak GFLOP/s | copy GB/s | launch us (back to back / "
             "queued to start) | best GEMM GFLOP/s | "
             + " | ".join(f"{s} x torch" for s in suites)
             + " | ResNet-50 conv fwd total ms (x torch) | baseline |",
             "|---|---|---|---|---|---|" + "---|" * len(suites) + "---|---|"]
    for name, rec in records:
        fma = _row_by_name(rec, "peak", "fp32 multiply-add")
        copy = _row_by_name(rec, "peak", "copy bandwidth")
        launch = _row_by_name(rec, "peak", "kernel launch")
        gemm_rates = [r["rate"] for r in rec["rows"] if r["suite"] == "gemm" and r["status"] == "ok"
                      and r["rate"]]
        ratios = []
        for suite in suites:
            geo = _geomean([r["speedup_vs_torch"] for r in rec["rows"]
                            if r["suite"] == suite and r["status"] == "ok"])
            ratios.append(_fmt(geo, ".2f"))
        torch = rec.get("torch") or {}
        baseline = (f"torch {torch.get('version', '?')} {torch.get('device', '')}"
                    if "version" in torch else torch.get("note", "none"))
        options = rec["options"]
        mode = "quick" if options.get("quick") else "full"
        if options.get("batch"):
            mode += f", batch {options['batch']}"
        if "conv" in options.get("suites", ()):
            nets, directions = options.get("nets") or [], options.get("directions") or []
            if len(nets) < 3 or len(directions) < 3:
                mode += f", conv {'+'.join(nets)} {'+'.join(directions)}"
        resnet = [t for t in rec.get("conv_totals") or []
                  if t["net"] == "resnet50" and t["direction"] == "fwd"]
        resnet_cell = "-"
        if resnet and not rec["options"].get("quick"):
            resnet_cell = (f"{_fmt(resnet[0]['ms'], '.4g')} "
                           f"({_fmt(resnet[0]['speedup_vs_torch'], '.2f')})")
        lines.append(
            f"| {rec['device']['name']} | {mode} | {_rate(fma and fma['rate'])} | "
            f"{_rate(copy and copy['rate'])} | "
            f"{_fmt(launch and launch['median_ms'] * 1e3, '.3g')} / "
            f"{_fmt(launch and launch['params'].get('queued_to_start_us'), '.3g')} | "
            f"{_rate(max(gemm_rates) if gemm_rates else None)} | " + " | ".join(ratios)
            + f" | {resnet_cell} | {baseline} |")
    return lines


def suite_table(rec, suite):
    rows = [r for r in rec["rows"] if r["suite"] == suite]
    if not rows:
        return []
    lines = [f"#### {suite}", "",
             "| case | algorithm | median ms | p20-p80 ms | rate | % peak | torch ms | x torch |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["status"] != "ok":
            lines.append(f"| {r['name']} | {r['algorithm'] or '-'} | {r['status']} | | | | | |")
            continue
        rate = f"{_rate(r['rate'])} {r['unit']}" if r["rate"] else "-"
        lines.append(f"| {r['name']} | {r['algorithm'] or '-'} | {_fmt(r['median_ms'], '.4g')} | "
                     f"{_fmt(r['p20_ms'], '.4g')}-{_fmt(r['p80_ms'], '.4g')} | {rate} | "
                     f"{_fmt(r['peak_percent'], '.1f')} | {_fmt(r['torch_median_ms'], '.4g')} | "
                     f"{_fmt(r['speedup_vs_torch'], '.2f')} |")
    return lines + [""]


def bench_section(name, rec):
    lib = rec["library"]
    torch = rec.get("torch") or {}
    options = rec["options"]
    lines = [f"### {_device_label(rec)}: `{name}`", "",
             f"- library {lib['version']}, commit {lib.get('commit') or 'unknown'}"
             f"{' (with local changes)' if lib.get('dirty') else ''}; {rec['date']}",
             f"- host: {rec['host']['cpus']} CPUs, Python {rec['host']['python']}, pyopencl "
             f"{rec['host']['pyopencl']}, load average {rec['host'].get('load_average_1min', '?')} "
             f"at the end of the run",
             "- baseline: " + (f"torch {torch['version']} on {torch['device']}"
                                f"{', ' + torch['cuda_device'] if 'cuda_device' in torch else ''}"
                                f"{', TF32 off' if torch.get('device') == 'cuda' else ''}"
                                if "version" in torch else torch.get("note", "none")),
             f"- options: suites {', '.join(options['suites'])}; "
             f"{'--quick' if options.get('quick') else 'full'}; batch "
             f"{options.get('batch') or 'default'}; {options.get('repeat')} repeats at most, "
             f"{options.get('budget_s')} s per case; elapsed {rec['elapsed_s']} s",
             "- x torch = PyTorch time / dlprim_py time (above 1: faster than PyTorch); % peak is "
             "of the FP32 rate or copy bandwidth measured in the same run", ""]
    totals = rec.get("conv_totals") or []
    if totals:
        lines += ["#### conv totals per network", "",
                  "Sum over the measured layers of median time x the layer's count in the network.",
                  "", "| net | direction | layers | convolutions | ms | torch ms | x torch |",
                  "|---|---|---|---|---|---|---|"]
        for t in totals:
            lines.append(f"| {t['net']} | {t['direction']} | {t['layers']} | {t['convolutions']} | "
                         f"{_fmt(t['ms'], '.4g')} | {_fmt(t['torch_ms'], '.4g')} | "
                         f"{_fmt(t['speedup_vs_torch'], '.2f')} |")
        lines.append("")
    for suite in ("peak", "gemm", "conv", "ops", "fusion"):
        lines += suite_table(rec, suite)
    return lines


def other_section(name, rec):
    """A per-family benchmark script's record: its rows with whichever time fields it has."""
    lines = [f"### {rec.get('benchmark', name)} on {rec.get('device', '?')}: `{name}`", ""]
    facts = [f"{k} {rec[k]}" for k in ("platform", "driver", "baseline", "commit", "date", "batch")
             if k in rec]
    if facts:
        lines += ["- " + "; ".join(str(f) for f in facts), ""]
    summary = rec.get("summary")
    if isinstance(summary, dict) and summary:
        lines += ["- summary: " + ", ".join(f"{k} {_fmt(v, '.3g') if isinstance(v, float) else v}"
                                             for k, v in summary.items()), ""]
    rows = rec.get("rows") or rec.get("results") or []
    if rows and isinstance(rows[0], dict):
        label_keys = [k for k in ("model", "group", "name", "layer", "direction", "shape")
                      if any(k in r for r in rows)]
        keys = [k for k in ("algorithm", "algo", "ours_ms", "baseline_ms", "ratio",
                            "speed_vs_baseline", "ours_tflops", "ours_gbs", "error")
                if any(k in r for r in rows)]
        lines += ["| case | " + " | ".join(keys) + " |", "|---|" + "---|" * len(keys)]
        for r in rows:
            label = " ".join(str(r[k]) for k in label_keys if k in r) or "?"
            cells = [(_fmt(r.get(k), ".3g" if k == "error" else ".4g")
                      if isinstance(r.get(k), (int, float)) and not isinstance(r.get(k), bool)
                      else str(r.get(k, "-"))) for k in keys]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        lines.append("")
    return lines


def load(results_dir):
    bench_records, others = [], []
    for path in sorted(Path(results_dir).glob("*.json")):
        try:
            rec = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            print(f"skipping {path.name}: {e}", file=sys.stderr)
            continue
        if isinstance(rec, dict) and "schema" in rec and "rows" in rec and "device" in rec:
            bench_records.append((path.name, rec))
        elif isinstance(rec, dict):
            others.append((path.name, rec))
    return bench_records, others


def load_user_records(results_dir):
    """The records of benchmarks/dispatch.py, benchmarks/nets.py and benchmarks/onnx.py under
    ``*/``: (name, record) pairs, dispatch, nets and onnx runs in name order."""
    found = []
    for path in sorted(Path(results_dir).glob("*/dispatch-*.json")) + \
            sorted(Path(results_dir).glob("*/nets-*.json")) + \
            sorted(Path(results_dir).glob("*/onnx-run*.json")):
        try:
            found.append((f"{path.parent.name}/{path.name}", json.loads(path.read_text())))
        except (OSError, ValueError) as e:
            print(f"skipping {path}: {e}", file=sys.stderr)
    return found


def user_section(records):
    """What users see: public calls and whole networks, wall clock with the device drained,
    against PyTorch timed the same way in the same process."""
    lines = ["## As users call it (wall clock, device drained, against PyTorch eager)", "",
             "From `benchmarks/dispatch.py`, `benchmarks/nets.py` and `benchmarks/onnx.py` (the "
             "same cases as `dlprim-bench --suite dispatch` / `--suite nets` / `--suite onnx`). "
             "Ratios are PyTorch time / ours; the device span column of the public calls is "
             "OpenCL profiling time between markers around the call (where the time goes, not "
             "the headline). ONNX models: `model(x)` of `dp.onnx.load`, peak memory ours = "
             "`memory_bytes` + weights + input, PyTorch's = `max_memory_allocated`; plan s = load + "
             "first call in the benchmark's process (its kernel cache may be empty on a fresh "
             "machine), plan cold s = the same in a fresh process with every kernel cache "
             "empty.", ""]
    for name, rec in records:
        if rec.get("benchmark") == "onnx":
            torch = rec.get("torch", "?")
            torch = torch.get("version", "?") if isinstance(torch, dict) else torch
            lines += [f"### `{name}` ({rec.get('device', '?')}, driver {rec.get('driver', '?')}, "
                      f"torch {torch}, commit {rec.get('commit', '?')})", "",
                      "| model | batch | ours ms | torch ms | torch / ours | ours MiB | "
                      "torch MiB | plan s | plan cold s | error | status |",
                      "|---|---|---|---|---|---|---|---|---|---|---|"]
            for r in rec.get("results", []):
                mib = [None if r.get(k) is None else r[k] / 2 ** 20
                       for k in ("ours_peak_bytes", "torch_peak_bytes")]
                lines.append(f"| {r.get('model')} | {r.get('batch')} | "
                             f"{_fmt(r.get('ours_ms'), '.2f')} | {_fmt(r.get('torch_ms'), '.2f')} | "
                             f"{_fmt(r.get('ratio'), '.2f')}x | {_fmt(mib[0], '.0f')} | "
                             f"{_fmt(mib[1], '.0f')} | {_fmt(r.get('plan_warm_s'), '.2f')} | "
                             f"{_fmt(r.get('plan_cold_s'), '.2f')} | "
                             f"{_fmt(r.get('error'), '.1e')} | {r.get('status', '')} |")
            lines.append("")
        elif "public" in rec:
            lines += [f"### `{name}` ({rec.get('device', '?')}, driver {rec.get('driver', '?')}, "
                      f"torch {rec.get('torch', '?')} on {rec.get('torch_device', '?')})", "",
                      "| public call | ours ms | torch ms | torch / ours | device span ms | error |",
                      "|---|---|---|---|---|---|"]
            for r in rec["public"]:
                lines.append(f"| {r['name']} | {_fmt(r['ours_ms'], '.3f')} | "
                             f"{_fmt(r['torch_ms'], '.3f')} | {_fmt(r['ratio'], '.2f')}x | "
                             f"{_fmt(r.get('device_span_ms'), '.3f')} | "
                             f"{_fmt(r.get('error'), '.1e')} |")
            hosts = ", ".join(f"{r['name']} {r['us']:.0f}" for r in rec.get("host_us", []))
            lines += ["", f"Host microseconds per repeated call (tiny tensors): {hosts}; "
                          f"backward, per node: "
                          f"{_fmt(rec.get('backward_us_per_node'), '.0f')}.", ""]
        elif "cases" in rec or "results" in rec:
            cases = rec.get("cases") or rec.get("results") or []
            lines += [f"### `{name}` ({rec.get('device', '?')})", "",
                      "| net | mode | batch | ours ms | torch ms | torch / ours | error | status |",
                      "|---|---|---|---|---|---|---|---|"]
            for c in cases:
                ours = (c.get("ours") or {}).get("median_ms")
                theirs = (c.get("torch") or {}).get("median_ms")
                ratio = theirs / ours if ours and theirs else None
                lines.append(f"| {c.get('net')} | {c.get('mode')} | {c.get('batch')} | "
                             f"{_fmt(ours, '.2f')} | {_fmt(theirs, '.2f')} | "
                             f"{_fmt(ratio, '.2f')}x | {_fmt(c.get('error'), '.1e')} | "
                             f"{c.get('status', '')} |")
            lines.append("")
    return lines


def render(bench_records, others, user_records=()):
    lines = ["# Benchmark results", "",
             "Generated by `python benchmarks/make_results.py` from the JSON files in this folder; "
             "do not edit by hand.", "",
             "To reproduce (each run times PyTorch on the same machine as the baseline):", "",
             "```sh",
             "# a CPU with PoCL (2 cores here): the quick set, in under 3 minutes",
             "dlprim-bench --quick --json benchmarks/results/dlprim-bench-pocl-2core-quick.json",
             "# an NVIDIA GPU (OpenCL ICD registered, see the README; PyTorch with CUDA for the "
             "baseline)",
             "dlprim-bench --json benchmarks/results/dlprim-bench-h200.json",
             "python benchmarks/make_results.py",
             "```", "",
             "One operator call alone: `dlprim-driver conv -n 32 -c 64 -H 56 -W 56 -k 64 -y 3 -x 3 "
             "-p 1 -q 1 -F 1 -t 1 -V 1`; `DLPRIM_LOG_CMD=1` prints that line for every call a "
             "program makes.", ""]
    if user_records:
        lines += user_section(user_records)
    if bench_records:
        lines += ["## Headline (dlprim-bench)", ""] + headline(bench_records) + [""]
        lines += ["Speed vs torch is the geometric mean over a suite's measured cases.", ""]
        lines += ["## dlprim-bench records", ""]
        for name, rec in bench_records:
            lines += bench_section(name, rec)
    if others:
        lines += ["## Per-family benchmark scripts", ""]
        for name, rec in others:
            lines += other_section(name, rec)
    return "\n".join(lines).rstrip() + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", default=str(HERE / "results"))
    parser.add_argument("--output", default=None, help="default: RESULTS.md in --results")
    args = parser.parse_args(argv)
    bench_records, others = load(args.results)
    output = Path(args.output or Path(args.results) / "RESULTS.md")
    output.write_text(render(bench_records, others, load_user_records(args.results)))
    print(f"wrote {output} ({len(bench_records)} dlprim-bench records, {len(others)} others)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
