"""The solver layer: one way for every operator family to choose how it computes a problem.

After MIOpen's solvers. A *family* ("conv", "gemm", "reduce", ...) is a list of *solvers*, each
one way of computing the family's problems, and a *problem* is a frozen value that says
everything a choice depends on. A solver answers four questions:

* ``name``: stable; it is the value of ``DLPRIM_<FAMILY>_ALGO``, the find-db record and the
  name tuning rules use;
* ``applies(ctx, problem)``: whether it can compute the problem on this device;
* ``workspace_size(ctx, problem)``: bytes of scratch memory it needs (0 for none);
* ``prepare(ctx, problem)`` builds what it needs, once; running enqueues prepared kernels with
  bound arguments only (each family's run takes its own operands).

``select(ctx, family, problem)`` picks one, in this order:

1. forced: ``DLPRIM_<FAMILY>_ALGO=<solver>`` (an error when it does not apply, never a
   silent fallback);
2. found: with ``DLPRIM_FIND_MODE=find`` and a family that can time its solvers, the find-db's
   record for the problem, else a measurement of every applicable solver, stored there;
3. tuned: the first rule of the device's tuning database (``tuning_db/<family>.json``; device
   -> architecture -> vendor -> default, see ``dlprim_py.tuning``) that holds for the problem's
   features and names an applicable solver (``{"when": {...}, "params": {"solver": name}}``)
   with parameters that run on the device (``Family.usable``);
4. ranked: the applicable solver of lowest rank, ranks coming from the same database's
   ``"ranks"`` tables (first condition that holds), ties and unranked solvers going by the
   family's order.

The choice is memoized per context under the problem's key and the switches, so a repeated
call costs one dictionary lookup.

A problem provides ``key()`` (a canonical string: the find-db key, and part of plan keys) and
``features()`` (a dict of numbers and strings that tuning conditions are written in).
"""
from . import config, finddb, tuning
from .errors import UnsupportedError

FAMILIES = {}


class Solver:
    """One way of computing a family's problems. Subclasses set ``name`` and override
    ``applies``, ``workspace_size`` and ``prepare``; their family says how a prepared solver
    runs."""
    name = "?"

    def applies(self, ctx, problem):
        return True

    def workspace_size(self, ctx, problem):
        return 0

    def prepare(self, ctx, problem):
        raise NotImplementedError

    def __repr__(self):
        return f"<solver {self.name}>"


class Family:
    """An operator family's solvers, in tie-break order.

    ``measure(ctx, problem, names)``, where given, times the named solvers on scratch data and
    returns ``{name: seconds}``: such a family takes part in find mode. ``applies(solver, ctx,
    problem)`` may be overridden by a family whose solvers take the problem in pieces.
    """

    def __init__(self, name, solvers, measure=None, title=None):
        self.name = name
        # What messages call one solver ("convolution algorithm").
        self.title = title or f"{name} solver"
        self.solvers = {}
        for solver in solvers:
            if solver.name in self.solvers:
                raise ValueError(f"{name}: two solvers named {solver.name!r}")
            self.solvers[solver.name] = solver
        self.measure = measure
        self.order = {n: i for i, n in enumerate(self.solvers)}

    def solver(self, name):
        try:
            return self.solvers[name]
        except KeyError:
            raise UnsupportedError(f"unknown {self.title} {name!r}; known: "
                                   f"{', '.join(self.solvers)}") from None

    def applies(self, solver, ctx, problem):
        return solver.applies(ctx, problem)

    def usable(self, ctx, problem, params):
        """Whether a tuned rule's ``params`` run here (a family whose rules carry parameters a
        device may not run overrides it; such a rule is passed over)."""
        return True

    def applicable(self, ctx, problem):
        """Names of the solvers that apply, best ranked first."""
        names = [n for n, s in self.solvers.items() if self.applies(s, ctx, problem)]
        features = _features(ctx, problem)
        return sorted(names, key=lambda n: (rank(ctx, self.name, n, features), self.order[n]))

    def __repr__(self):
        return f"<family {self.name}: {', '.join(self.solvers)}>"


def register(family):
    """Add ``family`` to the registry (a family registers once, when its module loads)."""
    FAMILIES[family.name] = family
    return family


def family(name):
    try:
        return FAMILIES[name]
    except KeyError:
        raise UnsupportedError(f"unknown operator family {name!r}; known: "
                               f"{', '.join(sorted(FAMILIES))}") from None


