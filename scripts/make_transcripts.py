"""Generate synthetic coding-agent transcripts with factual-recall questions for vkv's benchmark.

    python scripts/make_transcripts.py --out transcripts --seed 0          # (re)write the 12 + 14 gen-*.json files
    python scripts/make_transcripts.py --out transcripts --seed 0 --check  # exit 1 if the files on disk differ

Design
------
A transcript is a chain of small *scenes*: the user's request, a config file the agent writes, a question the
agent asks, a plan, a user interruption or review comment that changes a value, a real library file the agent
reads, a failing test run, a CI log, `git log`, a profile, a dependency bump, a rename, a closing summary. Each
scene appends messages to a `Session` and registers candidate *facts* (future questions) at the turn that first
states them. A scenario (task, language, project) picks the pools; a seeded `random.Random` per file picks the
values, phrasings, tools and scene order, so the files do not share one visible template.

Real files: the agent reads source and config files of the packages installed in this venv (found through
`sysconfig.get_paths()["purelib"]`, shown as `site-packages/<path>`). Facts about them come from `ast` (default
argument values, the parameter holding a default, module constants, base classes, raised exception classes and
messages) or from config files (METADATA pins, entry_points.txt, matplotlib style sheets). Wrong choices are
other values of the same type from the same file, padded with common defaults.

Questions have a kind: `decision`, `tool_output` or `change` (the final value after a later edit; the stale
value is stated in the same scene, a few turns at most before, and sits in `reject` and among the choices).
`source_turns` are computed, never declared: every turn whose text (content plus tool calls serialised as
`vkv.evals.validate.message_text` does) contains the accepted keyword by the whole-token rule of
`vkv.evals.metrics.contains_keyword`. A candidate is dropped when its keyword shows up before the turn meant to
state it, leaks into the system message, the question or the answer prefix, or when a wrong choice would score
as correct. From the survivors a deterministic subset is kept: about one question per 68 estimated tokens
(25-32), at least a quarter of each kind, the weakest-looking facts dropped first. If a draft misses the token
range or the quotas, the file is rebuilt with a different scene count or draw (attempt number in the seed).
No model or tokenizer is run here: token counts are estimated from characters (fitted per kind of text).

Long mode
---------
LONG_SCENARIOS (own projects, 4 dev + 10 test) are written to `long/dev/` and `long/test/` as
`gen-long-<slug>-<n>.json`, ~6-6.5k rendered tokens each (kept below 7,400 so a whole transcript fits the model's
8,192 positions with a question), 28-40 questions, each kind at least a quarter. Long files add LONG_SETTINGS to the
settings pool, run every scene of LONG_BODY once or twice (scenes whose questions are generic, like "Which CI job
failed?", at most once; the long-only scenes add `kubectl`, `curl` and `psql` output and decisions on alerting and
rollout), then fresh code reads while the budget lasts. Two late changes (`scene_late_change`), one ~1,500 tokens
before the end and one just before the summary, change settings last stated at the start, without repeating the old
value, so a change question's stale value sits thousands of tokens back. Nothing is restated near the end: the
summary names only the two late changes and the config is never rewritten whole. The subset kept has at least half
of its questions with their latest evidence FAR estimated tokens (>= 2,048 rendered) before the end.

Determinism: file listings are sorted, every choice comes from the seeded RNG, no dict/set iteration order, time
or hash seed is relied on, and the JSON is written with a fixed layout.
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import random
import re
import sys
import sysconfig
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from vkv.evals.metrics import contains_keyword, keyword_correct
from vkv.evals.validate import message_text
from vkv.text.transcript import parse_transcript

SITE = Path(sysconfig.get_paths()["purelib"])
CODE_PACKAGES = [
    "_pytest",
    "anyio",
    "charset_normalizer",
    "click",
    "h11",
    "httpx2",
    "jinja2",
    "pyparsing",
    "rich",
    "tqdm",
    "typer",
    "urllib3",
    "yaml",
]
META_DISTS = ["anyio", "httpx2", "huggingface_hub", "jinja2", "pydantic", "requests", "rich", "typer"]
ENTRY_DISTS = ["charset_normalizer", "huggingface_hub", "markdown_it_py", "pygments", "tqdm", "typer"]
TRIVIAL = {0, 1, -1, 2, 10, 100}
KINDS = ("decision", "tool_output", "change")
DEBUG = False


# ---- real files from site-packages ------------------------------------------------------------------------


@dataclass(frozen=True)
class CodeFact:
    kind: str  # default | param | const | base | raises | message
    question: str
    prefix: str
    answer: str  # the accepted keyword, also choices[0]
    wrong: tuple[str, ...]
    line: int  # 1-based line that states it
    anchor: tuple[int, int]  # enclosing definition; the excerpt is cut from it
    strength: int


def same_number(a: str, b: str) -> bool:
    try:
        return float(a.replace("_", "")) == float(b.replace("_", ""))
    except ValueError:
        return False


def neighbours(value: str) -> list[str]:
    """Plausible wrong numbers of the same shape as `value`."""
    try:
        x = float(value.replace("_", ""))
    except ValueError:
        return []
    if "." in value or "e" in value:
        return [repr(x * 2), repr(x / 2), "0.5", "1.0"]
    return [str(int(x) * 2), str(int(x) // 2), str(int(x) + 1), "64"]


@cache
def code_facts(rel: str) -> tuple[CodeFact, ...]:
    """Every question-worthy fact `ast` finds in one installed source file."""
    src = (SITE / rel).read_text(encoding="utf-8")
    blines = [ln.encode() for ln in src.splitlines()]
    tree = ast.parse(src)

    def seg(node) -> str | None:  # ast.get_source_segment is quadratic on big files
        if node.lineno != node.end_lineno:
            return None
        return blines[node.lineno - 1][node.col_offset : node.end_col_offset].decode()

    def lit(node) -> str | None:
        if not isinstance(node, ast.Constant) or isinstance(node.value, bool) or node.value is None:
            return None
        v = node.value
        if isinstance(v, (int, float)) and v not in TRIVIAL:
            return seg(node)
        if isinstance(v, str) and 4 <= len(v) <= 32 and re.fullmatch(r"[\w.:/%-]+", v) and not v.isdigit():
            return v
        return None

    nodes = sorted(ast.walk(tree), key=lambda n: (getattr(n, "lineno", 0), getattr(n, "col_offset", 0)))
    literals = {"num": [], "str": []}
    for node in nodes:
        if isinstance(node, ast.Constant) and lit(node):
            literals["str" if isinstance(node.value, str) else "num"].append(lit(node))
    bases = sorted(
        {
            seg(b)
            for n in nodes
            if isinstance(n, ast.ClassDef)
            for b in n.bases
            if isinstance(b, (ast.Name, ast.Attribute)) and seg(b)
        }
    )
    messages = sorted({_message(n) for n in nodes if isinstance(n, ast.Raise) and _message(n)})
    facts: list[CodeFact] = []
    where = f"`site-packages/{rel}`"

    def pool(value: str) -> tuple[str, ...]:
        key = "num" if re.fullmatch(r"[-\d._e]+", value) else "str"
        found = sorted(x for x in set(literals[key]) if not same_number(x, value) and x != value)
        return tuple(found + neighbours(value) + (["auto", "default", "strict"] if key == "str" else []))

    def visit(body, owner: str):
        for node in body:
            if isinstance(node, ast.ClassDef):
                span = (node.lineno, node.end_lineno)
                base = seg(node.bases[0]) if node.bases else None
                if base and base not in ("object", "Exception", "Protocol", "Generic", "ABC", "NamedTuple"):
                    facts.append(
                        CodeFact(
                            "base",
                            f"Which base class does `{node.name}` extend in {where}?",
                            f"`{node.name}` extends",
                            base,
                            tuple([b for b in bases if b != base] + ["object", "Exception", "ABC"]),
                            node.lineno,
                            span,
                            3,
                        )
                    )
                visit(node.body, node.name + ".")
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                function(node, owner + node.name)
            elif isinstance(node, ast.Assign) and not owner and len(node.targets) == 1:
                t, value = node.targets[0], lit(node.value)
                if isinstance(t, ast.Name) and re.fullmatch(r"_?[A-Z][A-Z0-9_]{3,}", t.id) and value:
                    facts.append(
                        CodeFact(
                            "const",
                            f"What value is `{t.id}` set to in {where}?",
                            f"`{t.id}` is set to",
                            value,
                            pool(value),
                            node.lineno,
                            (node.lineno, node.end_lineno),
                            4 if len(value) > 3 else 3,
                        )
                    )

    def function(node, qual: str):
        span = (min([node.lineno] + [d.lineno for d in node.decorator_list]), node.end_lineno)
        args = node.args.posonlyargs + node.args.args
        pairs = list(zip(args[len(args) - len(node.args.defaults) :], node.args.defaults))
        pairs += [(a, d) for a, d in zip(node.args.kwonlyargs, node.args.kw_defaults) if d is not None]
        values = [lit(d) for _, d in pairs]
        names = [a.arg for a in args + node.args.kwonlyargs if a.arg not in ("self", "cls")]
        for (arg, d), value in zip(pairs, values):
            if not value:
                continue
            facts.append(
                CodeFact(
                    "default",
                    f"In {where}, what is the default value of `{arg.arg}` in `{qual}()`?",
                    f"`{qual}()` defaults `{arg.arg}` to",
                    value,
                    pool(value),
                    d.lineno,
                    span,
                    4 if "." in value or len(value) > 3 else 3,
                )
            )
            if values.count(value) == 1 and ("_" in arg.arg.strip("_") or len(arg.arg) >= 7):
                facts.append(
                    CodeFact(
                        "param",
                        f"Which parameter of `{qual}()` in {where} defaults to `{value}`?",
                        "That parameter is",
                        arg.arg,
                        tuple([n for n in names if n != arg.arg] + ["timeout", "max_size", "limit"]),
                        d.lineno,
                        span,
                        4,
                    )
                )
        raises = [
            n
            for n in ast.walk(node)
            if isinstance(n, ast.Raise) and isinstance(n.exc, ast.Call) and isinstance(n.exc.func, ast.Name)
        ]
        raises.sort(key=lambda n: n.lineno)
        kinds = sorted({n.exc.func.id for n in raises})
        if len(kinds) == 1 and kinds[0] not in ("ValueError", "TypeError", "RuntimeError", "NotImplementedError"):
            facts.append(
                CodeFact(
                    "raises",
                    f"Which exception class does `{qual}()` in {where} raise?",
                    f"`{qual}()` raises",
                    kinds[0],
                    ("ValueError", "TypeError", "RuntimeError"),
                    raises[0].lineno,
                    span,
                    4,
                )
            )
        for n in raises:
            msg = _message(n)
            if msg:
                facts.append(
                    CodeFact(
                        "message",
                        f"What error message does `{qual}()` in {where} raise `{n.exc.func.id}` with?",
                        f"It raises `{n.exc.func.id}` with the message",
                        msg,
                        tuple(
                            [m for m in messages if m != msg]
                            + ["invalid argument given", "unexpected value", "operation not supported"]
                        ),
                        n.lineno,
                        span,
                        5,
                    )
                )

    visit(tree.body, "")
    return tuple(facts)


def _message(node: ast.Raise) -> str | None:
    """The first words of a raised exception's literal message (a whole-token phrase), else None."""
    exc = node.exc
    if not (
        isinstance(exc, ast.Call)
        and exc.args
        and isinstance(exc.args[0], ast.Constant)
        and isinstance(exc.args[0].value, str)
    ):
        return None
    text = exc.args[0].value
    words = re.findall(r"[A-Za-z][\w-]*", text)
    if len(words) < 3 or not text[:1].isalpha():
        return None
    phrase = " ".join(words[:5])
    return phrase if phrase in text else None


