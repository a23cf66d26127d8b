"""``python -m dlprim_py.bench``: the same as ``dlprim-bench``."""
import sys

from . import main

if __name__ == "__main__":
    sys.exit(main())
