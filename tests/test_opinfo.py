"""PyTorch's own operator samples (OpInfo op_db, float32) through dlprim_py.functional, forward
and input gradients, against torch in float64 (tests/opinfo_support.py says how).

One test per op_db entry that maps to a dlprim_py.functional function (a function added there is
run here without a change). Each sample must come out right, or be refused with the error that
tests/opinfo_limitations.py lists for it, or be wrong as its KNOWN_WRONG lists: a new refusal,
a wrong number, or a listed entry that no longer holds fails.

DLPRIM_OPINFO_SAMPLES sets how many samples of each op run: unset, the first few small ones
(opinfo_support.DEFAULT_SAMPLES, the CI budget); a number N, the first N small ones; "all",
every sample (as ``python tests/opinfo_table.py`` runs them).
"""
import os

import pytest

pytest.importorskip("torch")
pytest.importorskip("expecttest")      # what torch's sample code imports

import opinfo_support as support  # noqa: E402
from opinfo_limitations import KNOWN_WRONG, REFUSALS  # noqa: E402

LIMIT = support.sample_limit(os.environ.get("DLPRIM_OPINFO_SAMPLES"))
OPS = support.mapped_ops()


@pytest.mark.parametrize("op", OPS, ids=[op.key for op in OPS])
def test_opinfo_samples(ctx, op):
    results = support.run_op(ctx, op, LIMIT, REFUSALS, KNOWN_WRONG)
    failures = [failure for _, _, failure in results if failure]
    assert not failures, (f"{op.key}: {len(failures)} of {len(results)} samples not as "
                          f"tests/opinfo_limitations.py says:\n  " + "\n  ".join(failures))


def test_limitations_name_existing_samples():
    """Every entry of the tables names a mapped op, a sample it has, and a reason."""
    ops = {op.key: op for op in OPS}
    problems = []
    for table_name, table in (("REFUSALS", REFUSALS), ("KNOWN_WRONG", KNOWN_WRONG)):
        for key, entries in table.items():
            if key not in ops:
                problems.append(f"{table_name}[{key!r}]: no op_db entry of that name maps to "
                                f"dlprim_py.functional")
                continue
            descriptions = {s.description for s in support.samples(ops[key], None)}
            if table_name == "REFUSALS":
                listed = [(d, reason) for _, reason, ds in entries for d in ds]
            else:
                listed = list(entries.items())
            for description, reason in listed:
                if description != support.ALL_SAMPLES and description not in descriptions:
                    problems.append(f"{table_name}[{key!r}]: no sample {description!r}")
                if not reason.strip():
                    problems.append(f"{table_name}[{key!r}]: {description!r} has no reason")
    assert not problems, "\n".join(problems)


def test_sample_limit_reads_the_variable():
    assert support.sample_limit(None) == support.DEFAULT_SAMPLES
    assert support.sample_limit("all") is None
    assert support.sample_limit(" 7 ") == 7
    for bad in ("0", "-1", "some"):
        with pytest.raises(ValueError, match="DLPRIM_OPINFO_SAMPLES"):
            support.sample_limit(bad)


# ---- the harness itself: it must see a wrong forward, a missing gradient and a refusal --------

def _relu_op():
    return next(op for op in OPS if op.key == "nn.functional.relu")


def _first_outcome(ctx, op):
    """The outcome of the op's largest sample (its first ones are all negative: relu's gradient
    there is 0 with or without a backward)."""
    sample = max(support.samples(op, None), key=lambda s: s.elements)
    return sample, support.run_sample(ctx, op, sample)


def test_harness_sees_a_wrong_forward(ctx, monkeypatch):
    import dlprim_py as dp
    monkeypatch.setattr(dp.functional, "relu", lambda x, inplace=False: dp.functional.tanh(x))
    sample, outcome = _first_outcome(ctx, _relu_op())
    assert outcome.kind == "wrong" and outcome.message.startswith("output:")
    assert support.judge(outcome, "nn.functional.relu", sample.description, {}, {})


def test_harness_sees_a_missing_gradient(ctx, monkeypatch):
    import dlprim_py as dp
    relu = dp.functional.relu

    def relu_without_gradient(x, inplace=False):
        with dp.no_grad():
            return relu(x)
    monkeypatch.setattr(dp.functional, "relu", relu_without_gradient)
    _, outcome = _first_outcome(ctx, _relu_op())
    assert outcome.kind == "wrong" and outcome.message.startswith("gradient of tensor 0")


def test_harness_sees_a_wrong_gradient(ctx, monkeypatch):
    import dlprim_py as dp
    F = dp.functional
    relu = F.relu
    # relu(x) + x - x: the forward exactly relu's, the gradient one more than relu's.
    monkeypatch.setattr(F, "relu", lambda x, inplace=False: F.sub(F.add(relu(x), x), x.detach()))
    _, outcome = _first_outcome(ctx, _relu_op())
    assert outcome.kind == "wrong" and outcome.message.startswith("gradient of tensor 0")


def test_harness_judges_refusals_against_the_table(ctx, monkeypatch):
    import dlprim_py as dp

    def refuse(x, inplace=False):
        raise dp.UnsupportedError("relu: not today")
    op = _relu_op()
    right_sample, right = _first_outcome(ctx, op)
    monkeypatch.setattr(dp.functional, "relu", refuse)
    sample, outcome = _first_outcome(ctx, op)
    assert (outcome.kind, outcome.error, outcome.stage) == ("refused", "UnsupportedError", "forward")
    key = op.key
    assert "new refusal" in support.judge(outcome, key, sample.description, {}, {})
    listed = {key: [("UnsupportedError", "not today", [sample.description])]}
    assert support.judge(outcome, key, sample.description, listed, {}) is None
    anywhere = {key: [("DlprimError", "not today", [support.ALL_SAMPLES])]}
    assert support.judge(outcome, key, sample.description, anywhere, {}) is None
    other_class = {key: [("ShapeError", "not today", [sample.description])]}
    assert "raised UnsupportedError" in support.judge(outcome, key, sample.description,
                                                      other_class, {})
    # A listed sample that is right again fails, so the table cannot rot.
    assert "now right" in support.judge(right, key, right_sample.description, listed, {})
    wrong_listed = {key: {right_sample.description: "a reason"}}
    assert "KNOWN_WRONG" in support.judge(right, key, right_sample.description, {}, wrong_listed)
