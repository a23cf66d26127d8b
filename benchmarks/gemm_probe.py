"""SGEMM kernel variants side by side with cuBLAS, in one run: which tiled-kernel parameters
(tiles, register blocks, load widths, work-item layout ``lanes_n``, tile order ``tile_group``,
register cap) serve 4096^3 and the other shapes of benchmarks/gemm.py best on this device.

    python benchmarks/gemm_probe.py [--output DIR] [--rounds 3] [--only TEXT] [--quick]
        [--shapes MxNxK[:tn],...] [--dump-ptx DIR]

A shape may name its operands' form after a colon, one letter for A and one for B (n: stored
as multiplied, t: stored transposed; ``768x768x4096:tn`` is A^T B, a linear layer's weight
gradient): the variants, the baseline (torch.mm on the transposed views) and a new rule's
shape (``"trans_a": true``) are for that form.

Every variant runs once on a NaN-filled C and is compared with a float64 reference of the
whole product (PyTorch on CUDA when there, else numpy on sampled rows); a variant with an
error above 1e-5 or an unwritten element is reported and never timed. Then, ``--rounds``
times over, the baseline (cuBLAS through torch.mm, TF32 off, CUDA events) and every variant
(OpenCL profiling markers around the enqueued plan) are timed in turn, median after a
warm-up; the table gives each variant's median over the rounds and its ratio to the
baseline's. On NVIDIA every variant is built with -cl-nv-verbose and the table shows the
register count and spill bytes that the compiler reported.
"""
import argparse
import json
import math
import os
import re
import sys
import time

import numpy as np
import pyopencl as cl

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import dlprim_py as dp  # noqa: E402
from dlprim_py.bench.record import measured_commit  # noqa: E402
from dlprim_py.ops import gemm as gemm_ops  # noqa: E402
from dlprim_py.ops.gemm import GemmPlan, select_params  # noqa: E402
from dlprim_py.timing import time_enqueued  # noqa: E402

from gemm import cuda_mm_median, cuda_torch, shapes as benchmark_shapes  # noqa: E402

_SPEC = re.compile(r"(\d+)x(\d+)x(\d+)$")


def parse_variant(text, base=None):
    """Kernel parameters from a short spec: ``128x128x16 w8x8 v4 p4 gv4 l8 g8 r128 db1 pl3 ac0
    s2`` (tile, work per item, local read width, pad, global load width, lanes_n, tile_group,
    register cap, double buffer, pipeline stages, async_copy, split_k); ``db`` alone means this
    shape's database choice, with the fields that follow overriding it."""
    words = text.split()
    params = gemm_ops.solver_params(base if words and words[0] == "db"
                                    else gemm_ops.DEFAULT_TILED)
    for word in words:
        if word == "db":
            continue
        tile = _SPEC.match(word)
        if tile:
            params.update(tile_m=int(tile[1]), tile_n=int(tile[2]), tile_k=int(tile[3]))
        elif word.startswith("w"):
            wm, wn = word[1:].split("x")
            params.update(wpt_m=int(wm), wpt_n=int(wn))
        elif word.startswith("gv"):
            params["global_vec"] = int(word[2:])
        elif word.startswith("db"):
            params["double_buffer"] = int(word[2:])
        elif word.startswith("pl"):
            params["pipeline"] = int(word[2:])
        elif word.startswith("ac"):
            params["async_copy"] = int(word[2:])
        elif word.startswith("v"):
            params["vec"] = int(word[1:])
        elif word.startswith("p"):
            params["pad"] = int(word[1:])
        elif word.startswith("l"):
            params["lanes_n"] = int(word[1:])
        elif word.startswith("g"):
            params["tile_group"] = int(word[1:])
        elif word.startswith("r"):
            value = int(word[1:])
            if value:
                params["max_registers"] = value
            else:
                params.pop("max_registers", None)
        elif word.startswith("s"):
            params["split_k"] = int(word[1:])
        else:
            raise SystemExit(f"unknown field {word!r} in variant {text!r}")
    if params["solver"] in ("tiled", "splitk"):
        params["solver"] = "splitk" if params.get("split_k", 1) > 1 else "tiled"
    return params


