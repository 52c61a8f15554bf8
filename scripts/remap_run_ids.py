"""Give the finished runs of a sweep directory the ids today's code gives them, so that a sweep resumes them instead
of running them again after a change of how a method's settings are spelled (not of what they do).

Each run's recorded grid point is read in today's spelling by vkv.upgrade.grid_point (`head_share` → `head_budget`,
`all` → `shared`; `sequential.targets` → `target_source`; a sequential hybrid or auto-ratio table → its switch and
settings; vkv's earlier mode methods `sequential` and `hybrid` → vkv with `per_turn` or the verbatim mode `shared`),
and its recorded config by vkv.upgrade.method_config; its method is rebuilt with today's code and its identity's config replaced by the method's config now; the
id is the hash of that identity. A run is left as it is, and reported, when today's code refuses its point or when a
setting it recorded has another value today (a changed default changes what the run would do), or when a setting
added since resolves to anything but its declared default (a default that depends on the rest of the recipe, such as
vkv's virtual_offset beside a verbatim share, is a behaviour the old code did not have). A setting the run recorded
that today's code still has but no longer records for such a run (vkv's target_source on a whole span, where no loop
reads it) is dropped: it did not act on the run.

    python scripts/remap_run_ids.py runs/benchmark            # show what would change
    python scripts/remap_run_ids.py runs/benchmark --write    # rewrite results*.jsonl in place (atomically)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from vkv.errors import VkvError
from vkv.io import write_text_atomic
from vkv.methods import METHODS
from vkv.sweep.grid import build_method
from vkv.sweep.plan import identity_hash
from vkv.upgrade import grid_point, method_config


def remapped(record: dict) -> dict:
    """The record with today's point, config and id (the result is untouched)."""
    point = grid_point(record["run"])
    identity = {**record["identity"], "config": build_method(point).config()}
    identity = json.loads(json.dumps(identity, default=list))  # tuples as the results file writes them
    _, recorded = method_config(record["run"]["method"], record["identity"]["config"])
    before, now = _flat(grid_point(recorded)), _flat(identity["config"])
    declared = declared_defaults(point["method"])
    inert = {k for k in before if k not in now and k in declared}  # today's code records it only where it acts
    changed = sorted(k for k in before if k not in inert and (k not in now or now[k] != before[k]))
    if changed:
        raise VkvError(
            "settings mean something else today: "
            + ", ".join(f"{k} {before[k]!r} → {now.get(k, 'gone')!r}" for k in changed)
        )
    resolved = sorted(k for k in now if k not in before and k in declared and now[k] != declared[k])
    if resolved:  # a setting added since whose default depends on the rest of the recipe: the old run had none
        raise VkvError(
            "settings added since resolve to a value the old code did not have: "
            + ", ".join(f"{k} {now[k]!r} (declared default {declared[k]!r})" for k in resolved)
        )
    return {**record, "run_id": identity_hash(identity), "run": point, "identity": identity}


def declared_defaults(method: str) -> dict:
    """The declared default of every setting of `method` and of its recipe, by dotted key as `_flat` names a config's
    settings (`optim.steps`, `distill.step_tokens`), JSON-shaped as a results file holds them."""
    cls = METHODS[method]
    out: dict = {}
    for config in (cls, cls.recipe_class):
        if config is not None:
            for key, value in _defaults(config).items():
                out.setdefault(key, value)
    return out


def _defaults(config: type, prefix: str = "") -> dict:
    out = {}
    for f in dataclasses.fields(config):
        if f.default is not dataclasses.MISSING:
            out[prefix + f.name] = json.loads(json.dumps(f.default, default=list))
        elif f.default_factory is not dataclasses.MISSING and dataclasses.is_dataclass(f.default_factory):
            out.update(_defaults(f.default_factory, f"{prefix}{f.name}."))
    return out


def _flat(config: dict, prefix: str = "") -> dict:
    """A recorded config's settings by dotted key: a nested config's settings one by one, so that a setting added to
    it since is told apart from one whose value changed."""
    out = {}
    for key, value in config.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = value
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory")
    parser.add_argument("--write", action="store_true", help="rewrite the results files (default: only report)")
    args = parser.parse_args()
    paths = sorted(Path(args.directory).glob("results*.jsonl"))
    if not paths:
        print(f"{args.directory}: no results*.jsonl", file=sys.stderr)
        return 1
    changed = same = refused = 0
    for path in paths:
        lines = []
        for line in path.read_text().splitlines():
            record = json.loads(line)
            try:
                new = remapped(record) if "identity" in record else record
            except VkvError as exc:
                print(f"{path}: run {record.get('run_id')}: left as it is ({exc})")
                new, refused = record, refused + 1
            if new["run_id"] == record.get("run_id"):
                same += 1
            elif new is not record:
                changed += 1
            lines.append(json.dumps(new))
        if args.write:
            write_text_atomic(path, "\n".join(lines) + "\n", writes="json")  # JSON lines
    action = "rewritten" if args.write else "would change (pass --write)"
    print(f"{changed} run ids {action}, {same} unchanged, {refused} refused")
    return 0


if __name__ == "__main__":
    sys.exit(main())
