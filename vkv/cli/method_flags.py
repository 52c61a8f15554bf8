"""Methods and vkv's recipe as command-line flags, declared once by their dataclass fields: one flag per setting of
vkv's recipe (VkvRecipe, its virtual tokens' CompressConfig inside) and one per option of a registered method (an option several methods
share is one flag; unset, each method keeps its own default). `vkv eval`, `vkv compress` and `vkv chat` build their
methods through here."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass

from vkv.compress.config import CompressConfig
from vkv.compress.recipe import VkvRecipe
from vkv.errors import VkvError
from vkv.methods import METHODS
from vkv.settings import Setting, add_arguments, bounded, flat_settings, from_flat, text_type
from vkv.upgrade import renamed_method


def add_recipe_args(p: argparse.ArgumentParser, skip: tuple[str, ...] = ()) -> None:
    """One flag per setting of vkv's recipe (VkvRecipe): its virtual tokens' (CompressConfig), then its modes', from
    their fields (vkv.settings), less `skip`."""
    add_arguments(p.add_argument_group("compression (vkv's recipe)"), CompressConfig, skip)
    recipe = {s.key for s in flat_settings(CompressConfig)}
    add_arguments(
        p.add_argument_group("vkv's verbatim part, per-turn targets, auto-ratio"), VkvRecipe, (*recipe, *skip)
    )


def recipe_flags(args: argparse.Namespace) -> dict:
    """The recipe's settings the flags give, by flat key (a flag left at None keeps the field's default)."""
    return {s.key: getattr(args, s.key) for s in flat_settings(VkvRecipe) if getattr(args, s.key, None) is not None}


def recipe_flags_given(args: argparse.Namespace, skip: set[str] | frozenset[str] = frozenset()) -> list[str]:
    """The recipe's settings the flags set to other than their defaults (the seed and `skip` aside): what a method
    without vkv's recipe would ignore, so refuses."""
    defaults = {s.key: s.default for s in flat_settings(VkvRecipe)}
    return [k for k, v in recipe_flags(args).items() if k != "seed" and k not in skip and v != defaults[k]]


def recipe_from_args(args: argparse.Namespace) -> VkvRecipe:
    """The recipe the flags give."""
    return from_flat(VkvRecipe, recipe_flags(args)).validate()


TAKEN = ("window", "method")  # flags of `vkv eval` itself that a method option's name would clash with


@dataclass(frozen=True)
class MethodOption:
    """A method option as a flag: `setting.key` is the flag's key, `field` the dataclass field it sets in `owners`."""

    setting: Setting
    field: str
    owners: tuple[str, ...]


def method_options() -> dict[str, MethodOption]:
    """Every option of a registered method declared with `setting`, by flag key: the field's name, or
    `<method>_<name>` where `vkv eval` has a flag of that name itself. An option several methods share (head_budget,
    per_turn, mass, …) is one flag; its default is each method's own."""
    out: dict[str, MethodOption] = {}
    for cls in METHODS.values():
        for s in flat_settings(cls):
            if not s.help:  # not declared with setting(): a config object (recipe, verbatim) or internal state
                continue
            key = f"{cls.name}_{s.key}" if s.key in TAKEN else s.key
            if key in out:
                out[key] = dataclasses.replace(out[key], owners=(*out[key].owners, cls.name))
            else:
                out[key] = MethodOption(dataclasses.replace(s, key=key), s.key, (cls.name,))
    return out


def add_recipe_and_method_args(p: argparse.ArgumentParser) -> None:
    """vkv's recipe flags, then the methods' options; a setting both have (head_budget, the distillation's) is one flag
    among the methods' options, whose help says each one's default."""
    recipe = {s.key for s in flat_settings(VkvRecipe)}
    add_recipe_args(p, skip=tuple(key for key in method_options() if key in recipe))
    add_method_args(p)


def add_method_args(p: argparse.ArgumentParser) -> None:
    """One flag per method option, default None: unset, each method keeps its own default."""
    group = p.add_argument_group("method options (each given to the methods that have it; unset: their own default)")
    recipe = {s.key for s in flat_settings(VkvRecipe)}
    for option in method_options().values():
        s = option.setting
        owners = {o: _default(METHODS[o], option.field) for o in option.owners}
        if s.key in recipe:
            owners["vkv's recipe"] = _default(VkvRecipe, s.key)
        if len({repr(d) for d in owners.values()}) > 1:  # say whose default is which
            owners = {f"{o}: {d}": d for o, d in owners.items()}
        help_text = f"{s.help} ({', '.join(owners)})"
        if isinstance(s.default, bool):
            group.add_argument(s.flag, action=argparse.BooleanOptionalAction, default=None, help=help_text)
        else:
            kind = text_type(s.default) if s.default is not None else str
            group.add_argument(
                s.flag, type=bounded(kind, s.minimum, s.above, s.below), choices=s.allowed(), help=help_text
            )