# 4096^3: the current rule; the grouped tile order and the pipelined copies (cp.async on
# NVIDIA; "ac0" plain copies through the same pipeline) under a register cap, which applies
# since the kernel drops its work-group size declaration with a cap (reqd_size); 64 x 128
# tiles capped to 128 registers (four work-groups per compute unit instead of three).
SQUARE_4096 = [
    "db", "db g8 r128", "db g4 r128", "db l8 g8 r128", "db pl2 gv4 g8", "db pl2 r128",
    "db pl2 g8 r128", "db pl2 gv4 g8 r128", "64x128x16 w8x8 gv4", "64x128x16 w8x8 gv4 r128",
    "64x128x16 w8x8 gv4 g8 r128", "128x128x8 w8x8 gv4 pl4 g8", "128x256x8 w8x16 gv4 pl3 g8",
]
# Other shapes: the database's choice with the same options.
OTHERS = ["db", "db r128", "db g8", "db g8 r128"]
QUICK_OTHERS = ["db", "db g8 r128"]
# Every transpose combination on sizes that are not multiples of any tile (edge tiles, the
# end of K), checked in full against numpy float64 before a variant becomes a rule.
EDGE_SHAPES = [(1000, 1000, 1000), (129, 67, 45)]


def short(params, config=None):
    """The variant spec of ``params`` (and of a plan's derived ``config``: cp.async or not)."""
    p = params
    if p["solver"] == "small":
        return "small"
    text = (f"{p['tile_m']}x{p['tile_n']}x{p['tile_k']} w{p['wpt_m']}x{p['wpt_n']} v{p['vec']} "
            f"p{p['pad']} gv{p.get('global_vec', 1)}")
    for key, tag in (("lanes_n", "l"), ("tile_group", "g"), ("max_registers", "r"),
                     ("pipeline", "pl")):
        if p.get(key) not in (None, 0) and not (key == "tile_group" and p[key] == 1):
            text += f" {tag}{p[key]}"
    if p.get("pipeline"):
        text += " cp.async" if config is not None and config.nv_async else " plain-copy"
    if p.get("split_k", 1) > 1:
        text += f" s{p['split_k']}"
    return text


class BuildLogs:
    """Wraps the GEMM module's program builds to add -cl-nv-verbose on NVIDIA and keep the
    register report of the latest build."""

    def __init__(self, ctx):
        self.enabled = ctx.info.vendor == "nvidia"
        self.last = ""
        self.binary = b""
        self.dump_dir = None
        self._build = gemm_ops.program.build
        if self.enabled:
            gemm_ops.program = _ProgramWithLog(gemm_ops.program, self)

    def report(self):
        """(registers, spill bytes, the report) of gemm_tiled in the latest build (the
        program also holds gemm_splitk_reduce, whose report comes first)."""
        lines = [s for s in self.last.splitlines() if "ptxas" in s]
        text = " | ".join(lines)
        tiled = text.split("entry function 'gemm_tiled'", 1)
        tiled = tiled[1].split("Compiling entry function", 1)[0] if len(tiled) == 2 else ""
        regs = re.search(r"Used (\d+) registers", tiled)
        spill = re.findall(r"(\d+) bytes spill", tiled)
        return (int(regs[1]) if regs else None,
                sum(int(s) for s in spill) if spill else None, text)


