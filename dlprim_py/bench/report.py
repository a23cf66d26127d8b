"""The text table of results: one row per case, grouped by suite. A ratio to PyTorch whose
medians do not rank (either side's p80 / p20 above the measurement's max_spread) is shown in
parentheses and left out of the summary's geometric mean."""
import math

from .harness import MAX_SPREAD


def _num(value, fmt):
    return "-" if value is None else format(value, fmt)


def _ratio(value, rankable):
    text = _num(value, ".2f")
    return f"({text})" if value is not None and rankable is False else text


COLUMNS = ("case", "algorithm", "median ms", "p20-p80 ms", "rate", "% peak", "torch ms",
           "x torch", "error")


def format_row(row):
    """The table cells of a Row (strings)."""
    if not row.ok:
        return [row.name, row.algorithm or "-", row.status, "", "", "", "", "", ""]
    spread = f"{_num(row.p20_ms, '.4g')}-{_num(row.p80_ms, '.4g')}"
    rate = "-" if row.rate is None else f"{row.rate:.4g} {row.unit}"
    return [row.name, row.algorithm or "-", _num(row.median_ms, ".4g"), spread, rate,
            _num(row.peak_percent, ".1f"), _num(row.torch_median_ms, ".4g"),
            _ratio(row.speedup_vs_torch, row.rankable), _num(row.error, ".1e")]


def format_table(rows, title=None):
    """A fixed-width table of ``rows``; a failed or skipped row spans the columns after the
    algorithm with its status."""
    cells = [format_row(r) for r in rows]
    widths = [len(c) for c in COLUMNS]
    for line, row in zip(cells, rows):
        limit = len(COLUMNS) if row.ok else 2
        for k in range(limit):
            widths[k] = max(widths[k], len(line[k]))
    out = []
    if title:
        out.append(title)
    out.append("  ".join(c.ljust(w) for c, w in zip(COLUMNS, widths)).rstrip())
    out.append("  ".join("-" * w for w in widths))
    for line, row in zip(cells, rows):
        if row.ok:
            out.append("  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip())
        else:
            out.append("  ".join(c.ljust(w) for c, w in zip(line[:2], widths[:2])) + "  " + line[2])
    return "\n".join(out)


def summary(rows, max_spread=MAX_SPREAD):
    """One line: counts of ok / failed / skipped rows, and the geometric mean of x torch over
    the rows whose ratio ranks; the others are counted as not rankable (their p80 / p20 above
    ``max_spread`` on one side), and when none ranks the line says so instead of a speed-up."""
    ok = [r for r in rows if r.ok]
    failed = [r for r in rows if r.status.startswith("failed")]
    skipped = [r for r in rows if r.status.startswith("skipped")]
    compared = [r for r in ok if r.speedup_vs_torch]
    ranked = [r.speedup_vs_torch for r in compared if r.rankable is not False]
    unranked = len(compared) - len(ranked)
    text = f"{len(ok)} measured, {len(failed)} failed, {len(skipped)} skipped"
    if ranked:
        geo = math.exp(sum(math.log(x) for x in ranked) / len(ranked))
        text += f"; geometric mean speed vs torch {geo:.2f}x over {len(ranked)} cases"
    why = f"p80/p20 above {max_spread:g} on a side; ratios in parentheses"
    if unranked and ranked:
        text += f"; {unranked} more cases not rankable ({why})"
    elif unranked:
        text += (f"; speed vs torch not rankable: the times spread too widely in all "
                 f"{unranked} cases ({why})")
    return text


def network_totals(rows):
    """Per (network, direction): the sum over the network's convolutions of count x median
    time, ours and PyTorch's, when every layer of that direction was measured. A list of
    dicts (net, direction, layers, convolutions, ms, torch_ms, speedup_vs_torch)."""
    groups = {}
    for r in rows:
        # Forced-algorithm rows (group "net [algo]") cover only the layers the algorithm fits.
        if r.suite != "conv" or not r.group or "[" in r.group:
            continue
        direction = next((w for w in r.name.split() if w in ("fwd", "bwd-data", "bwd-filter")),
                         None)
        groups.setdefault((r.group, direction), []).append(r)
    totals = []
    for (net, direction), members in groups.items():
        if not all(m.ok for m in members):
            continue
        count = [m.params.get("count_in_net", 1) for m in members]
        ours = sum(c * m.median_ms for c, m in zip(count, members))
        theirs = None
        if all(m.torch_median_ms for m in members):
            theirs = sum(c * m.torch_median_ms for c, m in zip(count, members))
        totals.append({"net": net, "direction": direction, "layers": len(members),
                       "convolutions": sum(count), "ms": ours, "torch_ms": theirs,
                       "speedup_vs_torch": theirs / ours if theirs else None,
                       "rankable": (all(m.rankable is not False for m in members)
                                    if theirs else None)})
    return totals


def format_totals(totals):
    """Text table of ``network_totals``."""
    if not totals:
        return ""
    lines = ["== conv totals per network (measured layers, each median x its count in the net)",
             "net           direction   layers  convs  ms         torch ms   x torch"]
    for t in totals:
        lines.append(f"{t['net']:<13} {t['direction']:<11} {t['layers']:<7} {t['convolutions']:<6} "
                     f"{t['ms']:<10.4g} {_num(t['torch_ms'], '<10.4g')} "
                     f"{_ratio(t['speedup_vs_torch'], t.get('rankable'))}")
    return "\n".join(lines)
