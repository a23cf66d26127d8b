"""dlprim-driver: MIOpenDriver's flag syntax, a tiny verified run of every command, the
DLPRIM_LOG_CMD round trip, and a wrong result reported as a failed verification."""
import numpy as np
import pytest

import dlprim_py as dp
from dlprim_py import driver
from dlprim_py.driver import UsageError, main, parse_flags, parse_plan, split_logged

ISSUE_EXAMPLE = ("conv -n 64 -c 64 -H 56 -W 56 -k 64 -y 3 -x 3 -p 1 -q 1 -u 1 -v 1 -l 1 -j 1 "
                 "-g 1 -F 1 -t 1 -V 1").split()


def test_parse_flags_of_the_issue_example():
    flags = parse_flags("conv", ISSUE_EXAMPLE[1:])
    assert (flags["batchsize"], flags["in_channels"], flags["in_h"], flags["in_w"]) == (64, 64, 56, 56)
    assert (flags["out_channels"], flags["fil_h"], flags["fil_w"]) == (64, 3, 3)
    assert (flags["pad_h"], flags["pad_w"], flags["conv_stride_h"], flags["conv_stride_w"]) == (1, 1, 1, 1)
    assert (flags["dilation_h"], flags["dilation_w"], flags["group_count"]) == (1, 1, 1)
    assert (flags["forw"], flags["time"], flags["verify"]) == (1, 1, 1)
    assert flags["iter"] == 10 and flags["solution"] == "-1" and flags["search"] == 0
    shape = driver._conv_shape(flags)
    assert shape.output_shape == (64, 64, 56, 56)


def test_parse_flags_long_names_and_defaults():
    flags = parse_flags("gemm", ["--a_h", "7", "--b_w=9", "-k", "5", "--transA", "1", "-A", "0.5"])
    assert (flags["a_h"], flags["b_w"], flags["a_w"]) == (7, 9, 5)
    assert flags["transA"] == 1 and flags["alpha"] == 0.5 and flags["beta"] == 0.0
    assert flags["_given"] == ["a_h", "b_w", "a_w", "transA", "alpha"]
    bnorm = parse_flags("bnorm", [])
    assert (bnorm["batchsize"], bnorm["mode"], bnorm["forw"], bnorm["back"]) == (32, 0, 0, 0)


@pytest.mark.parametrize("command, argv, message", [
    ("conv", ["-Q", "1"], "unknown flag '-Q'"),
    ("conv", ["-n"], "needs a value"),
    ("conv", ["-n", "two"], "takes int"),
    ("conv", ["64"], "expected a flag"),
    ("pool", ["--nope", "1"], "unknown flag"),
])
def test_parse_flags_rejects_bad_command_lines(command, argv, message):
    with pytest.raises(UsageError, match=message):
        parse_flags(command, argv)


def test_fixed_flags_accept_only_their_default():
    assert parse_flags("conv", ["-m", "conv", "-_", "2"])["mode"] == "conv"
    with pytest.raises(dp.UnsupportedError, match="trans is not supported"):
        parse_flags("conv", ["-m", "trans"])
    with pytest.raises(dp.UnsupportedError, match="beta"):
        parse_flags("softmax", ["-B", "1"])


def test_main_usage_and_unknown_command(capsys):
    assert main([]) == 2
    assert "commands: conv, pool, bnorm, activ, softmax, gemm, CBAInfer" in capsys.readouterr().out
    assert main(["convolution"]) == 2
    assert "unknown command" in capsys.readouterr().err
    assert main(["conv", "-h"]) == 0
    assert "-n, --batchsize" in capsys.readouterr().out
    assert main(["conv", "-Q", "1"]) == 2
    assert main(["conv", "-m", "trans"]) == 1


def _run(capsys, argv):
    rc = main(argv)
    out = capsys.readouterr().out
    return rc, out