class _ProgramWithLog:
    def __init__(self, module, logs):
        self._module = module
        self._logs = logs

    def __getattr__(self, name):
        return getattr(self._module, name)

    def build(self, ctx, template, params=None, options=()):
        built = self._module.build(ctx, template, params, tuple(options) + ("-cl-nv-verbose",))
        try:
            self._logs.last = built.program.get_build_info(ctx.device,
                                                           cl.program_build_info.LOG)
        except cl.Error:
            self._logs.last = ""
        try:
            # NVIDIA's program binary is the PTX that ptxas compiled (for --dump-ptx).
            self._logs.binary = built.program.get_info(cl.program_info.BINARIES)[0]
        except (cl.Error, IndexError):
            self._logs.binary = b""
        return built


class Baseline:
    """cuBLAS through PyTorch with the operands kept on the GPU across rounds; none without
    CUDA (benchmarks/gemm.py's Baseline falls back to numpy instead)."""

    def __init__(self):
        self.torch = cuda_torch()
        self.name = (f"cuBLAS (torch {self.torch.__version__}, TF32 off)" if self.torch
                     else "none (no CUDA)")

    def prepare(self, a, b, trans_a=False, trans_b=False):
        torch = self.torch
        self.ta = torch.from_numpy(a).cuda()
        self.tb = torch.from_numpy(b).cuda()
        if trans_a:
            self.ta = self.ta.t()
        if trans_b:
            self.tb = self.tb.t()
        self.out = torch.mm(self.ta, self.tb)
        ref = torch.mm(self.ta.double(), self.tb.double()).cpu().numpy()
        return ref

    def time(self, repeat):
        return cuda_mm_median(self.torch, self.ta, self.tb, self.out, repeat)

    def release(self):
        if self.torch is not None:
            del self.ta, self.tb, self.out
            self.torch.cuda.empty_cache()


def error_of(out, ref, rows=None):
    got = out if rows is None else out[rows]
    if not np.isfinite(got).all():
        return math.inf
    ref = ref if rows is None else ref[rows]
    return float(np.linalg.norm(got.astype(np.float64) - ref)
                 / (math.sqrt(got.size) * np.abs(ref).max()))


