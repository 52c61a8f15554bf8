"""The head budget as a type (HeadBudget): the fields hold a member, the command line, sweep keys, JSON and run ids
read and write the names they always did, and each member splits a budget as its name did."""

import json

import pytest
import torch

from tests.conftest import FIXTURES
from vkv.cli import build_parser
from vkv.cli.method_flags import build_method, given_options, recipe_from_args
from vkv.compress.attention_matching import AttentionMatchingFit
from vkv.compress.config import CompressConfig
from vkv.compress.head_budget import ADAKV_SAFEGUARD, HeadBudget, per_head_index
from vkv.errors import VkvError
from vkv.methods import METHODS, get_method
from vkv.sweep import expand, load_experiment, plan
from vkv.sweep.grid import build_method as sweep_method
from vkv.sweep.plan import identity_hash

MINI = str(FIXTURES / "mini-agent.json")
NAMES = ("shared", "uniform", "adaptive", "global")


def plain(value):
    """`value` with every HeadBudget replaced by its name as a plain string: what the fields held before the type."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(plain(v) for v in value)
    return value.value if isinstance(value, HeadBudget) else value


def test_members_are_their_names():
    assert [m.value for m in HeadBudget] == list(NAMES)
    for member, name in zip(HeadBudget, NAMES):
        assert member == name and HeadBudget(name) is member and hash(member) == hash(name)
        assert str(member) == f"{member}" == name and json.dumps(member) == json.dumps(name)
    assert [m.per_head for m in HeadBudget] == [False, True, True, True]
    assert [m.moves_entries for m in HeadBudget] == [False, False, True, True]


@pytest.mark.parametrize("name", NAMES)
def test_fields_hold_a_member_whatever_built_them(name):
    member = HeadBudget(name)
    assert CompressConfig(head_budget=name).head_budget is member
    assert CompressConfig.from_dict({"head_budget": name}).head_budget is member
    assert AttentionMatchingFit(head_budget=name).head_budget is member
    for method in ("kvzip", "snapkv", "knorm", "am", "kvopt"):
        assert get_method(method, head_budget=name).head_budget is member
    args = build_parser().parse_args(["eval", MINI, "--method", "snapkv", "--head-budget", name])
    cls = METHODS["snapkv"]
    assert build_method(cls, recipe_from_args(args), args, given_options(args, [cls])).head_budget is member
    args = build_parser().parse_args(["compress", MINI, "--out", "c.safetensors", "--head-budget", name])
    assert recipe_from_args(args).compress.head_budget is member


def test_dictionaries_json_and_run_ids_are_those_of_the_plain_names(tmp_path):
    config = CompressConfig(head_budget="adaptive").validate()
    assert config.to_dict() == plain(config.to_dict())
    assert json.dumps(config.to_dict()) == json.dumps(plain(config.to_dict()))
    path = tmp_path / "exp.toml"
    path.write_text(
        "[defaults]\nmodel = 'm'\nquant = 'fp32'\ntranscripts = ['" + MINI + "']\nratios = [3.2]\n"
        "methods = ['kvzip', 'vkv']\nhead_budget = 'uniform'\nkvzip = { head_budget = ['global', 'shared'] }\n",
        encoding="utf-8",
    )
    points = expand(load_experiment(path))
    budgets = {p["method"]: sweep_method(p).config() for p in points}
    assert budgets["vkv"]["compress"]["head_budget"] is HeadBudget.UNIFORM  # vkv's recipe holds it
    runs = plan(load_experiment(path), "cpu")
    budget = [r.identity["config"].get("head_budget") or r.identity["config"]["compress"]["head_budget"] for r in runs]
    assert set(budget) == {"global", "shared", "uniform"}
    for run in runs:
        assert run.id == identity_hash(plain(run.identity))


def test_a_bad_name_is_one_sentence_naming_the_field(tmp_path, capsys):
    choices = "choose one of shared, uniform, adaptive, global"
    with pytest.raises(VkvError, match=f"^CompressConfig: field head_budget: unknown value 'greedy'; {choices}$"):
        CompressConfig(head_budget="greedy")
    with pytest.raises(VkvError, match=f"^snapkv: field head_budget: unknown value 'greedy'; {choices}$"):
        get_method("snapkv", head_budget="greedy")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["eval", MINI, "--method", "snapkv", "--head-budget", "greedy"])
    assert "--head-budget: invalid choice: 'greedy'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="^unknown head budget 'greedy'; choose one of shared, uniform, adaptive"):
        per_head_index(torch.rand(1, 2, 8), 2, "greedy")


def test_help_names_the_choices_and_defaults_as_before():
    commands = build_parser()._subparsers._group_actions[0].choices
    text = {name: " ".join(commands[name].format_help().split()) for name in ("eval", "chat")}
    assert all("--head-budget {shared,uniform,adaptive,global}" in t and "HeadBudget" not in t for t in text.values())
    assert "(snapkv: uniform, knorm: shared, am: global" in text["eval"]
    assert "every layer and head) (default: global)" in text["chat"]


def reference_index(scores, budget, rule):
    """`per_head_index` as it was written on the names, before the type."""
    layers, heads, n = scores.shape
    if rule == "shared":
        index = scores.mean(dim=(0, 1)).topk(budget).indices.sort().values.expand(layers, heads, -1)
        return index, torch.ones_like(index, dtype=torch.bool)
    if rule == "uniform":
        index = scores.topk(budget, dim=-1).indices.sort(-1).values
        return index, torch.ones_like(index, dtype=torch.bool)
    kept = torch.zeros(layers, heads, n, dtype=torch.bool)
    floor = 1 if rule == "global" else max(1, int(ADAKV_SAFEGUARD * budget))
    kept.scatter_(-1, scores.topk(floor, dim=-1).indices, True)
    pool = (layers, heads * n) if rule == "adaptive" else (1, layers * heads * n)
    rest = scores.masked_fill(kept, float("-inf")).reshape(pool)
    kept.view(pool).scatter_(-1, rest.topk(pool[1] // n * (budget - floor), dim=-1).indices, True)
    counts = kept.sum(-1)
    column = torch.arange(n)
    order = torch.where(kept, column, n + column).argsort(-1)[..., : int(counts.max())]
    real = torch.arange(order.shape[-1]) < counts[..., None]
    return torch.where(real, order, order[..., :1]), real


@pytest.mark.parametrize("name", NAMES)
def test_each_member_splits_a_budget_as_its_name_did(name):
    scores = torch.rand(3, 4, 40, generator=torch.Generator().manual_seed(1))
    scores[:, 0] *= 3.0  # heads of unequal spread, so that the rules differ
    for budget in (1, 5, 12):
        expected = reference_index(scores, budget, name)
        for rule in (HeadBudget(name), name):
            index, real = per_head_index(scores, budget, rule)
            assert torch.equal(index, expected[0]) and torch.equal(real, expected[1])
