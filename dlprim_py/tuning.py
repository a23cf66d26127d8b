"""Per-device parameter databases for tuned kernel families.

A family ("gemm", later "conv", ...) has one JSON file shipped in ``dlprim_py/tuning_db/`` and
optionally one written by ``dlprim-tune`` under the cache directory (``DLPRIM_CACHE_DIR``), which
takes precedence. Each file looks like::

    {"family": "gemm", "format": 1,
     "devices": {"<device name>": {"vendor": "nvidia", "driver": "...", "rules": [...]}},
     "architectures": {"nvidia:sm_90": {"rules": [...]}, "amd:gfx90a": {...}, ...},
     "vendors": {"nvidia": {"rules": [...]}, "amd": {...}, ...},
     "default": {"rules": [...], "ranks": {...}}}

Lookup goes device name (exact) -> architecture (``DeviceInfo.architecture``) -> vendor ->
"default", so a new device always gets parameters that work. An entry's ``rules`` is an ordered
list; each rule is either a *condition rule*
``{"when": {"max_mnk": 262144, "min_k": 8}, "params": {...}}`` (every ``min_X``/``max_X`` bound is
inclusive on the feature ``X``; a bare feature name ``X`` asks for equality, or membership when
given a list: ``"direction": "forward"``; ``"extensions": ["cl_intel_subgroups", ...]`` holds on devices
that report every extension named, so that a vendor's entry can give a kernel written in an
extension to the devices that have it and fall through to the next rule elsewhere), or a
*measured rule* ``{"shape": {"m": 4096, "n": 4096,
"k": 4096}, "params": {...}}``. The first condition rule that holds wins; otherwise the measured
rule nearest to the problem (distance in log2 of each shape feature) wins. A feature a family
gives as a bool is a yes/no property (a GEMM's ``trans_a``): a measured shape names it
(``"trans_a": true``) or was measured with it off, and a mismatch counts as much as a factor
of two in one size, so that a rule measured on the same form wins among equal shapes.
Choosing is a few comparisons over a short list: no search and no timing on the hot path.

An entry may also hold ``ranks``, the order in which a family's solvers are preferred when no
rule names one (``dlprim_py.solver``): ``{"<solver>": [{"when": {...}, "rank": 1}, {"rank": 50}]}``,
lower first, the first condition that holds giving the rank (a missing ``when`` always holds).

A family whose parameters changed form registers ``upgrade_params``: rules of the older form
(a user database written before) are read as the current one.

A user database that cannot be read or is not a database of this format (a damaged file) is
reported once with a ``CacheWarning`` and ignored, as the find-db ignores a damaged file: the
shipped rules apply, and the next ``dlprim-tune`` write replaces it.
"""
import json
import math
from importlib import resources
from pathlib import Path

from . import config
from .errors import DlprimError
from .files import atomic_write, warn_once

FORMAT = 1
_loaded = {}
# Bumped by every ``forget``: a choice or plan made from the databases keys on it, so that one
# made before a database changed is not reused after.
generation = 0


def shipped_path(family):
    """The database file that ships with the library for ``family``."""
    return Path(str(resources.files("dlprim_py.tuning_db").joinpath(f"{family}.json")))


def user_path(family):
    """The database file ``dlprim-tune`` writes for ``family`` (under the cache directory)."""
    return Path(config.cache_dir()) / "tuning" / f"{family}.json"


SECTIONS = ("devices", "architectures", "vendors")


def empty_db(family):
    return {"family": family, "format": FORMAT, "devices": {}, "architectures": {}, "vendors": {},
            "default": {"rules": []}}


def read_db(path, family, strict=True):
    """The database at ``path``, or an empty one when the file does not exist.

    A file that cannot be read or is not a database of ``family`` raises DlprimError, or with
    ``strict=False`` (the user's database) warns once and counts as empty.
    """
    path = Path(path)
    if not path.is_file():
        return empty_db(family)
    try:
        try:
            with open(path, encoding="utf-8") as f:
                db = json.load(f)
        except (OSError, ValueError) as e:
            raise ValueError(f"cannot be read: {e}") from e
        _check_db(db, family)
    except ValueError as e:
        if strict:
            raise DlprimError(f"tuning database {path} {e}") from e
        warn_once(path, f"dlprim_py: tuning database {path} {e}; ignored (the shipped rules "
                        f"apply) until dlprim-tune writes it again")
        return empty_db(family)
    for key in SECTIONS:
        db.setdefault(key, {})
    db.setdefault("default", {"rules": []})
    upgrade = _upgrades.get(family)
    if upgrade is not None:
        for entry in [db["default"], *(e for key in SECTIONS for e in db[key].values())]:
            for rule in entry.get("rules", ()):
                rule["params"] = upgrade(rule["params"])
    return db