def probe_shape(ctx, logs, baseline, name, M, N, K, specs, rounds, rng, log, trans_a=False,
                trans_b=False):
    flops = 2.0 * M * N * K
    a = rng.uniform(-1, 1, (K, M) if trans_a else (M, K)).astype(np.float32)
    b = rng.uniform(-1, 1, (N, K) if trans_b else (K, N)).astype(np.float32)
    op_a, op_b = (a.T if trans_a else a), (b.T if trans_b else b)
    rows = None
    if baseline.torch is not None:
        ref = baseline.prepare(a, b, trans_a, trans_b)
    else:
        rows = np.unique(np.concatenate([[0, M - 1], rng.integers(0, M, 16)]))
        ref = np.zeros((M, N))
        ref[rows] = op_a[rows].astype(np.float64) @ op_b.astype(np.float64)
    mf = cl.mem_flags
    a_buf = cl.Buffer(ctx.cl_context, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=a)
    b_buf = cl.Buffer(ctx.cl_context, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=b)
    c_buf = cl.Buffer(ctx.cl_context, mf.READ_WRITE, M * N * 4)
    out = np.empty((M, N), np.float32)
    chosen = select_params(ctx, M, N, K, trans_a=trans_a, trans_b=trans_b)
    variants, seen = [], set()
    for spec in specs:
        params = parse_variant(spec, chosen)
        problem = gemm_ops.params_problem(params, ctx.info)
        key = json.dumps(params, sort_keys=True)
        if problem is not None or key in seen:
            if problem is not None:
                log(f"  {spec:28s} skipped: {problem}")
            continue
        seen.add(key)
        started = time.perf_counter()
        try:
            plan = GemmPlan(ctx, M, N, K, a_buf, 0, a.shape[1], b_buf, 0, b.shape[1], c_buf, 0, N,
                            trans_a=trans_a, trans_b=trans_b, params=params)
        except dp.DlprimError as e:
            log(f"  {spec:28s} failed to build: {str(e).splitlines()[0]}")
            continue
        build_s = time.perf_counter() - started
        regs, spill, report = logs.report() if logs.enabled else (None, None, "")
        if logs.dump_dir and logs.binary:
            os.makedirs(logs.dump_dir, exist_ok=True)
            stem = re.sub(r"[^A-Za-z0-9]+", "_", f"{name} {spec}").strip("_")
            with open(os.path.join(logs.dump_dir, stem + ".ptx"), "wb") as f:
                f.write(logs.binary)
        cl.enqueue_fill_buffer(ctx.queue, c_buf, np.float32(np.nan), 0, M * N * 4)
        plan.enqueue()
        cl.enqueue_copy(ctx.queue, out, c_buf, is_blocking=True)
        error = error_of(out, ref, rows)
        entry = {"spec": spec, "params": plan.params, "short": short(plan.params, plan.config),
                 "algorithm": plan.algorithm, "error": error, "registers": regs,
                 "spill_bytes": spill, "ptxas": report, "build_s": build_s, "samples_ms": []}
        if not error <= 1e-5:
            log(f"  {spec:28s} WRONG: error {error:.2e}; not timed")
            entry["rejected"] = True
        else:
            entry["plan"] = plan
        variants.append(entry)
    repeat = max(8, min(60, int(0.25 / max(flops / 4.5e13, 1e-6))))
    base_ms = []
    for _ in range(rounds):
        if baseline.torch is not None:
            base_ms.append(baseline.time(repeat) * 1e3)
        for v in variants:
            if "plan" in v:
                t = time_enqueued(ctx, v["plan"].enqueue, warmup=3, repeat=repeat)
                v["samples_ms"].append(t.median * 1e3)
    baseline.release()
    for buf in (a_buf, b_buf, c_buf):
        buf.release()
    base = float(np.median(base_ms)) if base_ms else None
    result = {"name": name, "m": M, "n": N, "k": K, "trans_a": trans_a, "trans_b": trans_b,
              "baseline_ms": base,
              "baseline_rounds_ms": base_ms, "database_choice": short(chosen), "variants": []}
    for v in variants:
        v.pop("plan", None)
        if v["samples_ms"]:
            v["ms"] = float(np.median(v["samples_ms"]))
            v["tflops"] = flops / v["ms"] / 1e9
            v["ratio"] = base / v["ms"] if base else None
        result["variants"].append(v)
    return result


def check_edges(ctx, params, rng):
    """The largest error of ``params`` over EDGE_SHAPES and the four transpose combinations
    (inf when an element stayed NaN)."""
    worst = 0.0
    mf = cl.mem_flags
    for M, N, K in EDGE_SHAPES:
        for trans_a in (False, True):
            for trans_b in (False, True):
                a = rng.uniform(-1, 1, (K, M) if trans_a else (M, K)).astype(np.float32)
                b = rng.uniform(-1, 1, (N, K) if trans_b else (K, N)).astype(np.float32)
                ref = (a.T if trans_a else a).astype(np.float64) @ (b.T if trans_b else b)
                a_buf = cl.Buffer(ctx.cl_context, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=a)
                b_buf = cl.Buffer(ctx.cl_context, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=b)
                c_buf = cl.Buffer(ctx.cl_context, mf.READ_WRITE, M * N * 4)
                cl.enqueue_fill_buffer(ctx.queue, c_buf, np.float32(np.nan), 0, M * N * 4)
                GemmPlan(ctx, M, N, K, a_buf, 0, a.shape[1], b_buf, 0, b.shape[1], c_buf, 0, N,
                         trans_a=trans_a, trans_b=trans_b, params=params).enqueue()
                out = np.empty((M, N), np.float32)
                cl.enqueue_copy(ctx.queue, out, c_buf, is_blocking=True)
                worst = max(worst, error_of(out, ref))
                for buf in (a_buf, b_buf, c_buf):
                    buf.release()
    return worst


