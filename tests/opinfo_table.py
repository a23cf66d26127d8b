"""Run every sample of every op_db entry that dlprim_py.functional covers and report.

    python tests/opinfo_table.py [--write] [--samples N] [--ops KEY ...]

Prints the samples refused, grouped per op and reason; the samples wrong; a summary (samples right
/ wrong / refused / crashed, torch.nn.functional variants of op_db covered and the names of those
missing). ``--write`` regenerates tests/opinfo_limitations.py from this run (every sample): the
refusals, keeping the reason of each entry that remains (a new entry's reason is the library's
message, for a reviewer to read in the diff and edit), and KNOWN_WRONG as it stands. Exits 1 when
some sample is wrong (and not in KNOWN_WRONG) or crashed.
"""
import argparse
import collections
import pprint
import sys
import textwrap
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

import opinfo_support as support  # noqa: E402
import dlprim_py as dp  # noqa: E402

TABLE = HERE / "opinfo_limitations.py"

HEADER = '''"""Known limitations of dlprim_py.functional against PyTorch's OpInfo samples (tests/test_opinfo.py).

REFUSALS: the samples the library refuses with one of its errors, and why. A sample refused but
not listed fails the test, and so does a listed sample that no longer raises the error listed.
KNOWN_WRONG: samples that give wrong numbers, each with its reason; the test expects them wrong,
and fails once one turns right or refused (take it out then).

Regenerate REFUSALS with ``python tests/opinfo_table.py --write`` and review the diff: the reasons
of the entries that remain are kept, and a new entry's reason is the library's message. A
sample is named by its description (tensors as dtype[shape], then the other arguments), "*"
stands for every sample of the op.
"""

# op_db name[.variant] -> [(error class, reason, [sample descriptions])]
'''


def load_table():
    namespace = {}
    if TABLE.exists():
        exec(compile(TABLE.read_text(), str(TABLE), "exec"), namespace)
    return namespace.get("REFUSALS", {}), namespace.get("KNOWN_WRONG", {})


def run(ops, limit, refusals, known_wrong):
    ctx = dp.Context()
    results = {}
    for op in ops:
        start = time.perf_counter()
        results[op.key] = support.run_op(ctx, op, limit, refusals, known_wrong)
        kinds = collections.Counter(outcome.kind for _, outcome, _ in results[op.key])
        print(f"  {op.key}: {dict(kinds)} in {time.perf_counter() - start:.1f} s",
              file=sys.stderr, flush=True)
    return results


def new_refusals(results, refusals):
    """REFUSALS as this run found them, with the reasons of ``refusals`` where they still hold."""
    table = {}
    for key, rows in results.items():
        groups = {}
        for sample, outcome, _ in rows:
            if outcome.kind != "refused":
                continue
            listed = support.expected_refusal(refusals, key, sample.description)
            if listed and listed[0] in outcome.error_classes:
                error, reason = listed
            else:
                error, reason = outcome.error, outcome.message
            groups.setdefault((error, reason), []).append(sample.description)
        if not groups:
            continue
        if len(groups) == 1 and len(next(iter(groups.values()))) == len(rows):
            groups = {group: [support.ALL_SAMPLES] for group in groups}
        table[key] = [(error, reason, descriptions)
                      for (error, reason), descriptions in groups.items()]
    return table


def write_table(refusals, known_wrong):
    lines = [HEADER + "REFUSALS = {"]
    for key, entries in refusals.items():
        lines.append(f"    {key!r}: [")
        for error, reason, descriptions in entries:
            lines.append(f"        ({error!r}, {reason!r}, [")
            lines += [f"            {d!r}," for d in descriptions]
            lines.append("        ]),")
        lines.append("    ],")
    lines.append("}")
    lines.append("")
    lines.append("# op_db name[.variant] -> {sample description: why it is wrong}")
    lines.append("KNOWN_WRONG = " + pprint.pformat(known_wrong, width=100, sort_dicts=False))
    TABLE.write_text("\n".join(lines) + "\n")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true",
                        help="regenerate tests/opinfo_limitations.py (runs every sample)")
    parser.add_argument("--samples", default="all",
                        help="samples per op, as DLPRIM_OPINFO_SAMPLES (default: all)")
    parser.add_argument("--ops", nargs="*", help="only these op keys (not with --write)")
    args = parser.parse_args(argv)
    limit = support.sample_limit(args.samples)
    if args.write and (limit is not None or args.ops):
        parser.error("--write runs every sample of every op: leave out --samples and --ops")

    refusals, known_wrong = load_table()
    ops = [op for op in support.mapped_ops() if not args.ops or op.key in args.ops]
    results = run(ops, limit, refusals, known_wrong)

    found = new_refusals(results, refusals)
    print("Refused samples, per op and reason:")
    for key, entries in found.items():
        for error, reason, descriptions in entries:
            count = (len(results[key]) if descriptions == [support.ALL_SAMPLES]
                     else len(descriptions))
            print(f"  {key}: {count} x {error}: {reason}")
    # New refusals are in the list above; the other failures of tests/test_opinfo.py:
    problems = [(key, sample, outcome, failure) for key, rows in results.items()
                for sample, outcome, failure in rows if failure
                and not (outcome.kind == "refused"
                         and support.expected_refusal(refusals, key, sample.description) is None)]
    if problems:
        print("Samples not as tests/opinfo_limitations.py says (besides new refusals):")
        for key, sample, outcome, failure in problems:
            print(f"  {key}: {failure}")

    kinds = collections.Counter(outcome.kind for rows in results.values() for _, outcome, _ in rows)
    variants = support.functional_variants()
    missing = support.missing_functional_variants()
    print(f"Samples: {sum(kinds.values())}: {kinds['right']} right, {kinds['wrong']} wrong, "
          f"{kinds['refused']} refused, {kinds['crashed']} crashed; op_db entries run: {len(ops)}")
    print(f"torch.nn.functional variants of op_db with float32 samples: {len(variants)}, "
          f"{len(variants) - len(missing)} covered, {len(missing)} missing:")
    print(textwrap.fill(", ".join(missing), width=100, initial_indent="  ",
                        subsequent_indent="  ", break_on_hyphens=False))

    if args.write:
        write_table(found, known_wrong)
        print(f"wrote {TABLE.relative_to(HERE.parent)}")
    unexpected = [p for p in problems if p[2].kind in ("wrong", "crashed")]
    return 1 if unexpected else 0


if __name__ == "__main__":
    sys.exit(main())