@pytest.mark.parametrize("argv, labels", [
    ("conv -n 2 -c 4 -H 7 -W 7 -k 6 -y 3 -x 3 -p 1 -q 1 -u 2 -v 2 -F 0 -t 1 -i 2",
     ["Forward Conv", "Backward Data Conv", "Backward Weights Conv"]),
    ("conv -n 1 -c 6 -H 6 -W 6 -k 6 -y 3 -x 3 -p 1 -q 1 -g 6 -F 1 -S depthwise -b 1 -I NHWC",
     ["Forward Conv"]),
    ("pool -n 2 -c 3 -H 9 -W 9 -y 3 -x 3 -p 1 -q 1 -u 2 -v 2 -m max -t 1 -i 2",
     ["Forward Pooling", "Backward Pooling"]),
    ("pool -W 1x2x6x6,NCHW -y 2 -x 2 -u 2 -v 2 -m avg -F 1", ["Forward Pooling"]),
    ("bnorm -n 3 -c 4 -H 5 -W 5 -m 1 -F 1 -b 1 -s 1 -r 1 -t 1 -i 2",
     ["Forward Train Batch Norm", "Backward Batch Norm"]),
    ("bnorm -n 3 -c 2 -H 3 -W 3 -m 0 -F 2", ["Forward Inference Batch Norm"]),
    ("activ -n 2 -c 3 -H 4 -W 4 -m 8 -A 0.2 -t 1 -i 2", ["Forward Activation", "Backward Activation"]),
    ("activ -n 1 -c 2 -H 3 -W 3 -m silu -F 1", ["Forward Activation"]),
    ("softmax -n 3 -c 10 -H 2 -W 2 -a 2 -m 0 -t 1 -i 2", ["Forward Softmax", "Backward Softmax"]),
    ("softmax -n 3 -c 10 -H 2 -W 2 -a 1 -m 1 -F 1", ["Forward Softmax"]),
    ("gemm -m 20 -n 12 -k 9 -u 1 -A 2 -B 0.5 -t 1 -i 2", ["Gemm"]),
    ("gemm -m 20 -n 12 -k 9 -C 1 -b 2 -S small", ["Gemm"]),
    ("gemm -m 20 -n 12 -k 9 --bias m --activation gelu -A 0.5 -B 2", ["Gemm"]),
    ("pool -n 1 -c 2 -H 9 -W 9 -y 3 -x 3 -u 2 -v 2 --dilation_h 2 --dilation_w 2 --ceil_mode 1",
     ["Forward Pooling", "Backward Pooling"]),
    ("pool -n 1 -c 2 -H 9 -W 7 --adaptive 4x3 -m avg -F 1", ["Forward Pooling"]),
    ("bnorm -n 3 -c 4 -H 5 -W 5 -m 1 -F 2 --activation relu", ["Forward Inference Batch Norm"]),
    ("CBAInfer -n 1 -c 4 -H 6 -W 6 -k 8 -y 3 -x 3 -p 1 -q 1 -F 0 -m 3 -t 1 -i 2", ["Fused cbna"]),
    ("CBAInfer -n 1 -c 4 -H 6 -W 6 -F 2 -m 7", ["Fused na"]),
    ("CBAInfer --plan batchnorm_forward(spatial)_->_activation(SILU) -n 2 -c 3 -H 4 -W 4",
     ["Fused BN training forward"]),
    ("CBAInfer --plan batchnorm_backward(spatial)_->_activation_backward(RELU) -n 2 -c 3 -H 4 -W 4",
     ["Fused BN training backward"]),
])
def test_every_command_runs_verified(capsys, monkeypatch, argv, labels):
    # "-s 1" sets DLPRIM_FIND_MODE=find in this process, as the CLI does: put it back after.
    monkeypatch.setenv("DLPRIM_FIND_MODE", "immediate")
    rc, out = _run(capsys, [a.replace("_->_", " -> ") for a in argv.split()])
    assert rc == 0, out
    for label in labels:
        assert f"{label}: verifies OK" in out, out
        assert f"{label}: algorithm " in out
    if " -t 1" in argv:
        assert out.count("kernel time") == len(labels)