def write_rules(ctx, results, path, prefix, rounds, rng, log, margin=0.01):
    """Measured rules for the probed shapes whose names start with ``prefix`` where a variant
    beat the database's choice by more than ``margin`` (median over the rounds) and passed
    check_edges; merged into this device's shipped rules and written to the database at
    ``path`` (the cache directory's, which lookups read first)."""
    from dlprim_py import tuning
    from dlprim_py.tune import merge_rules
    new = []
    for r in results:
        if not r["name"].startswith(prefix):
            continue
        timed = sorted((v for v in r["variants"] if "ms" in v), key=lambda v: v["ms"])
        current = next((v for v in timed if v["spec"] == "db"), None)
        if current is None:
            continue
        for v in timed:
            if v is current or v["ms"] > current["ms"] * (1 - margin):
                break
            params = dict(v["params"])
            baseline_text = (f"cuBLAS {r['baseline_ms']:.4f} ms" if r["baseline_ms"]
                             else "no vendor baseline")
            edges = check_edges(ctx, params, rng)
            v["edge_error"] = edges
            if not edges <= 1e-5:
                log(f"{r['name']}: {v['short']} fails the edge check (error {edges:.1e})")
                continue
            shape = {"m": r["m"], "n": r["n"], "k": r["k"]}
            shape.update({flag: True for flag in ("trans_a", "trans_b") if r.get(flag)})
            new.append({"shape": shape, "params": params,
                        "ms": round(v["ms"], 5), "gflops": round(v["tflops"] * 1e3, 1),
                        "why": f"benchmarks/gemm_probe.py, median of {rounds} rounds: "
                               f"{v['ms']:.4f} ms against {current['ms']:.4f} ms for the rule "
                               f"before ({current['short']}), {baseline_text} in the same "
                               f"run; every transpose on edge shapes checked"})
            log(f"{r['name']}: rule {v['short']} ({v['ms']:.4f} ms, was {current['ms']:.4f})")
            break
    shipped = tuning.read_db(tuning.shipped_path("gemm"), "gemm")["devices"].get(ctx.info.name, {})
    merged = merge_rules(shipped.get("rules", []), new)
    extra = {k: v for k, v in shipped.items() if k not in ("vendor", "platform", "driver", "rules")}
    tuning.store_device_entry(path, "gemm", ctx.info, merged, extra)
    log(f"wrote {len(new)} new rule(s) into {path}")
    return new