def _default(cls, key: str):
    """The default of `cls`'s setting `key` (nested settings by their flat key)."""
    return next(s.default for s in flat_settings(cls) if s.key == key)


def given_options(args: argparse.Namespace, classes: list) -> dict[str, MethodOption]:
    """The method-option flags given, by flag key, each refused unless a method evaluated (or vkv's recipe) takes it."""
    names = [c.name for c in classes]
    recipe_keys = {s.key for s in flat_settings(VkvRecipe)} if any(c.recipe_class for c in classes) else set()
    for loop in ("per_turn", "every", "cap"):  # a comparison of loops must not silently mix in whole-span runs
        if not getattr(args, loop, None):
            continue
        lacking = [c.name for c in classes if c.uses_ratio and loop not in c.option_names()]
        if lacking:
            having = ", ".join(n for n, c in METHODS.items() if loop in c.option_names())
            flag = "--" + loop.replace("_", "-")
            raise VkvError(f"{flag}: method '{lacking[0]}' has no such mode (methods with one: {having})")
    given = {}
    for key, option in method_options().items():
        if getattr(args, key, None) is None:
            continue
        if not set(option.owners) & set(names) and key not in recipe_keys:
            raise VkvError(
                f"{option.setting.flag}: none of the methods {', '.join(names)} has it ({', '.join(option.owners)} do)"
            )
        given[key] = option
    return given


def refuse_unused_recipe_flags(args: argparse.Namespace, classes: list) -> None:
    """Refuse a flag of vkv's recipe that none of the methods evaluated takes, or that the run would not use, rather
    than run without it: the recipe belongs to the methods with one (vkv, meanpool), the shared verbatim part's
    settings to `--verbatim shared`, the target source to runs turn by turn (`--per-turn`, `--auto-ratio`). A setting
    a method also declares (`--head-budget`, `--distill-steps`, …) is checked with the methods' options
    (`given_options`)."""
    shared = set(method_options())
    turn_by_turn = any(getattr(args, key, None) for key in ("per_turn", "every", "auto_ratio"))
    for s in flat_settings(VkvRecipe):
        given = getattr(args, s.key, None)
        if given is None or given == s.default or s.key in shared:
            continue
        if not any(c.recipe_class is VkvRecipe for c in classes):
            raise VkvError(
                f"{s.flag}: none of the methods {', '.join(c.name for c in classes)} takes it (vkv's recipe does)"
            )
        if s.path[0] == "shared" and not VkvRecipe(verbatim=getattr(args, "verbatim", None)).shared_tokens:
            raise VkvError(
                f"{s.flag}: it sets the shared verbatim part, which only --verbatim shared (or shared+per-head) keeps"
            )
        if s.key == "target_source" and not turn_by_turn:
            raise VkvError(f"{s.flag}: it sets the targets of a run turn by turn (--per-turn, --every or --auto-ratio)")


def method_class(name: str, args: argparse.Namespace) -> type:
    """The class `--method name` runs (vkv's earlier mode methods refused, naming today's options)."""
    renamed = renamed_method(name)
    if renamed:
        raise VkvError(f"--method: {renamed}")
    if name not in METHODS:
        raise VkvError(f"--method: unknown method '{name}'; choose from {', '.join(METHODS)}")
    return METHODS[name]


def build_method(cls, recipe: VkvRecipe, args: argparse.Namespace, given: dict[str, MethodOption]):
    """`cls` with the part of the recipe it takes and the options given that it has."""
    options = {o.field: getattr(args, key) for key, o in given.items() if cls.name in o.owners}
    if cls.recipe_class is VkvRecipe:
        options["recipe"] = recipe
    elif cls.recipe_class is not None:  # its own class: defaults that depend on the recipe are its own
        options["recipe"] = from_flat(cls.recipe_class, recipe_flags(args)).validate()
    return cls(**options)