@cache
def source_files(package: str) -> tuple[str, ...]:
    return tuple(
        sorted(
            str(p.relative_to(SITE))
            for p in (SITE / package).rglob("*.py")
            if "__pycache__" not in p.parts and "test" not in p.name
        )
    )


def pick_code_excerpt(rng: random.Random, used: set):
    """(relpath, first line, last line, lines, facts inside) for a short excerpt holding at least two facts."""
    for _ in range(300):
        rel = rng.choice(source_files(rng.choice(CODE_PACKAGES)))
        if rel in used:
            continue
        try:
            facts = code_facts(rel)
        except (SyntaxError, UnicodeDecodeError):
            continue
        lines = (SITE / rel).read_text(encoding="utf-8").splitlines()
        anchors = sorted({f.anchor for f in facts})
        rng.shuffle(anchors)
        for a, b in anchors:
            first = min(f.line for f in facts if f.anchor == (a, b))
            lo = max(a if first - a < 8 else first - 3, 1)
            hi = min(max(b, first + 2), lo + 11, len(lines))
            inside = [f for f in facts if lo <= f.line <= hi]
            text = lines[lo - 1 : hi]
            if len({f.answer for f in inside}) >= 2 and sum(map(len, text)) < 600 and max(map(len, text)) < 96:
                used.add(rel)
                return rel, lo, hi, text, inside
    raise RuntimeError("no usable source excerpt found")


def dist_info(prefix: str) -> Path:
    return sorted(SITE.glob(f"{prefix}-*.dist-info"))[0]


# ---- scenarios and pools ------------------------------------------------------------------------------------

SCENARIOS = [  # split, task slug, task, language, project, domain noun
    ("dev", "bug-hunt", "bug hunt", "python", "ledgerline", "refund"),
    ("dev", "ci-failure", "CI failure", "typescript", "parcelhub", "parcel"),
    ("dev", "migration", "config migration", "go", "tollgate", "toll"),
    ("dev", "performance", "performance work", "rust", "quarry", "record"),
    ("dev", "dependency-upgrade", "dependency upgrade", "python", "fieldnotes", "note"),
    ("dev", "code-review", "code review", "java", "orderdesk", "order"),
    ("test", "refactor", "refactor", "ruby", "bookshelf", "loan"),
    ("test", "bug-hunt", "bug hunt", "go", "meterd", "meter"),
    ("test", "ci-failure", "CI failure", "python", "tidewatch", "gauge"),
    ("test", "migration", "framework migration", "typescript", "fernpost", "post"),
    ("test", "performance", "performance work", "python", "siltstream", "batch"),
    ("test", "dependency-upgrade", "dependency upgrade", "rust", "skiff", "sync"),
]
LONG_SCENARIOS = [  # the long split: its own projects, so no long file shares a name with a short one
    ("dev", "bug-hunt", "bug hunt", "java", "claimdesk", "claim"),
    ("dev", "performance", "performance work", "go", "hopperd", "shipment"),
    ("dev", "refactor", "refactor", "typescript", "tallyroll", "invoice"),
    ("dev", "ci-failure", "CI failure", "ruby", "docketry", "ticket"),
    ("test", "migration", "config migration", "python", "grainbin", "lot"),
    ("test", "dependency-upgrade", "dependency upgrade", "java", "stockroom", "sku"),
    ("test", "code-review", "code review", "go", "beaconry", "probe"),
    ("test", "bug-hunt", "bug hunt", "rust", "cinderlog", "span"),
    ("test", "ci-failure", "CI failure", "typescript", "harborlight", "berth"),
    ("test", "performance", "performance work", "ruby", "quillpad", "draft"),
    ("test", "refactor", "refactor", "python", "mossgate", "permit"),
    ("test", "migration", "framework migration", "java", "routewise", "route"),
    ("test", "dependency-upgrade", "dependency upgrade", "python", "kelpfarm", "harvest"),
    ("test", "code-review", "code review", "rust", "emberkv", "segment"),
]

LANGS = {
    "python": dict(
        cfg="config/settings.toml",
        fmt="toml",
        test="pytest -q",
        src="src/{p}/{n}s.py",
        const="{name} = {v}",
        libs=[
            ("payload validation", "msgspec", ["pydantic", "marshmallow", "attrs"]),
            ("retries", "stamina", ["tenacity", "backoff", "retrying"]),
            ("outgoing HTTP calls", "niquests", ["requests", "httpx", "aiohttp"]),
            ("freezing time in tests", "time-machine", ["freezegun", "pytest-freezer", "libfaketime"]),
        ],
    ),
    "typescript": dict(
        cfg="config/default.json",
        fmt="json",
        test="npx jest",
        src="src/{n}/{n}.service.ts",
        const="export const {name} = {v};",
        libs=[
            ("logging", "pino", ["winston", "bunyan", "morgan"]),
            ("schema validation", "valibot", ["zod", "joi", "yup"]),
            ("outgoing HTTP calls", "undici", ["axios", "node-fetch", "got"]),
            ("the job queue", "bullmq", ["bull", "agenda", "bee-queue"]),
        ],
    ),
    "go": dict(
        cfg="config/{p}.yaml",
        fmt="yaml",
        test="go test ./...",
        src="internal/{n}/{n}.go",
        const="const {name} = {v}",
        libs=[
            ("configuration loading", "koanf", ["viper", "envconfig", "cleanenv"]),
            ("logging", "zerolog", ["zap", "logrus", "slog"]),
            ("HTTP routing", "chi", ["gin", "echo", "gorilla/mux"]),
            ("test mocks", "moq", ["gomock", "mockery", "testify"]),
        ],
    ),
    "rust": dict(
        cfg="{p}.toml",
        fmt="toml",
        test="cargo test",
        src="src/{n}.rs",
        const="pub const {name}: usize = {v};",
        libs=[
            ("argument parsing", "argh", ["clap", "structopt", "pico-args"]),
            ("error types", "snafu", ["anyhow", "thiserror", "eyre"]),
            ("fast hashing", "ahash", ["fxhash", "siphasher", "seahash"]),
            ("the CSV tokenizer", "csv-core", ["csv", "nom", "serde"]),
        ],
    ),
    "java": dict(
        cfg="src/main/resources/application.yml",
        fmt="yaml",
        test="mvn -q test",
        src="src/main/java/com/acme/{n}/{Nc}Service.java",
        const="private static final int {name} = {v};",
        libs=[
            ("retries", "resilience4j", ["spring-retry", "failsafe", "guava-retrying"]),
            ("in-process caching", "caffeine", ["guava", "ehcache", "hazelcast"]),
            ("JSON mapping", "moshi", ["jackson", "gson", "jsonb"]),
            ("outgoing HTTP calls", "okhttp", ["webclient", "retrofit", "httpclient"]),
        ],
    ),
    "ruby": dict(
        cfg="config/{p}.yml",
        fmt="yaml",
        test="bundle exec rspec",
        src="app/services/{n}_cache.rb",
        const="{name} = {v}",
        libs=[
            ("caching", "dalli", ["redis", "memcache-client", "activesupport"]),
            ("JSON encoding", "oj", ["json", "yajl", "multi_json"]),
            ("background jobs", "good_job", ["sidekiq", "resque", "delayed_job"]),
            ("HTTP calls", "httpx", ["faraday", "httparty", "typhoeus"]),
        ],
    ),
}