# family -> function(params) -> params in the family's current form (upgrade_params).
_upgrades = {}


def upgrade_params(family, function):
    """Have ``read_db`` pass every rule's params of ``family`` through ``function``, so that a
    database written in an older form of the family's parameters reads as the current form."""
    _upgrades[family] = function
    forget(family)


def _check_db(db, family):
    """Raise ValueError unless ``db`` has the layout that lookups walk (a damaged file can be
    valid JSON): the rules' conditions are checked where they are used."""
    if not isinstance(db, dict) or db.get("family") != family or db.get("format") != FORMAT:
        found = db if not isinstance(db, dict) else \
            f"family={db.get('family')!r}, format={db.get('format')!r}"
        raise ValueError(f"is not a format-{FORMAT} {family!r} database ({str(found)[:80]})")
    entries = [("default", db.get("default", {"rules": []}))]
    for section in SECTIONS:
        table = db.get(section, {})
        if not isinstance(table, dict):
            raise ValueError(f"is damaged: {section!r} is not an object")
        entries += [(f"{section}/{name}", entry) for name, entry in table.items()]
    for where, entry in entries:
        rules = entry.get("rules", []) if isinstance(entry, dict) else None
        if not isinstance(rules, list) or not all(
                isinstance(rule, dict) and isinstance(rule.get("params"), dict)
                and isinstance(rule.get("when", rule.get("shape")), dict) for rule in rules):
            raise ValueError(f"is damaged: the rules of {where!r} are not a list of "
                             f"{{'when' or 'shape', 'params'}} objects")
        ranks = entry.get("ranks", {})
        if not isinstance(ranks, dict) or not all(
                isinstance(items, list) and all(isinstance(item, dict) and "rank" in item
                                                and isinstance(item.get("when", {}), dict)
                                                for item in items)
                for items in ranks.values()):
            raise ValueError(f"is damaged: the ranks of {where!r} are not lists of "
                             f"{{'when', 'rank'}} objects")


def write_db(path, db):
    """Write ``db`` to ``path`` atomically (temporary file, then rename)."""
    atomic_write(path, json.dumps(db, indent=1, sort_keys=False) + "\n")


def databases(family):
    """The databases consulted for ``family``, most specific first: the user's, then shipped
    (a family without a shipped file has an empty one)."""
    dbs = _loaded.get(family)
    if dbs is None:
        dbs = [read_db(user_path(family), family, strict=False),
               read_db(shipped_path(family), family)]
        _loaded[family] = dbs
    return dbs


def forget(family=None):
    """Drop the in-memory copies so that the next lookup rereads the files."""
    global generation
    generation += 1
    _entries.clear()
    if family is None:
        _loaded.clear()
    else:
        _loaded.pop(family, None)


def entries(info, family):
    """The entries that apply to a device, in lookup order: (where, entry) pairs, where is
    "device", "architecture", "vendor" or "default". Memoized per device and family until
    ``forget``."""
    key = (family, info.name, getattr(info, "architecture", None), info.vendor)
    found = _entries.get(key)
    if found is not None:
        return found
    found = []
    architecture = getattr(info, "architecture", None)
    for section, where, name in (("devices", "device", info.name),
                                 ("architectures", "architecture", architecture),
                                 ("vendors", "vendor", info.vendor)):
        if name is None:
            continue
        for db in databases(family):
            entry = db[section].get(name)
            if entry is not None:
                found.append((where, entry))
    for db in databases(family):
        if db["default"].get("rules") or db["default"].get("ranks"):
            found.append(("default", db["default"]))
    _entries[key] = found
    return found


_entries = {}


