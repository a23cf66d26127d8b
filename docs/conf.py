"""Sphinx configuration of the dlprim_py reference (``python -m sphinx -W --keep-going docs
docs/_build/html``; CI runs it as ``bash .ci/docs``).

Besides autodoc's own warnings, these checks keep the reference from falling behind the code,
each a warning (and so, under ``-W``, a failed build):

* every public name (``dlprim_py.__all__``, ``dlprim_py.fusion.__all__``, the functions of
  ``dlprim_py.functional``) has an entry;
* every ``DLPRIM_*`` variable the package or its test suite reads, and
  ``DLPRIM_<FAMILY>_ALGO`` for every registered solver family, is named on environment.rst,
  and that page names no other;
* no page has a block quote: in a docstring one is an example that lost its ``::``.

Two directives produce text from the code at build time: ``cli-help`` (a program's ``--help``
output) and ``solver-families`` (the registered families and their solvers)."""
import contextlib
import importlib
import io
import os
import re
import sys
from pathlib import Path

from docutils import nodes
from docutils.parsers.rst import directives
from docutils.statemachine import StringList
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))            # document this checkout, not an installed copy
os.environ["COLUMNS"] = "100"            # argparse's help width, the same on every machine

import dlprim_py  # noqa: E402

project = "dlprim_py"
author = "dlprim_py contributors"
release = dlprim_py.__version__
version = release

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "myst_parser",
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build"]
root_doc = "index"

napoleon_google_docstring = False
napoleon_numpy_docstring = True
napoleon_use_rtype = False
autodoc_member_order = "bysource"
autodoc_default_options = {"members": True}
autodoc_typehints = "none"
autodoc_preserve_defaults = True     # np.float32, not <class 'numpy.float32'>
add_module_names = False
myst_heading_anchors = 3

html_theme = "alabaster"
html_title = f"dlprim_py {release}"
html_static_path = []

logger = logging.getLogger("dlprim_py.docs")


class CliHelp(SphinxDirective):
    """``.. cli-help:: module:function ARGS...``: the text ``function([ARGS...])`` prints (an
    argparse-style ``main(argv)``), as a literal block. With ``:for-each: module:NAME``, one
    block per key of that mapping, ``{}`` in ARGS standing for the key."""
    required_arguments = 1
    optional_arguments = 10
    option_spec = {"for-each": directives.unchanged_required}
    has_content = False

    def run(self):
        target, *args = self.arguments
        if "for-each" not in self.options:
            return [self.block(target, args)]
        module, name = self.options["for-each"].split(":")
        return [self.block(target, [a.replace("{}", key) for a in args])
                for key in getattr(importlib.import_module(module), name)]

    def block(self, target, args):
        module, function = target.split(":")
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            try:
                getattr(importlib.import_module(module), function)(list(args))
            except SystemExit:
                pass
        text = out.getvalue().rstrip()
        if not text:
            logger.warning(f"cli-help: {target} {' '.join(args)} printed nothing",
                           location=self.get_location())
        block = nodes.literal_block(text, text)
        block["language"] = "text"
        return block


class SolverFamilies(SphinxDirective):
    """``.. solver-families::``: a table of the registered solver families, their
    ``DLPRIM_<FAMILY>_ALGO`` switch and their solvers in tie-break order."""
    has_content = False

    def run(self):
        from dlprim_py import solver
        rows = [".. list-table::", "   :header-rows: 1", "   :widths: 30 20 42 8", "",
                "   * - variable", "     - chooses", "     - solvers", "     - find"]
        for name, family in solver.FAMILIES.items():
            rows += [f"   * - ``DLPRIM_{name.upper()}_ALGO``", f"     - {family.title}",
                     "     - " + ", ".join(f"``{s}``" for s in family.solvers),
                     "     - " + ("yes" if family.measure is not None else "")]
        container = nodes.container()
        self.state.nested_parse(StringList(rows, source="solver-families"), 0, container)
        return container.children


def check_block_quotes(app, doctree):
    """Warn about every block quote: in a docstring it is an indented block after a paragraph
    that does not end with "::", whose lines reST runs together, where a command or code
    example was meant to stay as written (end the paragraph with "::", or put "::" alone
    before the block). These pages use none on purpose."""
    for quote in doctree.findall(nodes.block_quote):
        text = quote.astext().split("\n")[0][:60]
        logger.warning(f"indented block rendered as a block quote ({text!r}...): add '::' "
                       f"before it for a literal block", location=quote)


def public_names():
    """The full names the reference must document."""
    import dlprim_py.functional as functional
    import dlprim_py.fusion as fusion
    names = {f"dlprim_py.{n}" for n in dlprim_py.__all__ if n != "__version__"}
    names |= {f"dlprim_py.fusion.{n}" for n in fusion.__all__}
    names |= {f"dlprim_py.functional.{n}" for n, v in vars(functional).items()
              if callable(v) and not n.startswith("_")
              and getattr(v, "__module__", "").startswith("dlprim_py")}
    return names


def environment_variables():
    """The DLPRIM_* variables the package and its tests read: named in their source, and one
    _ALGO switch per solver family."""
    from dlprim_py import solver
    found = set()
    for path in [*(ROOT / "dlprim_py").rglob("*.py"), *(ROOT / "tests").glob("*.py")]:
        found |= set(re.findall(r"\bDLPRIM_[A-Z][A-Z0-9_]*[A-Z0-9]\b", path.read_text()))
    found |= {f"DLPRIM_{family.upper()}_ALGO" for family in solver.FAMILIES}
    return found


def check_consistency(app, env):
    objects = env.get_domain("py").objects
    for name in sorted(public_names() - set(objects)):
        logger.warning(f"public name {name} is not in the API reference")
    page = Path(app.srcdir) / "environment.rst"
    named = set(re.findall(r"\bDLPRIM_[A-Z][A-Z0-9_]*[A-Z0-9]\b", page.read_text()))
    read = environment_variables()
    for name in sorted(read - named):
        logger.warning(f"{name} is read by the package but not described", location="environment")
    for name in sorted(named - read):
        logger.warning(f"{name} is described but the package does not read it", location="environment")


def setup(app):
    app.add_directive("cli-help", CliHelp)
    app.add_directive("solver-families", SolverFamilies)
    app.connect("env-check-consistency", check_consistency)
    app.connect("doctree-read", check_block_quotes)
    return {"parallel_read_safe": True}