# key, label, value pool, default guesses, question, answer prefix. {p}/{P} project, {n}/{N} domain noun.
SETTINGS = [
    (
        "port",
        "the HTTP port",
        [4817, 5193, 7342, 6127, 8391, 9047, 3719, 6683, 5871, 7604],
        ["8080", "3000", "8000"],
        "Which port does {p} listen on?",
        "{p} listens on port",
    ),
    (
        "request_timeout",
        "the upstream request timeout",
        ["45s", "17s", "38s", "52s", "23s", "65s", "28s"],
        ["30s", "60s", "10s"],
        "What is {p}'s upstream request timeout?",
        "The upstream request timeout is",
    ),
    (
        "max_retries",
        "the retry limit",
        [7, 9, 11, 6, 13],
        ["3", "5", "10"],
        "How many retries does {p} allow before giving up?",
        "The retry limit is",
    ),
    (
        "cache_ttl",
        "the cache TTL",
        ["270s", "420s", "95s", "1350s", "810s"],
        ["300s", "60s", "3600s"],
        "What TTL do {p}'s cache entries get?",
        "Cache entries expire after",
    ),
    (
        "pool_size",
        "the connection pool size",
        [12, 14, 22, 18, 26, 34],
        ["10", "5", "20"],
        "How large is {p}'s connection pool?",
        "The connection pool size is",
    ),
    (
        "batch_size",
        "the batch size",
        [384, 750, 96, 1536, 640, 288],
        ["100", "1000", "500"],
        "What batch size does {p} process records in?",
        "Records are processed in batches of",
    ),
    (
        "dsn_env",
        "the variable holding the database DSN",
        ["{P}_STORE_DSN", "{P}_PG_URL", "{P}_{N}_DSN", "{N}DB_CONN"],
        ["DATABASE_URL", "DB_URL", "POSTGRES_URL"],
        "Which environment variable holds {p}'s database DSN?",
        "The DSN is read from",
    ),
    (
        "audit_log",
        "the audit log path",
        ["var/log/{p}/audit.jsonl", "run/{p}-events.ndjson", "state/{n}-trail.log"],
        ["logs/app.log", "/var/log/app.log", "app.log"],
        "Where does {p} write its audit log?",
        "The audit log is written to",
    ),
    (
        "retry_queue",
        "the retry queue",
        ["{n}s.retry.v2", "{p}-deadletter-7d", "{n}-slow-lane"],
        ["default", "jobs", "retry"],
        "What is the name of {p}'s retry queue?",
        "The retry queue is called",
    ),
    (
        "tenant_header",
        "the tenant header",
        ["X-{Pc}-Tenant", "X-Shard-Key", "X-{Nc}-Realm"],
        ["X-Request-Id", "Authorization", "X-Tenant-Id"],
        "Which request header carries the tenant for {p}?",
        "The tenant is carried in",
    ),
]
LONG_SETTINGS = [  # long files only: appending these to SETTINGS would shift the short files' draws
    (
        "worker_count",
        "the worker count",
        [11, 13, 19, 23, 29],
        ["4", "8", "16"],
        "How many workers does {p} run?",
        "The worker count is",
    ),
    (
        "shutdown_grace",
        "the shutdown grace period",
        ["25s", "40s", "75s", "110s"],
        ["30s", "10s", "60s"],
        "How long is {p}'s shutdown grace period?",
        "The shutdown grace period is",
    ),
    (
        "upload_dir",
        "the upload spool directory",
        ["var/spool/{p}-in", "data/{n}-drop", "srv/{p}/inbox"],
        ["uploads", "/tmp", "data/uploads"],
        "Which directory does {p} spool uploads to?",
        "Uploads are spooled to",
    ),
    (
        "rate_limit",
        "the per-client rate limit (requests per minute)",
        [170, 240, 45, 620, 85],
        ["60", "100", "1000"],
        "How many requests per minute does {p} allow each client?",
        "Each client may make",
    ),
    (
        "region",
        "the deployment region",
        ["eu-central-2", "ap-southeast-4", "ca-west-1", "sa-east-1"],
        ["us-east-1", "eu-west-1", "us-west-2"],
        "Which region is {p} deployed to?",
        "It is deployed to",
    ),
]
SETTING = {s[0]: s for s in SETTINGS + LONG_SETTINGS}
RUNTIMES = {
    "python": ("Python", ["3.11.9", "3.12.4", "3.10.14"]),
    "typescript": ("Node", ["20.12.2", "22.3.0", "18.20.3"]),
    "go": ("Go", ["1.22.5", "1.21.11", "1.23.1"]),
    "rust": ("Rust", ["1.79.0", "1.76.0", "1.81.0"]),
    "java": ("Java", ["21.0.3", "17.0.11", "22.0.1"]),
    "ruby": ("Ruby", ["3.3.4", "3.2.4", "3.1.6"]),
}
RUNTIME_GUESSES = {
    "python": ["3.12", "3.11.0"],
    "typescript": ["20.0.0", "18.0.0"],
    "go": ["1.21", "1.22.0"],
    "rust": ["1.70.0", "1.75.0"],
    "java": ["17", "21"],
    "ruby": ["3.2.0", "3.3.0"],
}
PHRASES = [
    "rounds half even",
    "skips empty batches",
    "retries after 503",
    "keeps insertion order",
    "rejects stale cursor",
    "caps backoff at limit",
    "flushes on shutdown",
    "parses quoted fields",
    "handles dst gap",
    "dedupes by idempotency key",
    "expires idle leases",
    "sorts by sequence",
]
AUTHORS = [
    "Ilse Marchetti",
    "Tomasz Wrobel",
    "Priya Natarajan",
    "Oren Dahlberg",
    "Keiko Amano",
    "Bram Oosterhuis",
    "Lucia Ferreyra",
    "Dmitri Volkonsky",
]
SUBJECTS = [
    "switch {n} totals to integer cents",
    "add {n} export endpoint",
    "cache {n} lookups per request",
    "retry {n} sync on 503",
    "drop legacy {n} CSV columns",
    "move {n} config into one file",
    "log {n} ids on failure",
    "bump lint toolchain",
    "split {n} reader from writer",
]
OPENERS = {
    "bug hunt": [
        "Customers report {n} totals that are off by a few units since the last deploy. Track it down.",
        "Support escalated a bug: some {n}s are processed twice. Find the cause and fix it.",
    ],
    "CI failure": [
        "CI on main has been red since this morning. Can you find out why and fix it?",
        "The nightly pipeline keeps failing and nobody has looked yet. Please dig in.",
    ],
    "config migration": [
        "We're moving {p}'s configuration to a single file and a new loader. Keep behaviour identical."
    ],
    "performance work": [
        "{p} got slow on large inputs; the nightly job now takes 40 minutes. Profile it and speed it up."
    ],
    "dependency upgrade": ["Time to upgrade {p}'s dependencies; the lock file is a year old. Watch for API changes."],
    "code review": ["Please review and finish the open branch that adds retries to the {n} client."],
    "refactor": ["The {n} cache code is a tangle. Refactor it into one service object without changing behaviour."],
    "framework migration": ["We're moving {p} off its old HTTP framework. Port the routes and keep the tests green."],
}
READ_REASONS = [
    "scripts/release.py imports {pkg}; checking what it actually does before relying on it.",
    "The traceback goes through {pkg}, so let me read that code.",
    "Before changing our wrapper I want to see {pkg}'s own defaults.",
    "The docs are vague here; reading {pkg}'s source instead.",
    "Checking the installed {pkg} rather than guessing from memory.",
    "Our fixture generator leans on {pkg}. Quick look at the installed version:",
]
AFTER_READ = [
    "Good, that matches what our wrapper assumes.",
    "So the library default differs from our docs.",
    "That explains part of it.",
    "Fine, nothing to change on our side there.",
    None,
    None,
]
ACKS = ["Noted.", "Got it.", "Understood, changing it.", "Sure.", "OK, switching."]


def ident(sc: dict, *words: str) -> str:
    """A function name in the project language's style (snake_case or camelCase)."""
    words = [w for part in words for w in part.split("_") if w]
    if sc["lang"] in ("python", "rust", "ruby"):
        return "_".join(words)
    return words[0] + "".join(w.capitalize() for w in words[1:])


def fill(template: str, sc: dict) -> str:
    p, n = sc["project"], sc["noun"]
    return template.format(p=p, P=p.upper(), n=n, N=n.upper(), Pc=p.capitalize(), Nc=n.capitalize())


# ---- the session: messages plus candidate facts ------------------------------------------------------------


@dataclass
class Fact:
    kind: str
    slug: str
    question: str
    prefix: str
    answer: str
    wrong: list
    turn: int
    strength: int = 3


@dataclass
class Session:
    rng: random.Random
    sc: dict
    messages: list = field(default_factory=list)
    facts: list = field(default_factory=list)
    values: dict = field(default_factory=dict)  # setting key -> current value
    changed: set = field(default_factory=set)

    def add(self, role: str, content: str, calls=(), name=None) -> int:
        m = {"role": role, "content": content}
        if calls:
            m["tool_calls"] = [{"name": t, "arguments": a} for t, a in calls]
        if name:
            m["name"] = name
        self.messages.append(m)
        return len(self.messages) - 1

    def act(self, text: str, tool: str, args: dict, output: str) -> int:
        """One tool call and its output; returns the output's turn."""
        self.add("assistant", text, [(tool, args)])
        return self.add("tool", output, name=tool)

    def fact(self, kind, slug, question, prefix, answer, wrong, turn, strength=3):
        self.facts.append(Fact(kind, slug, question, prefix, str(answer), [str(w) for w in wrong], turn, strength))

    def pick(self, pool, k=None):
        return self.rng.choice(pool) if k is None else self.rng.sample(pool, k)

    @property
    def lang(self) -> dict:
        return LANGS[self.sc["lang"]]


def estimate_tokens(messages) -> int:
    """Rendered tokens, estimated without a tokenizer (fitted on SmolLM2: prose ~3.9 chars/token, tool output
    ~2.8, JSON-serialised tool calls ~2.1, plus ~12 tokens of chat markup per message)."""
    total = 0.0
    for m in messages:
        calls = " ".join(json.dumps({"name": c["name"], "arguments": c["arguments"]}) for c in m.get("tool_calls", []))
        total += len(m["content"]) / (2.8 if m["role"] == "tool" else 3.9) + len(calls) / 2.1 + 12
    return round(total)


def setting_fact(s: Session, key: str, turn: int, kind="decision", stale=None, strength=None):
    _, _, _, defaults, question, prefix = SETTING[key]
    wrong = ([stale] if stale else []) + [d for d in defaults if d != s.values[key]]
    s.facts = [f for f in s.facts if f.slug != key]  # a changed setting is asked about once, as a change
    s.fact(
        kind,
        key,
        fill(question, s.sc),
        fill(prefix, s.sc),
        s.values[key],
        wrong,
        turn,
        strength or (3 if s.values[key].isdigit() else 4),
    )


def setting_keys(s: Session) -> list[str]:
    """The settings a file may use: long files need more of them than the short files' pool holds."""
    return sorted(k for k, *_ in SETTINGS + (LONG_SETTINGS if s.sc.get("long") else []))


def draw_value(s: Session, key: str, avoid=()) -> str:
    pool = [fill(str(v), s.sc) for v in SETTING[key][2]]
    return s.pick([v for v in pool if v not in avoid and v != s.values.get(key)])


def config_line(fmt: str, k: str, v: str) -> str:
    q = v if v.isdigit() else json.dumps(v)
    return {"json": f'  "{k}": {q},', "toml": f"{k} = {q}", "yaml": f"  {k}: {v}"}[fmt]


def render_config(fmt: str, items) -> str:
    body = "\n".join(config_line(fmt, k, v) for k, v in items)
    if fmt == "json":
        return "{\n" + body.rstrip(",") + "\n}\n"
    return ("[server]\n" if fmt == "toml" else "server:\n") + body + "\n"


# ---- scenes: decisions ---------------------------------------------------------------------------------------


def scene_request(s: Session, opener: str | None = None):
    """The user's opening request, stating three settings and the library to use."""
    keys = s.pick(setting_keys(s), s.rng.choice([3, 4]))
    for k in keys:
        s.values[k] = draw_value(s, k)
    purpose, lib, alts = s.pick(s.lang["libs"])
    s.values["lib"] = lib
    bits = [f"{SETTING[k][1]} is `{s.values[k]}`" for k in keys]
    runtime, version = RUNTIMES[s.sc["lang"]]
    version = s.pick(version)
    bits.insert(s.rng.randrange(len(bits) + 1), f"CI pins {runtime} `{version}`")
    style = s.rng.randrange(3)
    if style == 0:
        extra = "Constraints:\n" + "".join(f"- {b}\n" for b in bits) + f"- use {lib} for {purpose}, not {alts[0]}"
    elif style == 1:
        extra = f"For context: {'; '.join(bits)}. We standardised on {lib} for {purpose} last quarter, keep it."
    else:
        extra = f"Keep in mind that {', '.join(bits[:-1])}, and {bits[-1]}. Use {lib} for {purpose}."
    if opener is None:
        opener = s.sc["opener"] = fill(s.pick(OPENERS[s.sc["task"]]), s.sc)
    t = s.add("user", opener + "\n\n" + extra)
    for k in keys:
        setting_fact(s, k, t)
    s.fact(
        "decision",
        "runtime",
        f"Which {runtime} version does CI pin for {s.sc['project']}?",
        f"CI pins {runtime}",
        version,
        [v for v in RUNTIMES[s.sc["lang"]][1] if v != version][:1] + RUNTIME_GUESSES[s.sc["lang"]],
        t,
        4,
    )
    s.fact(
        "decision",
        "library",
        f"Which library does {s.sc['project']} use for {purpose}?",
        f"For {purpose}, {s.sc['project']} uses",
        lib,
        alts,
        t,
        4,
    )


def scene_config_write(s: Session):
    """The agent writes the config file; it restates the known settings and decides three more (six in long
    mode, which changes more settings later)."""
    new = s.pick([k for k in setting_keys(s) if k not in s.values], 6 if s.sc.get("long") else 3)
    for k in new:
        s.values[k] = draw_value(s, k)
    path = fill(s.lang["cfg"], s.sc)
    content = render_config(s.lang["fmt"], sorted((k, v) for k, v in s.values.items() if k != "lib"))
    why = s.pick(
        [
            "Writing the settings file first",
            "One file for every knob, so the loader stays trivial",
            "Putting everything into the config before touching code",
        ]
    )
    t = s.act(
        f"{why}. New entries: " + ", ".join(f"{k} `{s.values[k]}`" for k in new) + ".",
        "write_file",
        {"path": path, "content": content},
        f"wrote {len(content)} bytes to {path}",
    )
    for k in new:
        setting_fact(s, k, t - 1)