def _condition_holds(when, features, extensions=frozenset()):
    for key, bound in when.items():
        if key == "extensions":
            if isinstance(bound, str) or not all(isinstance(e, str) for e in bound):
                raise DlprimError(f"tuning rule condition 'extensions' must be a list of "
                                  f"extension names, got {bound!r}")
            if not set(bound) <= set(extensions):
                return False
            continue
        if key in features:
            value = features[key]
            if isinstance(bound, list) and value not in bound or \
                    not isinstance(bound, list) and value != bound:
                return False
            continue
        kind, _, name = key.partition("_")
        if name not in features:
            raise DlprimError(f"tuning rule condition {key!r}: unknown feature {name!r}")
        value = features[name]
        if kind == "min" and value < bound:
            return False
        if kind == "max" and value > bound:
            return False
        if kind not in ("min", "max"):
            raise DlprimError(f"tuning rule condition {key!r} must start with min_ or max_")
    return True


def _distance(shape, features):
    """How far a measured rule's ``shape`` is from a problem's ``features``: the squared log2
    ratios of the sizes, plus one (a factor of two in one size) for each yes/no feature (a
    bool, such as a GEMM's transposes) on which they differ. A shape that leaves a yes/no
    feature out was measured with it off."""
    total = 0.0
    for name, value in features.items():
        if isinstance(value, bool):
            total += float(bool(shape.get(name, False)) != value)
    for name, value in shape.items():
        if name in features and not isinstance(features[name], bool):
            total += (math.log2(max(features[name], 1)) - math.log2(max(value, 1))) ** 2
    return total


def choose(rules, features, usable=lambda params: True, extensions=frozenset()):
    """The params of the rule that applies to ``features`` (a dict of numbers), or None.

    ``usable(params)`` filters out parameter sets the caller cannot run (say, on a device with
    less local memory than the one measured). ``extensions``: the device's OpenCL extension
    names, for conditions on them.
    """
    for rule in rules:
        if ("when" in rule and _condition_holds(rule["when"], features, extensions)
                and usable(rule["params"])):
            return dict(rule["params"])
    measured = [r for r in rules if "shape" in r and usable(r["params"])]
    if measured:
        best = min(measured, key=lambda r: _distance(r["shape"], features))
        return dict(best["params"])
    return None


def lookup(info, family, features, usable=lambda params: True):
    """Parameters for a problem with ``features`` on the device ``info`` (a DeviceInfo):
    device entry, else vendor entry, else default. Returns ``(params, where)``."""
    for where, entry in entries(info, family):
        params = choose(entry.get("rules", ()), features, usable,
                        getattr(info, "extensions", frozenset()))
        if params is not None:
            return params, where
    raise DlprimError(f"no {family} tuning rule applies to {features} on {info.name!r}; "
                      f"the shipped database {shipped_path(family)} needs a default rule")


def first_params(info, family, features, usable=lambda params: True):
    """The params of the first condition or measured rule, device entry first, that holds for
    ``features`` and is ``usable``; None when no entry has one (unlike ``lookup``, a family
    need not ship rules)."""
    for _, entry in entries(info, family):
        params = choose(entry.get("rules", ()), features, usable,
                        getattr(info, "extensions", frozenset()))
        if params is not None:
            return params
    return None


def merged_params(info, family, features, usable=lambda params: True):
    """The params of every condition rule that holds for ``features`` and is ``usable``, device
    entry first, merged: a key takes its value from the first such rule that has it. A device's
    rule may so give only the values it changes; the rest come from later rules (the shipped
    default). Measured (``shape``) rules take no part."""
    extensions = getattr(info, "extensions", frozenset())
    merged = {}
    for _, entry in entries(info, family):
        for rule in entry.get("rules", ()):
            if ("when" in rule and usable(rule["params"])
                    and _condition_holds(rule["when"], features, extensions)):
                for key, value in rule["params"].items():
                    merged.setdefault(key, value)
    return merged


def rank(info, family, solver, features):
    """The rank of ``solver`` for a problem of ``features`` on the device: the first ``ranks``
    item whose condition holds, in the first entry (device first) that ranks the solver and has
    one that holds; None when none does."""
    extensions = getattr(info, "extensions", frozenset())
    for _, entry in entries(info, family):
        for item in entry.get("ranks", {}).get(solver, ()):
            if _condition_holds(item.get("when", {}), features, extensions):
                return item["rank"]
    return None


def store_device_entry(path, family, info, rules, extra=None):
    """Put ``rules`` as the entry of device ``info`` into the database at ``path`` (replacing a
    damaged file)."""
    db = read_db(path, family, strict=False)
    entry = {"vendor": info.vendor, "platform": info.platform_name, "driver": info.driver_version,
             "rules": rules}
    entry.update(extra or {})
    db["devices"][info.name] = entry
    write_db(path, db)
    forget(family)
    return db