def _features(ctx, problem):
    """The problem's features plus the device's (``gpu``: 1 on GPUs)."""
    features = dict(problem.features())
    features.setdefault("gpu", int(ctx.info.is_gpu))
    return features


def rank(ctx, family_name, solver_name, features):
    """The solver's rank for a problem of these features (lower is preferred): the first
    condition that holds in the first database entry that ranks this solver; unranked
    solvers come after every ranked one."""
    found = tuning.rank(ctx.info, family_name, solver_name, features)
    return float("inf") if found is None else found


def select(ctx, family_name, problem, forced=None):
    """The solver for ``problem``: forced, else found, else tuned, else ranked (module
    docstring). ``forced``: a solver name the caller asks for (an operator's keyword), ahead of
    ``DLPRIM_<FAMILY>_ALGO``. Memoized per context (until a tuning database is forgotten)."""
    switches = config.switches()
    forced = forced or switches.forced.get(family_name)
    key = ("solver.select", family_name, problem, forced, switches.find_mode, tuning.generation)
    chosen = ctx.plans.get(key)
    if chosen is None:
        chosen = ctx.plans.put(key, _select(ctx, family(family_name), problem, forced,
                                            switches.find_mode))
    return chosen


def _select(ctx, fam, problem, forced, find_mode):
    if forced:
        solver = fam.solver(forced)
        if not fam.applies(solver, ctx, problem):
            raise UnsupportedError(f"DLPRIM_{fam.name.upper()}_ALGO={forced} does not apply to "
                                   f"{problem.key()}; applicable: "
                                   f"{', '.join(fam.applicable(ctx, problem))}")
        return solver
    if find_mode == "find" and fam.measure is not None:
        return fam.solvers[find(ctx, fam, problem)]
    return immediate(ctx, fam, problem)


def immediate(ctx, fam, problem):
    """The choice without running anything: the first tuned rule that names an applicable
    solver, else the applicable solver of lowest rank."""
    features = _features(ctx, problem)
    applicable = [n for n, s in fam.solvers.items() if fam.applies(s, ctx, problem)]
    if not applicable:
        raise UnsupportedError(f"no {fam.name} solver applies to {problem.key()}")
    tuned = tuning.first_params(ctx.info, fam.name, features,
                                lambda params: params.get("solver") in applicable
                                and fam.usable(ctx, problem, params))
    if tuned is not None:
        return fam.solvers[tuned["solver"]]
    best = min(applicable, key=lambda n: (rank(ctx, fam.name, n, features), fam.order[n]))
    return fam.solvers[best]


def tunables(ctx, family_name, problem, solver_name):
    """The tuning values of solver ``solver_name`` for ``problem``: the params of every rule of
    the family's tuning database that holds for the problem and names the solver, the first
    rule giving a key winning (``tuning.merged_params``), without the "solver" key. Read when a
    plan is built."""
    params = tuning.merged_params(ctx.info, family_name, _features(ctx, problem),
                                  lambda params: params.get("solver") == solver_name)
    params.pop("solver", None)
    return params


def device_params(ctx, family_name):
    """Tuning values that depend on the device alone: the params of every rule of the family's
    database that holds for it (features ``gpu`` and ``cpu``; the first rule giving a key
    wins), read once per context and database generation."""
    key = ("solver.device_params", family_name, tuning.generation)
    found = ctx.plans.get(key)
    if found is None:
        found = ctx.plans.put(key, tuning.merged_params(
            ctx.info, family_name, {"gpu": int(ctx.info.is_gpu), "cpu": int(ctx.info.is_cpu)}))
    return found


def find(ctx, fam, problem):
    """The find-mode winner's name: the find-db's record when it names a solver that applies,
    else the family's measurement of the applicable solvers, stored in the find-db."""
    key = problem.key()
    db = finddb.for_context(ctx)
    name = db.lookup(key)
    if name in fam.solvers and fam.applies(fam.solvers[name], ctx, problem):
        return name
    names = fam.applicable(ctx, problem)
    # Measured outside any open recording: find runs where a call first needs the choice,
    # which may be inside the recording of that call's plan, and the candidates' trial runs
    # must not become launches the plan replays on every call.
    from .launch import unrecorded
    with unrecorded():
        times = fam.measure(ctx, problem, names)
    fastest = min(times.values())
    # Within FIND_TIE of the best, the better-ranked solver wins, so noise does not flip a
    # choice between equals.
    winner = next(n for n in names if n in times and times[n] <= fastest * (1 + FIND_TIE))
    db.store(key, winner, times[winner] * 1e3)
    return winner


FIND_TIE = 0.03