def scene_ask(s: Session):
    """The agent asks the user to choose; the answer is a decision."""
    n, p = s.sc["noun"], s.sc["project"]
    ports = s.pick([9187, 9264, 9471, 9318, 9523], 2)
    options = [
        (
            "metrics-port",
            "Which port should the metrics endpoint use?",
            "The metrics endpoint uses port",
            [str(x) for x in ports],
            ["9090", "9100", "8081"],
        ),
        (
            "fixtures-dir",
            "Where do the golden test fixtures live?",
            "The golden fixtures live in",
            [f"testdata/{n}-golden", f"fixtures/{n}-snapshots"],
            ["tests/fixtures", "testdata", "spec/fixtures"],
        ),
        (
            "flag-env",
            "Which environment variable toggles the new code path?",
            "The new code path is toggled by",
            [f"{p.upper()}_{x}" for x in s.pick(["FAST_PATH", "NEW_LEDGER", "V2_READER", "STRICT_SEQ"], 2)],
            ["FEATURE_FLAG", "ENABLE_V2", "DEBUG"],
        ),
        (
            "lock-path",
            "Which lock file prevents two runs at once?",
            "The lock file is",
            [f"/run/{p}/{n}-sync.lock", f"/var/lib/{p}/leader.lock"],
            ["/tmp/app.lock", "/var/lock/app.lock", ".lock"],
        ),
    ]
    options = [o for o in options if o[0] not in s.sc["used"]]
    for slug, question, prefix, (value, alt), wrong in s.pick(options, min(len(options), s.rng.choice([1, 2]))):
        s.sc["used"].add(slug)
        s.add(
            "assistant",
            s.pick(
                [
                    "Quick question before I continue: ",
                    "One decision I need from you: ",
                    "I can't infer this from the repo. ",
                    "Before I wire this up: ",
                ]
            )
            + question,
        )
        t = s.add(
            "user",
            s.pick(
                [
                    f"`{value}`.",
                    f"Use `{value}`, that's what ops expects.",
                    f"Go with `{value}` — it's already in the runbook.",
                    f"We settled that last sprint: `{value}`. Don't invent a new one.",
                ]
            ),
        )
        if s.rng.random() < 0.45:  # the user corrects the answer right away: a change
            s.add("assistant", s.pick(["OK, wiring that in.", f"Using `{value}`.", "Thanks."]))
            t = s.add(
                "user",
                s.pick(
                    [
                        f"Sorry, I misread the runbook: it's `{alt}`, not `{value}`.",
                        f"Scratch that, `{value}` is taken on the new hosts. Use `{alt}`.",
                    ]
                ),
            )
            s.fact("change", slug, question, prefix, alt, [value] + wrong, t, 5)
        else:
            s.fact("decision", slug, question, prefix, value, wrong, t, 5)


def scene_plan(s: Session):
    """A long assistant explanation that fixes a branch name, a metric name and a migration file."""
    if "plan" in s.sc["used"]:
        return
    s.sc["used"].add("plan")
    n, p = s.sc["noun"], s.sc["project"]
    branch = f"fix/{n}-{s.pick(['rollover', 'dedupe', 'drift', 'lease'])}-{s.rng.randrange(210, 990)}"
    metric = f"{p}_{n}_{s.pick(['reconcile', 'flush', 'replay'])}_seconds"
    mig = f"{s.rng.randrange(11, 99):04d}_{n}_{s.pick(['cents', 'seq_guard', 'lease_idx'])}"
    if s.rng.random() < 0.5:
        text = (
            f"Plan before I write code. I'll work on the branch `{branch}` so CI picks up the fix pipeline. "
            f"The slow path gets a histogram, `{metric}`, exported next to the existing counters; alerts can "
            f"key off its p99 later. Data needs one schema change, in migration `{mig}`, which is reversible "
            "and touches only the new column. Existing rows are backfilled lazily on read, so the migration "
            "stays fast and does not lock the table."
        )
    else:
        text = (
            f"Here is how I'd like to proceed, tell me if you disagree:\n1. Branch `{branch}` off main.\n"
            f"2. Schema change in migration `{mig}`; reversible, nullable column, lazy backfill.\n3. Emit "
            f"`{metric}` around the hot loop so we can compare before/after in Grafana.\n4. Only then touch "
            "the algorithm itself."
        )
    s.add("assistant", text)
    t = len(s.messages) - 1
    wrong = ["main", f"feature/{n}", f"fix/{n}"]
    if s.rng.random() < 0.5:  # the user renames the branch: a change
        stale, branch = branch, f"{p[:3].upper()}-{s.rng.randrange(1200, 4999)}-{n}-fix"
        u = s.add(
            "user",
            f"Fine, but call the branch `{branch}` instead of `{stale}`; branches must start with "
            "the ticket id or the merge bot ignores them.",
        )
        s.fact(
            "change",
            "branch",
            "Which branch does the agent work on?",
            "The work happens on the branch",
            branch,
            [stale] + wrong,
            u,
            5,
        )
        s.add("assistant", s.pick(["Renamed.", f"Done, now on `{branch}`.", "Sure, renamed the branch."]))
    else:
        s.fact(
            "decision",
            "branch",
            "Which branch does the agent work on?",
            "The work happens on the branch",
            branch,
            wrong,
            t,
            5,
        )
    s.fact(
        "decision",
        "metric",
        "What is the new histogram metric called?",
        "The new histogram is",
        metric,
        [f"{n}_duration_seconds", "http_request_duration_seconds", f"{p}_latency_ms"],
        t,
        5,
    )
    s.fact(
        "decision",
        "migration",
        "What is the schema migration called?",
        "The migration is",
        mig,
        ["0001_initial", f"0002_{n}", "add_column"],
        t,
        5,
    )


# ---- scenes: changes -----------------------------------------------------------------------------------------


def scene_change(s: Session):
    """A user interruption, a review comment or the agent's own second thought changes one or two settings."""
    keys = [k for k in sorted(s.values) if k != "lib" and k not in s.changed]
    if not keys:
        return
    keys = s.pick(keys, min(len(keys), s.rng.choice([1, 2, 2, 2])))
    old = {k: s.values[k] for k in keys}
    for k in keys:
        s.values[k] = draw_value(s, k, avoid=[old[k]])
        s.changed.add(k)
    path, fmt = fill(s.lang["cfg"], s.sc), s.lang["fmt"]
    style = s.rng.randrange(4)
    if style == 3 and s.sc.get("long"):
        style = 0  # a full rewrite restates every setting; long mode keeps early values far back for late changes
    if style == 0:
        t = s.add(
            "user",
            "Wait, before you go on: change "
            + " and ".join(f"{k} from `{old[k]}` to `{s.values[k]}`" for k in keys)
            + ". Ops asked for it.",
        )
        cmd = " && ".join(f"sed -i 's|{old[k]}|{s.values[k]}|' {path}" for k in keys)
        s.act(
            s.pick(ACKS) + " Updating the config.",
            "bash",
            {"command": f"{cmd} && grep -nE '{'|'.join(keys)}' {path}"},
            "\n".join(f"{3 + i}:{config_line(fmt, k, s.values[k])}" for i, k in enumerate(keys)),
        )
    elif style == 1:
        t = s.add(
            "user",
            "Review comment from the team lead: please set "
            + "; set ".join(f"{k} to `{s.values[k]}` (not `{old[k]}`)" for k in keys)
            + ".",
        )
        s.add(
            "assistant",
            s.pick(ACKS)
            + " "
            + ", ".join(f"{k} is now `{s.values[k]}`" for k in keys)
            + "; the old value stays in the changelog only.",
        )
    elif style == 2:
        whys = [
            "doesn't match what staging uses",
            "contradicts the runbook",
            "was copied from the old deploy",
            "is not what the on-call dashboard assumes",
        ]
        t = s.add(
            "assistant",
            s.pick(["On second thought, ", "Correction to what I wrote above: ", "Hmm, wait. "])
            + "; ".join(f"{k} `{old[k]}` {s.pick(whys)}, so I'm changing it to `{s.values[k]}`" for k in keys)
            + ".",
        )
    else:
        t = s.add(
            "user",
            "Ops replied: "
            + " ".join(
                f"{SETTING[k][1].capitalize()} `{old[k]}` won't work on the new cluster, make it `{s.values[k]}`."
                for k in keys
            ),
        )
        content = render_config(fmt, sorted((k, v) for k, v in s.values.items() if k != "lib"))
        s.act(
            "Rewriting the config with their values.",
            "write_file",
            {"path": path, "content": content},
            f"wrote {len(content)} bytes to {path}",
        )
    for k in keys:
        setting_fact(s, k, t, "change", stale=old[k])


def scene_const_change(s: Session):
    """The agent introduces a code constant, then a measurement makes it change the value."""
    name = s.pick(
        [
            x
            for x in ["MAX_INFLIGHT", "FLUSH_EVERY", "SHARD_COUNT", "LEASE_SLACK_MS", "SPILL_THRESHOLD"]
            if x not in s.sc["used"]
        ]
    )
    s.sc["used"].add(name)
    if s.sc["lang"] == "go":
        name = name.title().replace("_", "")
        name = name[0].lower() + name[1:]
    a, b = s.pick([37, 48, 56, 72, 88, 120, 144, 196, 240], 2)
    src = fill(s.lang["src"], s.sc)
    s.add("assistant", f"Adding a bound in {src}: `{s.lang['const'].format(name=name, v=a)}`")
    slow, fast = s.rng.randrange(300, 900), s.rng.randrange(90, 280)
    out = f"{name}={a}: p99 {slow} ms, {s.rng.randrange(3, 40)} timeouts\n{name}={b}: p99 {fast} ms, 0 timeouts"
    t = s.act("Comparing two values under load.", "bash", {"command": f"make loadtest VARIANTS='{a} {b}'"}, out)
    s.fact(
        "tool_output",
        "loadtest-p99",
        f"What p99 did the load test report for the slower `{name}` variant?",
        "The slower variant's p99 was",
        f"{slow} ms",
        [f"{fast} ms", "500 ms", "250 ms"],
        t,
        4,
    )
    s.fact(
        "tool_output",
        "loadtest-fast",
        f"What p99 did the load test report for `{name}`={b}?",
        "That variant's p99 was",
        f"{fast} ms",
        [f"{slow} ms", "100 ms", "250 ms"],
        t,
        4,
    )
    s.add(
        "assistant",
        f"{a} was too aggressive; settling on `{name}` = {b}.",
        [("bash", {"command": f"sed -i '/{name}/s/{a}/{b}/' {src}"})],
    )
    s.add("tool", "(no output)", name="bash")
    s.fact(
        "change",
        "constant",
        f"What value does `{name}` end up with?",
        f"`{name}` ends up as",
        b,
        [a, b * 2, 64],
        t - 1,
        4,
    )