def print_table(results, log):
    log("")
    log(f"{'shape':22s} {'variant':40s} {'regs':>4s} {'spill':>5s} {'ms':>8s} {'TFLOP/s':>7s} "
        f"{'ratio':>6s}  rounds")
    for r in results:
        base = r["baseline_ms"]
        log(f"{r['name']:22s} {'cuBLAS':40s} {'':4s} {'':5s} "
            f"{base if base else float('nan'):8.4f} "
            f"{2e-9 * r['m'] * r['n'] * r['k'] / base if base else float('nan'):7.2f}")
        best = max((v for v in r["variants"] if "ms" in v), key=lambda v: -v["ms"], default=None)
        for v in r["variants"]:
            if "ms" not in v:
                log(f"{'':22s} {v['short']:40s} rejected (error {v['error']:.1e})")
                continue
            mark = " *" if v is best else ""
            log(f"{'':22s} {v['short']:40s} {v['registers'] or '-':>4} "
                f"{v['spill_bytes'] if v['spill_bytes'] is not None else '-':>5} "
                f"{v['ms']:8.4f} {v['tflops']:7.2f} {v['ratio'] or float('nan'):6.3f}  "
                f"{' '.join(f'{x:.4f}' for x in v['samples_ms'])}{mark}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", default=None, help="folder for gemm-probe.json")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=32, help="images for the ResNet-50 shapes")
    parser.add_argument("--only", default=None, help="only shapes whose name contains this")
    parser.add_argument("--quick", action="store_true",
                        help="fewer variants for the shapes other than 4096^3")
    parser.add_argument("--square", action="append", default=None,
                        help="variant spec for 4096^3 (repeatable; replaces the built-in list)")
    parser.add_argument("--others", action="append", default=None,
                        help="variant spec for the other shapes (repeatable)")
    parser.add_argument("--time-limit", type=float, default=200.0,
                        help="stop starting new shapes after this many seconds")
    parser.add_argument("--write-rules", default=None, metavar="PATH",
                        help="write the winners (see write_rules) into the database at PATH")
    parser.add_argument("--margin", type=float, default=0.01,
                        help="a new rule must be this fraction faster than the current one")
    parser.add_argument("--squares", default="1024,2048,4096,8192",
                        help="comma-separated sizes of the square problems")
    parser.add_argument("--shapes", default="",
                        help="comma-separated MxNxK problems probed after 4096^3 with --others")
    parser.add_argument("--rules-for", default="square",
                        help="shapes whose names start with this may get new rules")
    parser.add_argument("--dump-ptx", default=None, metavar="DIR",
                        help="write each variant's program binary (PTX on NVIDIA) into DIR")
    parser.add_argument("--commit", default=None)
    parser.add_argument("--device", default=None)
    args = parser.parse_args(argv)
    if args.commit:
        os.environ["DLPRIM_COMMIT"] = args.commit
    started = time.perf_counter()
    ctx = dp.Context(args.device)
    logs = BuildLogs(ctx)
    logs.dump_dir = args.dump_ptx
    baseline = Baseline()
    print(f"device: {ctx.info.name} | {ctx.info.platform_name} | driver "
          f"{ctx.info.driver_version}; baseline {baseline.name}", flush=True)
    rng = np.random.default_rng(11)
    square = args.square or SQUARE_4096
    others = args.others or (QUICK_OTHERS if args.quick else OTHERS)
    squares = [int(x) for x in args.squares.split(",") if x.strip()]
    order = [(*s, False, False) for s in benchmark_shapes(args.batch, squares)
             if s[0] == "square 4096"]
    for text in (x for x in args.shapes.split(",") if x.strip()):
        size, _, form = text.strip().lower().partition(":")
        M, N, K = (int(v) for v in size.split("x"))
        form = form or "nn"
        if len(form) != 2 or set(form) - {"n", "t"}:
            raise SystemExit(f"--shapes {text!r}: the form after ':' is two letters of n and t")
        name = f"{M}x{N}x{K}" + (f" {form}" if form != "nn" else "")
        order.append((name, M, N, K, "extra", form[0] == "t", form[1] == "t"))
    order += [(*s, False, False) for s in benchmark_shapes(args.batch, squares)
              if s[0] != "square 4096"]
    results = []
    for name, M, N, K, group, trans_a, trans_b in order:
        if args.only is not None and args.only not in name:
            continue
        if time.perf_counter() - started > args.time_limit:
            print(f"time limit: {name} and the rest not probed", flush=True)
            break
        specs = square if name == "square 4096" else others
        result = probe_shape(ctx, logs, baseline, name, M, N, K, specs, args.rounds, rng,
                             lambda s: print(s, flush=True), trans_a, trans_b)
        results.append(result)
        print_table([result], lambda s: print(s, flush=True))
    print_table(results, print)
    new_rules = []
    if args.write_rules:
        new_rules = write_rules(ctx, results, args.write_rules, args.rules_for, args.rounds, rng,
                                lambda s: print(s, flush=True), args.margin)
    if args.output:
        os.makedirs(args.output, exist_ok=True)
        path = os.path.join(args.output, "gemm-probe.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"benchmark": "gemm_probe", "device": ctx.info.name,
                       "driver": ctx.info.driver_version, "baseline": baseline.name,
                       "commit": measured_commit(),
                       "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                       "rounds": args.rounds, "new_rules": new_rules, "results": results}, f,
                      indent=1)
        print(f"wrote {path} after {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