class _Clock:
    """The harness's time module, advanced by the fake timer alone."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        return self.now

    def time(self):
        return self.now


def _counted_timer(monkeypatch, seconds_per_run=0.0):
    """Replace the harness's timer with one that counts the runs it times (each of
    ``seconds_per_run`` on a fake clock, 1 ms as measured); returns the list of runs."""
    from dlprim_py.bench import harness
    from dlprim_py.timing import Timing
    clock, runs = _Clock(), []
    monkeypatch.setattr(harness, "time", clock)

    def fake(ctx, run, warmup=3, repeat=20, **kwargs):
        assert (warmup, repeat) == (0, 1)
        run()
        runs.append(1)
        clock.now += seconds_per_run
        return Timing([1e-3])

    monkeypatch.setattr(harness, "time_enqueued", fake)
    return runs


def test_time_runs_exactly_the_iterations_asked_for(capsys, monkeypatch):
    """-i 7 --warmup 2: two untimed runs, then exactly seven timed ones (a slow case, 100 s a
    run on the fake clock, is not cut short), and the line says so."""
    runs = _counted_timer(monkeypatch, seconds_per_run=100.0)
    rc, out = _run(capsys, "gemm -m 8 -n 8 -k 8 -V 0 -t 1 -i 7 --warmup 2".split())
    assert rc == 0, out
    assert len(runs) == 2 + 7
    assert "median of 7 after 2 warm-up runs" in out


def test_max_time_caps_the_iterations_and_says_why(capsys, monkeypatch):
    """--max_time 250 with 100 s a run: the timed runs starting before 250 s have passed
    (0, 100, 200 s) run, the others do not, and the line says why there are 3 and not 10."""
    runs = _counted_timer(monkeypatch, seconds_per_run=100.0)
    rc, out = _run(capsys, "gemm -m 8 -n 8 -k 8 -V 0 -t 1 -i 10 --max_time 250".split())
    assert rc == 0, out
    assert len(runs) == 3 + 3
    assert "median of 3 of -i 10: capped at 250 s by --max_time" in out


@pytest.mark.parametrize("argv", ["gemm -i 0 -t 1", "gemm --warmup -1", "gemm --max_time -2"])
def test_time_flags_must_make_sense(capsys, argv):
    assert main(argv.split()) == 2
    assert "-i must be >= 1" in capsys.readouterr().err


def test_find_mode_flag_sets_find_mode(capsys, monkeypatch):
    # Set (not deleted) first, so that monkeypatch puts back what was there before the driver
    # set it: a delete of an absent variable records nothing, and a later delete would record
    # the driver's "find" and restore it for the tests after this one.
    monkeypatch.setenv("DLPRIM_FIND_MODE", "immediate")
    rc, out = _run(capsys, "conv -n 1 -c 3 -H 5 -W 5 -k 4 -y 3 -x 3 -F 1 -s 1".split())
    assert rc == 0 and "verifies OK" in out
    import os
    assert os.environ["DLPRIM_FIND_MODE"] == "find"
    assert dp.config.find_mode() == "find"
    monkeypatch.setenv("DLPRIM_FIND_MODE", "immediate")
    dp.config.reload()


def test_a_wrong_result_fails_verification(capsys, monkeypatch):
    from dlprim_py.ops import gemm
    monkeypatch.setattr(gemm.GemmPlan, "enqueue", lambda self, wait_for=None: None)
    rc, out = _run(capsys, "gemm -m 8 -n 8 -k 8".split())
    assert rc == 1 and "Gemm: verification FAILED" in out


def test_unknown_algorithm_is_a_library_error(capsys):
    assert main("conv -n 1 -c 3 -H 5 -W 5 -k 4 -F 1 -S winograd_xl".split()) == 1
    assert "does not apply" in capsys.readouterr().err


def test_parse_plan_reads_a_logged_description():
    ops = parse_plan("conv(weight (8, 4, 3, 3), padding (1, 1), stride (1, 1), dilation (1, 1), "
                     "groups 1) -> bias((1, 8, 1, 1)) -> activation(RELU)")
    assert [name for name, _ in ops] == ["conv", "bias", "activation"]
    with pytest.raises(UsageError):
        parse_plan("conv weight")


def test_logged_commands_reproduce_the_call(ctx, rng, capsys, monkeypatch):
    """DLPRIM_LOG_CMD=1: each operator call prints a dlprim-driver line that runs on its own."""
    from dlprim_py import fusion
    # A line with -s 1 sets find mode in this process: monkeypatch puts the variable back.
    monkeypatch.setenv("DLPRIM_FIND_MODE", "immediate")
    monkeypatch.setenv("DLPRIM_LOG_CMD", "1")
    dp.config.reload()
    x = dp.Tensor.from_numpy(ctx, rng.uniform(-1, 1, (1, 4, 6, 6)).astype(np.float32))
    w = dp.Tensor.from_numpy(ctx, rng.uniform(-1, 1, (8, 4, 3, 3)).astype(np.float32))
    b = dp.Tensor.from_numpy(ctx, rng.uniform(-1, 1, (8,)).astype(np.float32))
    dp.functional.conv2d(x, w, padding=1, stride=2)
    fusion.conv_bias_activation(x, w, b, padding=1)
    plan = fusion.FusionPlan(ctx, fusion.VERTICAL, x.desc)
    conv_op = plan.create_op_conv_forward(dp.ConvolutionDesc(1, 1, 1, 1), w.desc)
    bias_op = plan.create_op_bias_forward(dp.TensorDesc((1, 8, 1, 1)))
    act_op = plan.create_op_activation_forward(fusion.ACTIVATION_RELU)
    plan.compile()
    args = fusion.OperatorArgs()
    args.set_conv_forward(conv_op, 1, 0, w)
    args.set_bias_forward(bias_op, 1, 0, b.reshape(1, 8, 1, 1))
    args.set_activation_forward(act_op, 1, 0, 0, 0, 0)
    plan.execute(plan.input_desc, x, plan.output_desc, dp.Tensor.empty(ctx, (1, 8, 6, 6)), args)
    F = dp.functional
    stats = [dp.Tensor.from_numpy(ctx, v) for v in (np.zeros(4, np.float32), np.ones(4, np.float32))]
    xg = dp.Tensor.from_numpy(ctx, rng.uniform(-1, 1, (2, 4, 6, 6)).astype(np.float32),
                              requires_grad=True)
    y = F.max_pool2d(F.batch_norm(xg, *stats, training=True), 3, 2, 1)
    y.backward(dp.Tensor.from_numpy(ctx, rng.uniform(-1, 1, y.shape).astype(np.float32)))
    F.adaptive_avg_pool2d(xg.detach(), (2, 3))
    z = F.log_softmax(F.leaky_relu(xg, 0.2), dim=1)
    z.backward(dp.Tensor.from_numpy(ctx, rng.uniform(-1, 1, z.shape).astype(np.float32)))
    from dlprim_py.ops.gemm import gemm
    gemm(x.reshape(4, 36), w.reshape(8, 36), trans_b=True, bias=b, activation="relu")
    logged = [line for line in capsys.readouterr().err.splitlines()
              if line.startswith("DLPRIM_LOG_CMD: ")]
    commands = {split_logged(line)[0] for line in logged}
    assert commands == {"conv", "CBAInfer", "pool", "bnorm", "activ", "softmax", "gemm"}
    monkeypatch.delenv("DLPRIM_LOG_CMD")
    dp.config.reload()
    for line in dict.fromkeys(logged):
        # Every line times the call (-t 1); one timed run here, to keep the test short.
        argv = split_logged(line)
        assert argv[-2:] == ["-t", "1"], line
        rc, out = _run(capsys, argv + ["-i", "1", "--warmup", "0"])
        assert rc == 0, f"{line}\n{out}"
        assert "verifies OK" in out and "kernel time" in out, out