def scene_bump(s: Session):
    """A dependency pin written, then bumped after the user objects (a change)."""
    lib = s.pick([lib for _, lib, _ in s.lang["libs"] if lib not in s.sc["used"]])
    s.sc["used"].add(lib)
    major = s.rng.randrange(1, 7)
    old = f"{major}.{s.rng.randrange(2, 19)}.{s.rng.randrange(1, 9)}"
    new = f"{major + 1}.{s.rng.randrange(0, 9)}.{s.rng.randrange(1, 9)}"
    s.add("assistant", f"Pinning {lib} to exactly {old} for now; it is the last version our lock file resolved.")
    s.add(
        "user",
        s.pick(
            [
                "No, take the newer major, we need its fixes.",
                "Use the current release instead, security flagged the old one.",
            ]
        ),
    )
    deps = ["quick-xml", "tinyvec", "pin-utils", "fastrand", "smallbitvec", "ryu-js", "itoa-lite", "vsize"]
    dep = s.pick([d for d in deps if d not in s.sc["used"]])
    if s.sc.get("long"):  # long files bump twice; the same "new" dependency twice would contradict itself
        s.sc["used"].add(dep)
    dep_v = f"0.{s.rng.randrange(3, 30)}.{s.rng.randrange(0, 9)}"
    cmd = {
        "python": "uv lock",
        "typescript": "npm install",
        "go": "go mod tidy",
        "rust": "cargo update",
        "java": "mvn -q versions:use-latest-releases",
        "ruby": "bundle lock",
    }[s.sc["lang"]]
    s.add("assistant", f"Bumped the pin: {lib} {old} → {new}. Re-locking.", [("bash", {"command": cmd})])
    t = s.add(
        "tool",
        f"Updating {lib} {old} -> {new}\nAdding {dep} {dep_v} (new transitive dependency)\n"
        f"Locked {s.rng.randrange(40, 190)} packages",
        name="bash",
    )
    s.fact(
        "change",
        "pin",
        f"Which version of {lib} is pinned in the end?",
        f"{lib} is pinned to",
        new,
        [old] + neighbours_v(new)[:1] + neighbours_v(old)[:1],
        t - 1,
        4,
    )
    s.fact(
        "tool_output",
        "new-dep",
        f"Which new transitive dependency did bumping {lib} pull in?",
        "The new transitive dependency is",
        dep,
        ["serde", "lodash", "six", "zlib"],
        t,
        5,
    )


def neighbours_v(v: str) -> list[str]:
    parts = v.split(".")
    out = []
    for i, d in ((len(parts) - 1, 1), (len(parts) - 1, -1), (0, 1)):
        q = parts[:]
        if q[i].isdigit():
            q[i] = str(max(0, int(q[i]) + d))
        out.append(".".join(q))
    return [x for x in dict.fromkeys(out) if x != v]


def scene_rename(s: Session):
    """Refactor: a function is renamed after review (a change); the agent greps for old uses."""
    n = s.sc["noun"]
    pairs = [
        (ident(s.sc, *a), ident(s.sc, *b))
        for a, b in [
            (("load", n + "s"), ("fetch", n, "page")),
            ((n, "total"), ("sum", n, "cents")),
            (("get", n, "cache"), (n, "cache", "for")),
            (("sync", n + "s"), ("reconcile", n, "batch")),
        ]
    ]
    old, new = s.pick([(a, b) for a, b in pairs if a not in s.sc["used"]])
    s.sc["used"].add(old)
    s.add("assistant", f"I'll keep the public function name `{old}` so callers don't break.")
    t = s.add("user", f"Rename it anyway: `{new}`. We're breaking callers in this release regardless.")
    s.act(
        f"Renaming `{old}` to `{new}` and checking for leftovers.",
        "grep",
        {"pattern": old, "path": "."},
        f"{fill(s.lang['src'], s.sc)}: 0 matches\ndocs/CHANGELOG.md: 1 match (the rename note)",
    )
    s.fact(
        "change",
        "rename",
        f"What is the {n} function called after the review?",
        "The function is now called",
        new,
        [old, ident(s.sc, n, "handler"), ident(s.sc, "process", n + "s")],
        t,
        5,
    )


# ---- scenes: tool outputs ----------------------------------------------------------------------------------


def excerpt_call(s: Session, rel: str, lo: int, hi: int, lines: list):
    path = f"site-packages/{rel}"
    how = s.rng.randrange(3)
    if how == 0:
        return ("bash", {"command": f"sed -n {lo},{hi}p {path}"}), "\n".join(lines)
    if how == 1:
        return (
            ("read_file", {"path": path, "start_line": lo, "end_line": hi}),
            "\n".join(f"{lo + i:>5}  {ln}" for i, ln in enumerate(lines)),
        )
    return (
        ("bash", {"command": f"cat -n {path} | sed -n '{lo},{hi}p'"}),
        "\n".join(f"{lo + i:>6}\t{ln}" for i, ln in enumerate(lines)),
    )


def code_questions(s: Session, facts, turn: int, pkg: str, k: int = 3):
    facts = sorted(facts, key=lambda f: (-f.strength, f.line, f.kind))
    chosen, answers = [], set()
    for f in facts:
        if f.answer not in answers and f.line not in answers and len(chosen) < k:
            chosen.append(f)
            answers.update((f.answer, f.line))
    for f in chosen:
        wrong = list(dict.fromkeys(w for w in f.wrong if w != f.answer))
        head, tail = wrong[:-3] if len(wrong) > 3 else wrong, wrong[-3:] if len(wrong) > 3 else []
        s.rng.shuffle(head)
        s.fact(
            "tool_output", f"{pkg.strip('_')}-{f.kind}", f.question, f.prefix, f.answer, head + tail, turn, f.strength
        )


def scene_read_code(s: Session):
    """The agent reads a real excerpt from site-packages; ast facts become tool_output questions."""
    rel, lo, hi, lines, facts = pick_code_excerpt(s.rng, s.sc["used"])
    pkg = rel.split("/")[0]
    call, out = excerpt_call(s, rel, lo, hi, lines)
    t = s.act(s.pick(READ_REASONS).format(pkg=pkg), call[0], call[1], out)
    code_questions(s, facts, t, pkg)
    after = s.pick(AFTER_READ)
    if after:
        s.add("assistant", after)


def scene_read_two(s: Session):
    """One assistant turn with two tool calls (a source excerpt and a METADATA grep), one combined output."""
    rel, lo, hi, lines, facts = pick_code_excerpt(s.rng, s.sc["used"])
    pkg = rel.split("/")[0]
    call, out = excerpt_call(s, rel, lo, hi, lines)
    if call[0] != "bash":
        call, out = ("bash", {"command": f"sed -n {lo},{hi}p site-packages/{rel}"}), "\n".join(lines)
    info = dist_info(s.pick([d for d in META_DISTS if d not in s.sc["used"]]))
    s.sc["used"].add(info.name.split("-")[0])
    meta = [
        ln
        for ln in info.joinpath("METADATA").read_text(encoding="utf-8").splitlines()
        if ln.startswith(("Name:", "Version:"))
    ][:2]
    grep = {"command": f"grep -E '^(Name|Version):' site-packages/{info.name}/METADATA"}
    s.add(
        "assistant",
        f"Looking at the {pkg} code and at which version of {meta[0].split()[-1]} is installed.",
        [call, ("bash", grep)],
    )
    t = s.add("tool", f"$ {call[1]['command']}\n{out}\n$ {grep['command']}\n" + "\n".join(meta), name="bash")
    code_questions(s, facts, t, pkg, 2)
    dist, version = meta[0].split()[-1], meta[1].split()[-1]
    s.fact(
        "tool_output",
        "installed",
        f"Which version of {dist} is installed in the venv?",
        f"The installed {dist} is version",
        version,
        neighbours_v(version),
        t,
        4,
    )


def scene_read_config(s: Session):
    """The agent reads real dist-info or style files: version pins, entry points, style values."""
    how = s.rng.randrange(3)
    if how == 0:
        dist = s.pick([d for d in META_DISTS if d not in s.sc["used"]])
        s.sc["used"].add(dist)
        info = dist_info(dist)
        lines = info.joinpath("METADATA").read_text(encoding="utf-8").splitlines()
        keep = [
            (i + 1, ln)
            for i, ln in enumerate(lines)
            if ln.startswith(("Version:", "Requires-Dist:")) and "extra ==" not in ln
        ][:6]
        t = s.act(
            f"Which versions does the installed {dist} require?",
            "bash",
            {"command": f"grep -nE '^(Version|Requires-Dist):' site-packages/{info.name}/METADATA | head -6"},
            "\n".join(f"{i}:{ln}" for i, ln in keep),
        )
        version = keep[0][1].split()[-1]
        s.fact(
            "tool_output",
            "installed",
            f"Which version of {dist} is installed in the venv?",
            f"The installed {dist} is version",
            version,
            neighbours_v(version),
            t,
            4,
        )
        pins = [
            (ln.split()[1].split(">")[0].split("=")[0].split("(")[0], m.group(1))
            for _, ln in keep[1:]
            if (m := re.search(r">=\s*([\d.]+)", ln))
        ]
        for name, low in s.pick(pins, min(2, len(pins))):
            s.fact(
                "tool_output",
                "pin-min",
                f"What minimum version of {name} does the installed {dist} require?",
                f"{dist} requires {name} at least",
                low,
                neighbours_v(low),
                t,
                4,
            )
    elif how == 1:
        dist = s.pick(ENTRY_DISTS)
        info = dist_info(dist)
        text = info.joinpath("entry_points.txt").read_text(encoding="utf-8").strip()
        t = s.act(
            "Where does the console script point?",
            "bash",
            {"command": f"cat site-packages/{info.name}/entry_points.txt"},
            text,
        )
        name, target = s.pick(re.findall(r"^([\w-]+) ?= ?([\w.]+:\w+)$", text, re.M))
        mod = target.split(":")[0]
        s.fact(
            "tool_output",
            "entry-point",
            f"What does the `{name}` console script point to?",
            f"`{name}` points to",
            target,
            [f"{mod}:run", f"{name.replace('-', '_')}.__main__:main", f"{mod.split('.')[0]}.cli:app"],
            t,
            5,
        )
    else:
        styles = sorted(
            p
            for p in (SITE / "matplotlib/mpl-data/stylelib").glob("*.mplstyle")
            if p.stat().st_size < 700 and not p.name.startswith("_")
        )
        p = s.pick(styles)
        body = [ln for ln in p.read_text(encoding="utf-8").splitlines() if ln.strip() and not ln.startswith("#")]
        t = s.act(
            f"Our report plots use the `{p.stem}` style; checking its values.",
            "bash",
            {"command": f"grep -v '^#' site-packages/{p.relative_to(SITE)} | grep ."},
            "\n".join(body),
        )
        pairs = [tuple(x.strip() for x in ln.split(":", 1)) for ln in body if ":" in ln]
        pairs = [
            (k, v)
            for k, v in pairs
            if re.fullmatch(r"[\w.#-]+", v)
            and v not in ("True", "False", "0", "1")
            and sum(v == w for _, w in pairs) == 1
        ]
        for k, v in s.pick(pairs, min(2, len(pairs))):
            others = sorted({w for _, w in pairs if w != v})
            s.fact(
                "tool_output",
                "style",
                f"What value does the `{p.stem}` style set for `{k}`?",
                f"It sets `{k}` to",
                v,
                s.pick(others, min(2, len(others))) + ["white", "black"],
                t,
                4,
            )


