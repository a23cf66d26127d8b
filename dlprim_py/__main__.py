"""``python -m dlprim_py info``: list the OpenCL devices and the facts of the default one."""
import argparse
import sys


def info():
    from . import __version__
    from .context import Context, devices
    from .errors import DlprimError

    print(f"dlprim_py {__version__}")
    found = devices()
    if not found:
        print("no OpenCL devices found (pip install pocl-binary-distribution gives a CPU device)")
        return 1
    for index, platform, name, kind in found:
        print(f"  {index}  {name}  [{kind}]  on {platform}")
    try:
        ctx = Context()
    except DlprimError as e:
        print(f"default device: {e}")
        return 1
    d = ctx.info
    print(f"default device: {d.name} (vendor {d.vendor}, {d.version}, driver {d.driver_version})")
    print(f"  compute units {d.compute_units}, max work-group {d.max_work_group_size}, "
          f"local memory {d.local_mem_size // 1024} KiB, global memory {d.global_mem_size >> 20} MiB")
    print(f"  fp16 {d.has_fp16}, fp64 {d.has_fp64}, subgroups {d.has_subgroups}, "
          f"SIMD width {d.simd_width}")
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m dlprim_py")
    parser.add_argument("command", nargs="?", default="info", choices=["info"])
    parser.parse_args(argv)
    return info()


if __name__ == "__main__":
    sys.exit(main())
