"""Session: a running compressed conversation for agent harnesses.

    session = Session(lm, "vkv")                               # or any KV method with a budget (default: am)
    session.append({"role": "user", "content": "..."})        # kept verbatim
    session.compress(turns=(1, 11), ratio=2.0)                # messages 1..10, one segment each
    session.ask("Which library hashes passwords?")            # answered from the running cache
    session.generate("Which library?", do_sample=True)        # or by transformers' generate()
    session.save("s.safetensors"); Session.load("s.safetensors", lm)

The session holds one segment per message (verbatim or compressed) and the token ids of the rendering; no
uncompressed K/V survive a compression, so the cache's memory is proportional to its compressed size.
Online targets need nothing else; oracle targets re-run the full uncompressed history once per compress
call (transient memory and compute proportional to the history). Compression goes forward: the turns to
compress must all come after the last compressed turn, and later verbatim turns are re-encoded on top.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vkv import upgrade
from vkv.compress.autoratio import segment_loss
from vkv.compress.budget import DEFAULT_METHOD, DEFAULT_RATIO, span_budget
from vkv.compress.sequential import append_verbatim
from vkv.compress.turn import Turn
from vkv.errors import VkvError
from vkv.kv.file import cache_metadata, save_cache, trusted_header
from vkv.kv.report import cache_rows, report_totals
from vkv.kv.segment import Segment
from vkv.kv.spliced import SplicedCache
from vkv.lm.context import Context
from vkv.lm.frozen import FrozenLM
from vkv.lm.generate import generate
from vkv.lm.rebuild import load_cache
from vkv.methods import METHODS, Method, get_method
from vkv.methods.base import BudgetMethod
from vkv.text.formats import detect_format, load_conversation
from vkv.text.plain import encode, plain_ranges
from vkv.text.transcript import (
    ChatFormat,
    Message,
    MessageSpan,
    Rendered,
    Transcript,
    followup,
    parse_transcript,
)


class Session:
    def __init__(self, model: FrozenLM, method: Any = None, seed: int = 0):
        """`method`: what `compress()` uses when it is given none: a registered KV method with a budget, by name or
        built (`"kvzip"`, `vkv.get_method("vkv", recipe=vkv.VkvRecipe(...))`); unnamed, Attention Matching
        (DEFAULT_METHOD). `seed`: the seed of the methods that draw one (vkv's recipe holds its own)."""
        if not isinstance(model, FrozenLM):
            raise VkvError(f"Session: field model: expected a model from vkv.load_model(...), got {model!r}")
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise VkvError(f"Session: field seed: expected a whole number of at least 0, got {seed!r}")
        self.method = session_method(DEFAULT_METHOD if method is None else method)  # refused now, not at compress()
        self.seed = seed
        self.lm = model
        self.format = ChatFormat(model.tokenizer)
        self.messages: list[Message] = []
        self.turns: list[Turn] = []
        self.ids: list[int] = []
        self.text = ""
        self.cache = SplicedCache()
        self.continued = False  # holds a compressed transcript's cache (`continuing`), not its own compressions

    # ---- growing the conversation -------------------------------------------------------------------
    def append(self, message: Message | dict) -> Turn:
        """Add one message, kept verbatim: its K/V are computed on top of the running cache."""
        return self.extend([message])[0]

    def extend(self, messages: list[Message | dict] | Transcript | str | Path) -> list[Turn]:
        """Add messages, each kept verbatim; the session changes only if all of them render and feed. `messages`: in
        any format `vkv.load_conversation` reads (a file's path, OpenAI or Anthropic messages, vkv's own dicts or
        Messages)."""
        if isinstance(messages, list) and all(isinstance(m, (Message, dict)) for m in messages):
            vkv_own = all(isinstance(m, Message) for m in messages) or detect_format(messages) == "vkv"
        else:
            vkv_own = False
        if vkv_own:  # each refused by its index in the session
            parsed = [as_message(m, len(self.messages) + i) for i, m in enumerate(messages)]
        else:
            parsed = list(load_conversation(messages).messages)
        turns, ids, text = self._rendering_with(parsed)
        cache = self.cache.fork()
        append_verbatim(self.lm, cache, ids, turns)
        self.messages += parsed
        self.turns += turns
        self.ids, self.text, self.cache = ids, text, cache
        return turns

    def _rendering_with(self, messages: list[Message]) -> tuple[list[Turn], list[int], str]:
        """Turns, ids and text of the conversation with `messages` appended (the session is not changed)."""
        history, turns, ids, text = list(self.messages), [], self.ids, self.text
        for message in messages:
            index = len(history)
            history.append(message)
            chats = [self.format.to_chat(m) for m in history]
            try:
                text = self.format.render_text(chats)
            except Exception as exc:  # jinja raises template-specific errors (e.g. role alternation)
                raise VkvError(f"message {index}: the chat template refused it ({exc})") from exc
            # a message's control-token text stays text, as in `render`: it cannot open a turn of its own
            where = f"message {index}"
            new_ids = encode(self.lm.tokenizer, text, plain_ranges(self.format, chats, text, where), where)
            if new_ids[: len(ids)] != ids or len(new_ids) == len(ids):
                raise VkvError(
                    f"message {index}: the chat template re-renders earlier messages once it is added "
                    "(or renders it to nothing), so the session cannot extend its cache"
                )
            self.lm.check_positions(len(new_ids), f"message {index}", "start a session from fewer messages")
            turns.append(Turn(index, index + 1, message.role, len(ids), len(new_ids)))
            ids = new_ids
        return turns, ids, text

    @classmethod
    def continuing(cls, model: FrozenLM, transcript: Transcript, cache: SplicedCache) -> Session:
        """A session continuing the cache `vkv compress` made of `transcript`. Its cache is not one segment per
        message, so it grows and answers but neither compresses again nor saves as a session."""
        session = cls(model)
        messages = list(transcript.messages)
        session.turns, session.ids, session.text = session._rendering_with(messages)
        session.messages = messages
        if cache.next_position != len(session.ids):
            raise VkvError(
                f"field next_position: the cache continues at token {cache.next_position}, but the transcript "
                f"renders to {len(session.ids)} tokens"
            )
        session.cache = SplicedCache(cache.segments, cache.next_position)
        session.continued = True
        return session

    @property
    def by_messages(self) -> bool:
        """Whether each segment stands for whole messages (one, or a chunk of them) and the session holds its own
        compressions, not a compressed transcript's cache (what compress() and save() need)."""
        return not self.continued and self.segment_messages() is not None

    def segment_messages(self) -> list[tuple[int, int]] | None:
        """The messages [first, last) each segment stands for; None when a segment does not begin and end on
        message boundaries."""
        first = {t.start: t.first for t in self.turns}
        last = {t.end: t.last for t in self.turns}
        spans = [s.span for s in self.cache.segments]
        if any(a not in first or b not in last for a, b in spans):
            return None
        return [(first[a], last[b]) for a, b in spans]

    def compressed_through(self) -> int:
        """The message after the last compressed one (0 when none is): compression goes on from there."""
        covered = zip(self.cache.segments, self.segment_messages() or [])
        return max([0] + [last for segment, (_, last) in covered if segment.compressed])

    def _require_by_messages(self, what: str) -> None:
        if not self.by_messages:
            raise VkvError(
                f"this session continues a compressed transcript's cache, not segments of whole messages, so it "
                f"cannot {what}; start from the transcript instead"
            )

    # ---- compressing ----------------------------------------------------------------------------------
    def compress(
        self,
        turns: tuple[int, int] | None = None,
        ratio: float | None = None,
        method: Any = None,
        on_turn: Callable[[Turn, Segment], None] | None = None,
    ) -> list[Segment]:
        """Compress messages [turns[0], turns[1]) one by one (default: every verbatim message after the last
        compressed one, the leading system message excepted) at `ratio` (default: DEFAULT_RATIO; none with
        auto-ratio, which chooses one per turn). `method`: the session's (None; see Session), or another registered
        KV method with a budget, by name or built (`"kvzip"`, `vkv.get_method("snapkv", head_budget="uniform")`, …),
        each message compressed on the running cache as the method's per-turn mode does it. `on_turn(turn, segment)`
        is called after each message (a progress count)."""
        self._require_by_messages("compress again")
        first, last = self._range(turns)
        method = self.method if method is None else session_method(method)
        if ratio is not None and method.chooses_ratio:
            raise VkvError("this session's method chooses ratios per turn (auto-ratio), so compress() takes no ratio")
        span = self.turns[first:last]
        budget = None if method.chooses_ratio else span_budget(span[-1].end - span[0].start, ratio or DEFAULT_RATIO)
        kept = [s for s in self.cache.segments if s.span[1] <= span[0].start]
        cache = SplicedCache(kept, span[0].start)  # the session changes only on success
        starts, roles = [t.start for t in self.turns], [m.role for m in self.messages]
        segments = method.compress_messages(self.lm, self.ids, span, cache, budget, starts, roles, self.seed, on_turn)
        append_verbatim(self.lm, cache, self.ids, self.turns[last:])
        self.cache = cache
        return segments

    def _range(self, turns: tuple[int, int] | None) -> tuple[int, int]:
        if turns is not None and not is_turn_range(turns):
            raise VkvError(f"field turns: expected (first, last), two message indices, got {turns!r}")
        through = self.compressed_through()
        if turns is None:
            system = 1 if self.messages and self.messages[0].role == "system" else 0
            turns = (max(system, through), len(self.turns))
        first, last = turns
        if not 0 <= first < last <= len(self.turns):
            raise VkvError(f"turns {first}-{last - 1} are empty or outside the session's {len(self.turns)} messages")
        if first < through:
            raise VkvError(f"message {through - 1} is already compressed; compress only messages after it")
        return first, last

    # ---- using the context ---------------------------------------------------------------------------
    def ask(self, question: str, answer_prefix: str = "", max_new_tokens: int = 64) -> str:
        """Greedy answer to a user question continuing the conversation (the session is not changed)."""
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise VkvError(f"ask: field max_new_tokens: expected a whole number of at least 1, got {max_new_tokens!r}")
        answer = Context(self.lm, self.cache).greedy(self.prompt_ids(question, answer_prefix), max_new_tokens)
        return self.lm.tokenizer.decode(answer, skip_special_tokens=True)

    def prompt_ids(self, question: str, answer_prefix: str = "") -> list[int]:
        """The ids that continue the conversation with a user question and the assistant's answer prefix."""
        if not self.turns:
            raise VkvError("the session is empty; append messages before asking")
        for name, value in (("question", question), ("answer_prefix", answer_prefix)):
            if not isinstance(value, str) or (name == "question" and not value.strip()):
                raise VkvError(
                    f"field {name}: expected {'a non-empty' if name == 'question' else 'a'} string, got {value!r}"
                )
        rendered, transcript = self.rendered(), self.transcript()
        return followup(self.lm.tokenizer, rendered, transcript, question, answer_prefix, self.format)[0]

    def generate(self, question: str, answer_prefix: str = "", **generate_kwargs: Any) -> str:
        """An answer from transformers' `generate()` continuing the compressed conversation (sampling, beams,
        streamers: any of its keyword arguments); the session is not changed."""
        answer = generate(self.lm, self.cache, self.prompt_ids(question, answer_prefix), **generate_kwargs)[0]
        return self.lm.tokenizer.decode(answer, skip_special_tokens=True)

    def reply(self, question: str, **generate_kwargs: Any) -> str:
        """Answer a user message with `generate()` and append both to the session (kept verbatim)."""
        answer = self.generate(question, **generate_kwargs).strip()
        self.extend([{"role": "user", "content": question}, {"role": "assistant", "content": answer or "…"}])
        return answer

    def transcript(self) -> Transcript:
        return Transcript("session", tuple(self.messages), ())

    def rendered(self) -> Rendered:
        spans = [MessageSpan(t.first, t.role or "", t.start, t.end) for t in self.turns]
        return Rendered(list(self.ids), spans, self.text)

    def report(self) -> list[dict[str, Any]]:
        """Per message: role, original tokens, entries kept, ratio, loss, verbatim tokens kept."""
        return cache_rows(self.cache)

    @property
    def slots(self) -> int:
        """Slots per KV head the segments hold (head-wise budgets: more than any head reaches)."""
        return self.cache.physical_length

    @property
    def memory_bytes(self) -> int:
        """Bytes of the cache that `ask` and `generate` decode on (each head's entries, their biases and
        per-head offsets; on the model's dtype), from the segments' counts."""
        return report_totals(cache_rows(self.cache, self.lm.dtype))["memory_bytes"]

    @property
    def losses(self) -> list[float | None]:
        """Each segment's V loss (`segment_loss`; None for one that holds no virtual token to measure)."""
        return [segment_loss(s) for s in self.cache.segments]

    # ---- files ------------------------------------------------------------------------------------------
    def save(self, path: str | Path) -> None:
        self._require_by_messages("be saved as a session")
        if not Path(path).parent.is_dir():
            raise VkvError(f"{path}: the directory {Path(path).parent} does not exist")
        meta = cache_metadata(
            self.lm,
            session={
                "messages": [message_dict(m) for m in self.messages],
                "method": self.method.name,
                "method_config": self.method.config(),
                "seed": self.seed,
                "tokens": len(self.ids),
                "ids_sha256": ids_digest(self.ids),
            },
        )
        save_cache(SplicedCache(self.cache.segments, self.cache.next_position, meta), path)

    @classmethod
    def load(cls, path: str | Path, model: FrozenLM, trust_foreign: bool = False) -> Session:
        """Restore a saved session; refuses files of another model, plain caches, re-rendered messages and files not
        signed with this user's key unless `trust_foreign` (vkv.kv.sign)."""
        header = trusted_header(path, trust_foreign)
        if not isinstance(header.get("session"), dict):
            raise VkvError(f"{path}: a vkv cache without a session field, so not a saved session")
        saved = header["session"]
        cache = load_cache(path, model, trust_foreign)
        name, config, seed = upgrade.saved_session(saved)
        if not isinstance(name, str) or name not in METHODS or not isinstance(config, dict):
            raise VkvError(f"{path}: field session.method: expected a registered method's name, got {name!r}")
        session = cls(model, METHODS[name].from_config(config), seed)
        messages = [as_message(m, i) for i, m in enumerate(saved.get("messages", []))]
        session.turns, session.ids, session.text = session._rendering_with(messages)
        session.messages = messages
        if ids_digest(session.ids) != saved.get("ids_sha256"):
            raise VkvError(
                f"{path}: field session.ids_sha256: this model's chat template renders the saved "
                "messages to other tokens than when the session was saved"
            )
        session.cache = SplicedCache(cache.segments, cache.next_position)
        bounds = [0] + [b for s in cache.segments for b in s.span] + [len(session.ids)]
        tiled = bounds[::2] == bounds[1::2] and cache.next_position == len(session.ids)
        if session.segment_messages() is None or not tiled:
            raise VkvError(f"{path}: field segments: the segments do not stand for the session's messages in order")
        return session


def session_method(method: Any) -> Method:
    """The method a session compresses by: a built one as it is, or the registered method `method` names; refused,
    naming the choices, when it cannot compress a session's messages."""
    if isinstance(method, str):
        renamed = upgrade.renamed_method(method)
        if renamed or method not in METHODS:
            choices = ", ".join(n for n, c in METHODS.items() if issubclass(c, BudgetMethod))
            raise VkvError(f"field method: {renamed or f'unknown method {method!r}'}; choose from {choices}")
        method = get_method(method)
    if not isinstance(method, BudgetMethod) or method.question_aware:
        name = getattr(method, "name", repr(method))
        raise VkvError(
            f"method {name!r} cannot compress a session's messages: pass a registered KV method with a budget, "
            "e.g. vkv.get_method('kvzip') (text methods, references and question-aware settings have none)"
        )
    method.check()
    return method


def as_message(message: Message | dict, index: int) -> Message:
    """A validated Message from a Message or a transcript-style dict."""
    if isinstance(message, Message):
        return message
    if not isinstance(message, dict):
        raise VkvError(
            f"message {index}: expected a Message or a dict with role and content, got {type(message).__name__}"
        )
    return parse_transcript({"id": "session", "messages": [message]}, source=f"message {index}").messages[0]


def message_dict(message: Message) -> dict[str, Any]:
    d: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        d["tool_calls"] = [{"name": c.name, "arguments": c.arguments} for c in message.tool_calls]
    if message.name is not None:
        d["name"] = message.name
    return d


def ids_digest(ids: list[int]) -> str:
    return hashlib.sha256(json.dumps(ids).encode()).hexdigest()


def is_turn_range(turns: Any) -> bool:
    """Whether `turns` is (first, last): two whole numbers (messages first..last-1)."""
    return (
        isinstance(turns, (tuple, list))
        and len(turns) == 2
        and all(isinstance(t, int) and not isinstance(t, bool) for t in turns)
    )