def test_names(s: Session, k: int) -> list:
    lang, n = s.sc["lang"], s.sc["noun"]
    out = []
    for ph in s.pick(PHRASES, k):
        w = ph.split()
        camel = "".join(x.capitalize() for x in w)
        out.append(
            {
                "python": f"test_{n}_{'_'.join(w)}",
                "go": f"Test{n.capitalize()}{camel}",
                "rust": f"{n}::tests::{'_'.join(w)}",
                "java": f"{n.capitalize()}ServiceTest.{w[0]}{camel[len(w[0]) :]}",
                "typescript": f"{n} service {ph}",
                "ruby": f"{n} cache {ph}",
            }[lang]
        )
    return out


def scene_tests(s: Session):
    """A failing test run with a specific test name and mismatch, in the project's test runner's format."""
    lang, n = s.sc["lang"], s.sc["noun"]
    names = test_names(s, 4)
    bad, rest = names[0], names[1:]
    want = s.rng.randrange(1100, 9800)
    got = want + s.pick([-1, 3, -100, 7, 41])
    line, passed = s.rng.randrange(120, 480), s.rng.randrange(31, 97)
    if lang == "python":
        out = (
            "\n".join(f"tests/test_{n}s.py::{x} PASSED" for x in rest)
            + f"\ntests/test_{n}s.py::{bad} FAILED\n\nE       assert {got} == {want}\ntests/test_{n}s.py:{line}: "
            f"AssertionError\n=== 1 failed, {passed} passed in 3.41s ==="
        )
    elif lang == "go":
        out = (
            "\n".join(f"--- PASS: {x} (0.00s)" for x in rest) + f"\n--- FAIL: {bad} (0.01s)\n    {n}_test.go:"
            f"{line}: got {got}, want {want}\nFAIL\tgithub.com/acme/{s.sc['project']}/internal/{n}\t0.214s"
        )
    elif lang == "rust":
        out = (
            "\n".join(f"test {x} ... ok" for x in rest) + f"\ntest {bad} ... FAILED\n\n---- {bad} stdout ----\n"
            f"thread '{bad}' panicked at src/{n}.rs:{line}:9:\nassertion `left == right` failed\n  left: {got}\n"
            f" right: {want}\n\ntest result: FAILED. {passed} passed; 1 failed"
        )
    elif lang == "java":
        out = (
            f"[INFO] Running {bad.split('.')[0]}\n[ERROR] {bad}  Time elapsed: 0.041 s  <<< FAILURE!\n"
            f"org.opentest4j.AssertionFailedError: expected: <{want}> but was: <{got}>\n[ERROR] Tests run: "
            f"{passed + 1}, Failures: 1, Errors: 0, Skipped: 0\n[INFO] passed: "
            + ", ".join(x.split(".")[1] for x in rest)
        )
    elif lang == "typescript":
        out = (
            f" FAIL  src/{n}/{n}.service.test.ts\n"
            + "".join(f"  ✓ {x}\n" for x in rest)
            + f"  ✕ {bad}\n\n  ● {bad}\n\n    Expected: {want}\n    Received: {got}\n\nTests: 1 failed, {passed} passed"
        )
    else:
        out = (
            "\n".join(f"  {x} ✓" for x in rest) + f"\nFailures:\n  1) {bad}\n     expected: {want}\n"
            f"          got: {got}\n     # ./spec/{n}_cache_spec.rb:{line}\n{passed + 1} examples, 1 failure"
        )
    if s.rng.random() < 0.5:
        t = s.act("Running the suite.", "run_tests", {"command": s.lang["test"]}, out)
    else:
        t = s.act(
            s.pick(["Let's see what the tests say.", "Baseline test run first."]),
            "bash",
            {"command": s.lang["test"]},
            out,
        )
    s.fact("tool_output", "failing-test", "Which test failed in the test run?", "The failing test was", bad, rest, t, 5)
    s.fact(
        "tool_output",
        "test-got",
        f"What value did the failing test `{bad}` actually get?",
        "The test actually got",
        got,
        [want, got + 2, s.rng.randrange(1100, 9800)],
        t,
        3,
    )
    if lang in ("python", "rust", "typescript"):
        s.fact(
            "tool_output",
            "passed",
            "How many tests passed in that run?",
            "The number of passing tests was",
            passed,
            [passed + 10, 100, 12],
            t,
            2,
        )
    s.fact(
        "tool_output",
        "test-want",
        f"Which value did `{bad}` expect?",
        "The test expected",
        want,
        [got, want * 2, 1000],
        t,
        3,
    )
    scene_fix(s)


def scene_fix(s: Session):
    """A longer assistant explanation of the cause that decides how the fix is done."""
    n = s.sc["noun"]
    helper = ident(
        s.sc, *s.pick([("quantize", n, "cents"), ("clamp", n, "window"), (n, "seq", "guard"), ("normalize", n, "key")])
    )
    flag = s.pick([f"--{n}-audit-strict", f"--replay-{n}s", f"--no-{n}-prefetch"])
    cause = s.pick(
        [
            f"two code paths compute the {n} value independently and one of them rounds before summing, so the "
            "error accumulates across batches",
            f"the {n} cache is keyed by the raw id, so two spellings of one id get separate entries and the stale "
            "one wins after a restart",
            f"the batch loop reuses the buffer of the previous {n} when a batch is empty, so the last value is "
            "counted twice",
        ]
    )
    s.add(
        "assistant",
        f"Found it. The root cause: {cause}. I'll route every caller through one helper, "
        f"`{helper}`, and add a regression test for exactly this case. To verify on staging data I'll run the "
        f"replay with `{flag}`, which re-computes every {n} and prints mismatches instead of writing them. "
        "If the replay is clean I'll open the PR.",
    )
    t = len(s.messages) - 1
    s.fact(
        "decision",
        "helper",
        f"What is the name of the helper every {n} caller now goes through?",
        "The shared helper is called",
        helper,
        [ident(s.sc, "compute", n), ident(s.sc, "round", n), ident(s.sc, n, "utils")],
        t,
        5,
    )
    s.fact(
        "decision",
        "replay-flag",
        "Which flag makes the staging replay print mismatches instead of writing?",
        "The replay runs with",
        flag,
        ["--dry-run", "--verbose", "--check"],
        t,
        5,
    )


def hexid(rng: random.Random, k: int = 7) -> str:
    return "".join(rng.choice("0123456789abcdef") for _ in range(k))


def scene_git(s: Session):
    """`git log` with authors: which commit and who touched the code."""
    rows = [(hexid(s.rng), s.pick(AUTHORS), fill(subj, s.sc)) for subj in s.pick(SUBJECTS, 5)]
    out = "\n".join(f"{h} {a:<17} {s.rng.randrange(2, 19)} days ago  {subj}" for h, a, subj in rows)
    t = s.act(
        s.pick(["Checking recent history of this area.", "Who touched this last?"]),
        "bash",
        {"command": f"git log -5 --format='%h %<(17)%an %ar  %s' -- {fill(s.lang['src'], s.sc)}"},
        out,
    )
    i = s.rng.randrange(5)
    s.fact(
        "tool_output",
        "commit",
        f"Which commit's subject is '{rows[i][2]}'?",
        "That commit is",
        rows[i][0],
        [r[0] for r in rows if r[0] != rows[i][0]],
        t,
        5,
    )
    k = (i + 3) % 5
    s.fact(
        "tool_output",
        "commit",
        f"Which commit's subject is '{rows[k][2]}'?",
        "That commit is",
        rows[k][0],
        [r[0] for r in rows if r[0] != rows[k][0]],
        t,
        5,
    )
    j = (i + 2) % 5
    s.fact(
        "tool_output",
        "author",
        f"Who authored the commit '{rows[j][2]}'?",
        "It was authored by",
        rows[j][1],
        [a for a in dict.fromkeys(r[1] for r in rows) if a != rows[j][1]] + ["John Smith"],
        t,
        4,
    )


def scene_ci(s: Session):
    """A CI job log excerpt: the job, the cache key and the exit code."""
    code = s.pick([137, 143, 124, 125, 134])
    jobs = ["integration", "e2e-smoke", "contract-tests", "unit-tests"]
    job = s.pick(jobs)
    key = f"{s.sc['lang']}-deps-{hexid(s.rng, 10)}"
    image = f"2024{s.rng.randrange(10, 13)}{s.rng.randrange(10, 28)}.{s.rng.randrange(2, 9)}"
    out = (
        f"Job: {job} (shard {s.rng.randrange(2, 7)}/8)\nRunner: ubuntu-22.04 (image {image})\n"
        f"Cache restored from key: {key}\nRun {s.lang['test']}\n  ...\n"
        f"Error: Process completed with exit code {code}."
    )
    t = s.act("Pulling the failing CI job log.", "bash", {"command": "gh run view --log-failed | tail -6"}, out)
    s.fact(
        "tool_output",
        "exit-code",
        "With which exit code did the failing CI job end?",
        "The CI job ended with exit code",
        code,
        ["1", "2", "127"],
        t,
        3,
    )
    s.fact(
        "tool_output",
        "cache-key",
        "Which cache key did the CI job restore?",
        "It restored the cache key",
        key,
        [f"{s.sc['lang']}-deps-{hexid(s.rng, 10)}", f"{s.sc['lang']}-deps-latest", "Linux-deps-main"],
        t,
        5,
    )
    s.fact(
        "tool_output",
        "runner-image",
        "Which runner image version did the failing CI job use?",
        "The runner image version was",
        image,
        [f"{image[:-1]}{int(image[-1]) + 1}", "20240101.1", "latest"],
        t,
        4,
    )
    s.fact(
        "tool_output", "ci-job", "Which CI job failed?", "The failing job was", job, [x for x in jobs if x != job], t, 3
    )


def scene_profile(s: Session):
    """A profiler output in the project's language: the hottest function and its time."""
    lang, n = s.sc["lang"], s.sc["noun"]
    stems = s.pick(["split_fields", "decode_row", "hash_key", "strip_bom", "merge_runs", "check_seq"], 4)
    camel = [x.split("_")[0] + x.split("_")[1].capitalize() for x in stems]
    funcs = {
        "python": [f"_{x}" for x in stems],
        "go": [f"internal/{n}.{c}" for c in camel],
        "rust": [f"{s.sc['project']}::{n}::{x}" for x in stems],
        "java": [f"com.acme.{n}.{n.capitalize()}Parser.{c}" for c in camel],
        "typescript": camel,
        "ruby": [f"{n.capitalize()}Cache#{x}" for x in stems],
    }[lang]
    times = sorted((round(s.rng.uniform(0.4, 9.9), 3) for _ in funcs), reverse=True)
    cmd = {
        "python": "python -m cProfile -s cumtime",
        "go": "go tool pprof -top",
        "rust": "perf report --stdio",
        "java": "asprof -d 30 -o flat",
        "typescript": "node --cpu-prof",
        "ruby": "stackprof",
    }[lang]
    calls = [s.rng.randrange(9000, 99999) for _ in funcs]
    out = "   ncalls  cumtime  function\n" + "\n".join(
        f"{c:>9}  {tm:>7.3f}  {f}" for c, f, tm in zip(calls, funcs, times)
    )
    t = s.act("Profiling one large input.", "bash", {"command": f"{cmd} ... fixtures/{n}s-large.bin | head -5"}, out)
    s.fact(
        "tool_output",
        "hot-function",
        "Which function had the highest cumulative time in the profile?",
        "The hottest function was",
        funcs[0],
        funcs[1:],
        t,
        5,
    )
    s.fact(
        "tool_output",
        "hot-time",
        f"What cumulative time did `{funcs[0]}` show in the profile?",
        f"`{funcs[0]}` took",
        f"{times[0]:.3f}",
        [f"{times[1]:.3f}", f"{times[0] / 2:.3f}", "1.000"],
        t,
        3,
    )
    s.fact(
        "tool_output",
        "ncalls",
        f"How many calls to `{funcs[1]}` did the profile count?",
        f"`{funcs[1]}` was called",
        calls[1],
        [calls[0], calls[2], 10000],
        t,
        3,
    )


def scene_summary(s: Session):
    """Closing summary restating final values; in long mode only the late changes, which are near the end anyway
    (restating others would pull their latest evidence to the end)."""
    items = [f"{k} = {v}" for k, v in sorted(s.values.items()) if k != "lib"]
    if s.sc.get("long"):
        items = [f"{k} = {s.values[k]}" for k in s.sc["late"][:2]]
    s.add(
        "assistant",
        s.pick(["Done. Final state:\n", "Wrapping up. Where things stand:\n"])
        + "\n".join(f"- {x}" for x in s.rng.sample(items, min(3, len(items))))
        + s.pick(["\nTests pass locally; the branch is ready for review.", "\nCI is green again."]),
    )


# ---- scenes: long mode only --------------------------------------------------------------------------------


def raw_text(m: dict) -> str:
    """A message's text as `select` and `vkv validate` read it: content plus the serialised tool calls."""
    calls = " ".join(json.dumps({"name": c["name"], "arguments": c["arguments"]}) for c in m.get("tool_calls", []))
    return f"{m['content']} {calls}"


def scene_late_change(s: Session):
    """A setting stated early changes thousands of tokens later, in words that do not repeat the old value, so the
    stale value (in `reject` and among the choices) sits far back."""
    keys = [k for k in sorted(s.values) if k != "lib" and k not in s.changed]
    texts = [raw_text(m) for m in s.messages]
    last = {k: max((i for i, tx in enumerate(texts) if contains_keyword(tx, s.values[k])), default=0) for k in keys}
    keys = [k for k in keys if estimate_tokens(s.messages[last[k] :]) >= 2500]
    if not keys:
        return
    key = min(keys, key=lambda k: (last[k], k))  # the setting whose value was stated longest ago
    old = s.values[key]
    new = s.values[key] = draw_value(s, key, avoid=[old])
    s.changed.add(key)
    s.sc["late"].append(key)
    label, path = SETTING[key][1], fill(s.lang["cfg"], s.sc)
    said = [
        f"Ops finished the capacity review: {label} has to be `{new}` on the new cluster. Please update the config.",
        f"One late change from the platform team: make {label} `{new}`; the value we started with no longer holds.",
        f"Re-reading the deploy notes: {label} must be `{new}` on the new cluster, so I'm changing it in {path}.",
        f"Cross-checking the staging manifests: {label} there is `{new}`. The config should match, so I'm changing "
        f"it in {path}.",
    ]
    i = s.pick([i for i in range(len(said)) if f"late-{i}" not in s.sc["used"]])  # no phrasing twice per file
    s.sc["used"].add(f"late-{i}")
    t = s.add("user" if i < 2 else "assistant", said[i])
    ack = s.pick(ACKS) if i < 2 else "Applying it."
    line = config_line(s.lang["fmt"], key, new)
    s.act(
        ack,
        "bash",
        {"command": f"sed -i '/{key}/c\\{line}' {path} && grep -n '{key}' {path}"},
        f"{s.rng.randrange(2, 14)}:{line}",
    )
    setting_fact(s, key, t, "change", stale=old, strength=6)


def scene_pods(s: Session):
    """`kubectl get pods` on staging: one pod crash-loops; its name, restart count and node are asked about."""
    p = s.sc["project"]
    roles = s.pick(["api", "worker", "scheduler", "ingest", "reaper", "gateway"], 4)
    pods = [f"{p}-{r}-{hexid(s.rng, 9)}-{''.join(s.pick('bcdfghjklmnpqrstvwxz2456789', 5))}" for r in roles]
    nodes = [f"ip-10-{s.rng.randrange(16, 64)}-{s.rng.randrange(1, 255)}-{s.rng.randrange(1, 255)}" for _ in roles]
    bad, restarts = s.rng.randrange(4), s.rng.randrange(14, 60)
    rows = [
        f"{pod:<40} {'0/1' if i == bad else '1/1'}   {'CrashLoopBackOff' if i == bad else 'Running':<17} "
        f"{restarts if i == bad else s.pick(['0', '0', '1']):<9} {s.rng.randrange(2, 9)}d   {node}"
        for i, (pod, node) in enumerate(zip(pods, nodes))
    ]
    t = s.act(
        s.pick(["Checking the staging pods.", "Is anything unhealthy on staging?"]),
        "bash",
        {"command": f"kubectl -n {p}-staging get pods -o wide | awk '{{print $1,$2,$3,$4,$5,$7}}' | column -t"},
        f"{'NAME':<40} READY STATUS            RESTARTS  AGE  NODE\n" + "\n".join(rows),
    )
    others = pods[:bad] + pods[bad + 1 :]
    s.fact(
        "tool_output",
        "crash-pod",
        "Which staging pod was crash-looping?",
        "The crash-looping pod was",
        pods[bad],
        others,
        t,
        5,
    )
    s.fact(
        "tool_output",
        "crash-restarts",
        "How many restarts had the crash-looping pod accumulated?",
        "It had restarted",
        restarts,
        [restarts + 3, 5, 12],
        t,
        3,
    )
    s.fact(
        "tool_output",
        "crash-node",
        "Which node was the crash-looping pod running on?",
        "It was running on",
        nodes[bad],
        nodes[:bad] + nodes[bad + 1 :],
        t,
        5,
    )


def scene_health(s: Session):
    """The staging health check: the failing component, the build, Retry-After and the request id."""
    p, n = s.sc["project"], s.sc["noun"]
    parts = s.pick([f"{n}-store", f"{n}-index", "session-cache", "queue-consumer", "auth-proxy"], 3)
    month, day, rc = s.rng.randrange(1, 12), s.rng.randrange(1, 28), s.rng.randrange(2, 9)
    build = f"2024.{month}.{day}-rc{rc}"
    builds = [f"2024.{month}.{day}-rc{rc + 1}", f"2024.{month}.{day + 1}-rc{rc}", f"2024.{month + 1}.{day}-rc{rc}"]
    retry, rid = s.pick([17, 23, 41, 47, 75, 95]), hexid(s.rng, 16)
    body = {"status": "degraded", "failing": [parts[0]], "ok": parts[1:], "build": build}
    t = s.act(
        "Hitting the staging health endpoint directly.",
        "bash",
        {"command": f"curl -si https://staging.{p}.internal/healthz"},
        f"HTTP/2 503\ncontent-type: application/json\nretry-after: {retry}\nx-request-id: {rid}\n\n" + json.dumps(body),
    )
    s.fact(
        "tool_output",
        "health-failing",
        "Which component did the staging health check report as failing?",
        "The failing component was",
        parts[0],
        parts[1:] + ["database"],
        t,
        5,
    )
    s.fact(
        "tool_output",
        "health-build",
        "Which build did the staging health check report?",
        "It reported build",
        build,
        builds,
        t,
        4,
    )
    s.fact(
        "tool_output",
        "retry-after",
        "What Retry-After value did the staging health check send?",
        "The Retry-After value was",
        retry,
        ["30", "60", "120"],
        t,
        3,
    )
    s.fact(
        "tool_output",
        "request-id",
        "Which request id came back from the staging health check?",
        "The request id was",
        rid,
        [hexid(s.rng, 16), hexid(s.rng, 16)],
        t,
        5,
    )


def scene_query(s: Session):
    """A status count query against the database: which status holds how many rows."""
    n = s.sc["noun"]
    statuses = s.pick(["settled", "queued", "stalled", "reversed", "expired", "on_hold", "voided"], 4)
    counts = sorted((s.rng.randrange(40, 60000) for _ in statuses), reverse=True)
    rows = "\n".join(f" {st:<10} | {c:>6}" for st, c in zip(statuses, counts))
    t = s.act(
        f"How many {n}s sit in each status right now?",
        "bash",
        {"command": f'psql -c "select status, count(*) from {n}s group by 1 order by 2 desc"'},
        f"   status   | count\n------------+--------\n{rows}\n({len(statuses)} rows)",
    )
    for i in s.pick(range(1, 4), 2):
        s.fact(
            "tool_output",
            "status-count",
            f"How many {n}s did the status query count as `{statuses[i]}`?",
            f"The `{statuses[i]}` count was",
            counts[i],
            [c for c in counts if c != counts[i]],
            t,
            4,
        )
    s.fact(
        "tool_output",
        "top-status",
        f"Which status held the most {n}s in the status query?",
        "The most common status was",
        statuses[0],
        statuses[1:],
        t,
        4,
    )


def scene_alerting(s: Session):
    """The user fixes how the change is alerted on: the channel, the firing window and the runbook."""
    p, n = s.sc["project"], s.sc["noun"]
    channel = f"{p}-{s.pick(['pager', 'oncall-eu', 'sev2', 'night-watch'])}"
    minutes = f"{s.pick([7, 9, 13, 17, 22])} minutes"
    runbook = f"docs/runbooks/{n}-{s.pick(['backlog', 'stall', 'drift', 'replay'])}.md"
    s.add("assistant", "Should this get an alert before it ships, and if so where should it go?")
    t = s.add(
        "user",
        s.pick(
            [
                f"Yes. Alerts go to the Slack channel `{channel}`, firing when the {n} backlog stays high for "
                f"{minutes}, and the alert links the runbook `{runbook}`.",
                f"Route it to `{channel}`. Fire after {minutes} of backlog, not on the first spike, and point the "
                f"alert at `{runbook}`; on-call knows that page.",
            ]
        ),
    )
    s.add("assistant", s.pick(["Adding the rule to the alerts file.", "Will do; the alert rule goes in with the PR."]))
    s.fact(
        "decision",
        "alert-channel",
        "Which Slack channel gets the new alert?",
        "The alert goes to",
        channel,
        ["alerts", "oncall", "incidents"],
        t,
        5,
    )
    s.fact(
        "decision",
        "alert-window",
        f"For how long must the {n} backlog stay high before the alert fires?",
        "The alert fires after",
        minutes,
        ["5 minutes", "10 minutes", "15 minutes"],
        t,
        4,
    )
    s.fact(
        "decision",
        "runbook",
        "Which runbook does the alert link to?",
        "The alert links",
        runbook,
        ["docs/runbook.md", "RUNBOOK.md", "docs/oncall.md"],
        t,
        5,
    )


def scene_rollout(s: Session):
    """The agent proposes a rollout; the user picks the canary group and the day."""
    days = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday"]
    groups = [f"canary-{c}-{s.rng.randrange(2, 9)}" for c in s.pick(["ams", "fra", "syd", "yul", "gru", "icn"], 2)]
    day = s.pick(days[1:4])
    s.add(
        "assistant",
        f"For the rollout I'd start with one canary group, either `{groups[0]}` or `{groups[1]}`, watch it for a "
        "day and then go wide. Which group, and which day do you want it to start?",
    )
    t = s.add("user", f"`{groups[1]}`, it has the noisier traffic. Start on {day}; nobody deploys on Fridays here.")
    s.fact(
        "decision",
        "canary",
        "Which canary group does the rollout start with?",
        "The rollout starts with",
        groups[1],
        [groups[0], "canary", "staging"],
        t,
        5,
    )
    s.fact(
        "decision",
        "rollout-day",
        "On which weekday does the rollout start?",
        "The rollout starts on",
        day,
        [d for d in days if d != day][:3],
        t,
        3,
    )


# ---- assembling a transcript ------------------------------------------------------------------------------------

REQUIRED = [
    scene_change,
    scene_change,
    scene_change,
    scene_const_change,
    scene_read_two,
    scene_read_config,
    scene_tests,
    scene_ask,
]
OPTIONAL = [
    scene_read_code,
    scene_plan,
    scene_ask,
    scene_git,
    scene_profile,
    scene_ci,
    scene_bump,
    scene_rename,
    scene_read_code,
    scene_plan,
    scene_bump,
    scene_rename,
]


LONG_BODY = [  # each scene whose questions are generic ("Which CI job failed?") runs at most once per file
    scene_change,
    scene_change,
    scene_change,
    scene_const_change,
    scene_const_change,
    scene_read_two,
    scene_read_two,
    scene_read_config,
    scene_read_config,
    scene_read_code,
    scene_read_code,
    scene_tests,
    scene_ask,
    scene_ask,
    scene_plan,
    scene_git,
    scene_profile,
    scene_ci,
    scene_bump,
    scene_bump,
    scene_rename,
    scene_pods,
    scene_health,
    scene_query,
    scene_alerting,
    scene_rollout,
]
LONG_TOKENS = (6000, 7200)  # estimated; rendered counts must stay within 5,600-7,400 (long files render ~4% fewer)
FAR = 2250  # estimated tokens after a question's latest evidence for it to count as >= 2,048 rendered tokens back


def opening(s: Session):
    """The system message and the user's request (a CI failure starts from the failing job's log)."""
    sc = s.sc
    s.add(
        "system",
        f"You are a coding agent in the {sc['project']} repository ({sc['lang']}). Tools: bash, read_file, "
        "write_file, grep, run_tests. Python packages are under site-packages/.",
    )
    if sc["task"] == "CI failure":
        sc["opener"] = fill(s.rng.choice(OPENERS[sc["task"]]), sc)
        s.add("user", sc["opener"])
        scene_ci(s)
        scene_request(s, opener="Some context before you touch anything.")
    else:
        scene_request(s)


def draft(index: int, seed: int, attempt: int) -> tuple[Session, int]:
    split, slug, task, lang, project, noun = SCENARIOS[index]
    rng = random.Random(seed * 100_000 + index * 100 + attempt)
    s = Session(rng, {"project": project, "noun": noun, "lang": lang, "task": task, "used": set()})
    opening(s)
    optional = [f for f in OPTIONAL if not (f is scene_ci and task == "CI failure")]
    body = REQUIRED + rng.sample(optional, rng.randrange(4, 8))
    rng.shuffle(body)
    body.insert(rng.randrange(0, 2), scene_config_write)
    target = rng.randrange(1700, 2050)
    for scene in body:  # required scenes always run, optional ones while the budget lasts
        if scene in REQUIRED or scene is scene_config_write or estimate_tokens(s.messages) < target - 150:
            scene(s)
    scene_summary(s)
    return s, target


def draft_long(index: int, seed: int, attempt: int) -> tuple[Session, int]:
    """The body scenes in a shuffled order while the budget lasts, then fresh code reads, and two late changes to
    settings stated early: one ~1,500 tokens before the end, one just before the summary."""
    split, slug, task, lang, project, noun = LONG_SCENARIOS[index]
    rng = random.Random(seed * 100_000 + 50_000 + index * 100 + attempt)  # apart from the short files' seeds
    target = rng.randrange(6150, 6750)
    sc = {"project": project, "noun": noun, "lang": lang, "task": task, "used": set(), "long": True}
    s = Session(rng, sc | {"late": [], "target": target})
    opening(s)
    body = [f for f in LONG_BODY if not (f is scene_ci and task == "CI failure")]
    rng.shuffle(body)
    body.insert(rng.randrange(0, 2), scene_config_write)
    for until in (target - 1500, target - 300):
        while estimate_tokens(s.messages) < until:
            (body.pop(0) if body else scene_read_code)(s)  # fresh code reads once the body is spent
        scene_late_change(s)
    scene_summary(s)
    return s, target


def build(index: int, seed: int, long: bool = False) -> dict:
    scenarios, make, (lo, hi) = (LONG_SCENARIOS, draft_long, LONG_TOKENS) if long else (SCENARIOS, draft, (1600, 2220))
    split, slug, task, lang, project, noun = scenarios[index]
    for attempt in range(200):
        s, target = make(index, seed, attempt)
        tokens = estimate_tokens(s.messages)
        questions = select(s, tokens) if lo <= tokens <= hi else None
        if DEBUG:
            print(slug, attempt, tokens, target, [f.kind[0] for f in s.facts], file=sys.stderr)
        if questions:
            break
    else:
        raise RuntimeError(f"{slug}: no draft met the token range and question quotas")
    if long:
        return {
            "id": f"gen-long-{slug}-{index + 1}",
            "description": f"Generated by scripts/make_transcripts.py (seed {seed}, long mode); do not edit by hand. "
            f"A long session: {task} in {project}, a {lang} project. Scenario: {s.sc['opener']} The agent reads "
            "real files from the venv's site-packages next to synthetic test, git, CI, profiler, kubectl, curl and "
            "psql output; settings change along the way, two of them thousands of tokens after they were first "
            "stated, and most answers are stated far from the end.",
            "messages": s.messages,
            "questions": questions,
        }
    return {
        "id": f"gen-{slug}-{index + 1}",
        "description": f"Generated by scripts/make_transcripts.py (seed {seed}); do not edit by hand. "
        f"{task[0].upper() + task[1:]} in {project}, a {lang} project. Scenario: "
        f"{s.sc['opener']} The agent reads real files from the venv's "
        "site-packages next to synthetic test, git, CI and profiler output, and settings "
        "change along the way.",
        "messages": s.messages,
        "questions": questions,
    }


def select(s: Session, tokens: int) -> list | None:
    """Compute source turns, drop unusable candidates, keep a balanced deterministic subset (None if impossible)."""
    good = candidates(s)
    good = keep_long(s, good, tokens) if s.sc.get("long") else keep_short(good, tokens)
    return good and as_questions(good)


def candidates(s: Session) -> list:
    """(fact, wrong choices, source turns) for every candidate that states its answer first where it means to,
    leaks nowhere and whose wrong choices cannot score as correct."""
    texts = [message_text(m) for m in parse_transcript({"id": "x", "messages": s.messages}).messages]
    good = []
    for f in s.facts:
        wrong = [
            w
            for w in dict.fromkeys(f.wrong)
            if w.lower() != f.answer.lower() and not contains_keyword(w, f.answer) and not contains_keyword(f.answer, w)
        ][:3]
        turns = [i for i, tx in enumerate(texts) if contains_keyword(tx, f.answer)]
        ok = (
            len(wrong) >= 2
            and turns
            and turns[0] == f.turn
            and keyword_correct(f.answer, [f.answer], wrong)
            and not contains_keyword(f.question, f.answer)
            and not contains_keyword(f.prefix, f.answer)
        )
        if not ok:
            if DEBUG:
                print("drop", f.kind, f.slug, repr(f.answer), f.turn, turns[:4], wrong, file=sys.stderr)
            continue
        good.append((f, wrong, turns))
    if DEBUG:
        print("good", len(good), {k: sum(g[0].kind == k for g in good) for k in KINDS}, file=sys.stderr)
    return good


def keep_short(good: list, tokens: int) -> list | None:
    want = max(25, min(32, round(tokens / 68)))
    while True:  # drop the weakest candidates of the most common kind until size and balance fit
        counts = {k: sum(g[0].kind == k for g in good) for k in KINDS}
        if len(good) < 25 or (len(good) <= want and min(counts.values()) >= math.ceil(len(good) / 4)):
            break
        kind = max(KINDS, key=lambda k: counts[k])
        good.remove(min((g for g in good if g[0].kind == kind), key=lambda g: (g[0].strength, -g[0].turn)))
    return good if len(good) >= 25 else None


def keep_long(s: Session, good: list, tokens: int) -> list | None:
    """28-40 questions, each kind at least a quarter, and at least half of them with their latest evidence FAR
    tokens or more before the end. Near candidates go first while that half is missing; the late changes (strength
    6) go last, since they are what puts a stale value far back."""
    after, total = [], 0
    for m in reversed(s.messages):  # estimated tokens after each turn
        after.append(total)
        total += estimate_tokens([m])
    after.reverse()
    want = max(30, min(38, round(tokens / 180)))
    if sum(g[0].strength >= 6 for g in good) < 2:  # both late changes must have survived the checks
        return None
    while len(good) >= 28:
        n, counts = len(good), {k: sum(g[0].kind == k for g in good) for k in KINDS}
        far = [after[g[2][-1]] >= FAR for g in good]
        if n <= want and min(counts.values()) >= math.ceil(n / 4) and 2 * sum(far) >= n:
            return good
        short = 2 * sum(far) < n
        i = min(
            range(n),
            key=lambda i: (
                good[i][0].strength >= 6,
                short and far[i],
                counts[good[i][0].kind] <= math.ceil((n - 1) / 4),
                -counts[good[i][0].kind],
                good[i][0].strength,
                -good[i][0].turn,
            ),
        )
        good.pop(i)
    return None


def as_questions(good: list) -> list:
    out, seen = [], {}
    for f, wrong, turns in good:
        seen[f.slug] = seen.get(f.slug, 0) + 1
        out.append(
            {
                "id": f.slug if seen[f.slug] == 1 else f"{f.slug}-{seen[f.slug]}",
                "kind": f.kind,
                "question": f.question,
                "answer_prefix": f.prefix,
                "accept": [f.answer],
                "reject": wrong,
                "choices": [f.answer] + wrong,
                "source_turns": turns,
            }
        )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="transcripts", help="directory holding dev/ and test/")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--check", action="store_true", help="exit 1 if the files on disk differ from what would be written"
    )
    args = ap.parse_args()
    out, differ = Path(args.out), 0
    jobs = [(i, False, out / sc[0]) for i, sc in enumerate(SCENARIOS)]
    jobs += [(i, True, out / "long" / sc[0]) for i, sc in enumerate(LONG_SCENARIOS)]
    for i, long, folder in jobs:
        data = build(i, args.seed, long)
        path = folder / f"{data['id']}.json"
        text = json.dumps(data, indent=1, ensure_ascii=False) + "\n"
        kinds = {k: sum(q["kind"] == k for q in data["questions"]) for k in KINDS}
        if args.check:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                print(f"differs: {path}")
                differ += 1
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        print(
            f"{path}: {len(data['messages'])} messages, ~{estimate_tokens(data['messages'])} tokens (estimate), "
            f"{len(data['questions'])} questions {kinds}"
        )
    if args.check:
        print(f"{differ} file(s) differ" if differ else "all files up to date")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
