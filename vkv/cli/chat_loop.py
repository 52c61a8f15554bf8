"""`vkv chat`'s conversation: read a line, answer it, keep the exchange; slash commands; leaving cleanly.

On a terminal: readline editing and history ($VKV_HOME/chat_history), answers streamed as they are decoded, Ctrl-C
stops an answer (the session is left as it was before the question) or clears the line, Ctrl-D or /quit leave and
offer to save unsaved exchanges. From a pipe every line is a question and only the answers are printed. Either way an
answer that starts to loop is stopped and only its text up to the loop is kept (vkv.cli.repetition).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

from vkv.cli.consoles import console, errors
from vkv.cli.repetition import RepetitionGuard
from vkv.errors import VkvError
from vkv.home import vkv_home
from vkv.io import check_output
from vkv.progress import counted

COMMANDS = {  # what a line starting with / does (it is never sent to the model)
    "/save FILE": "write the session to FILE (its directory must exist)",
    "/compress": "compress the chat's new messages now (by --method at --ratio, onto the running cache)",
    "/undo": "forget the last exchange (question and answer)",
    "/retry": "ask the last question again (sampled at --temperature, or at 0.7 when greedy)",
    "/help": "list these commands",
    "/quit": "end the chat (also /exit, Ctrl-D or end of input); Ctrl-C stops an answer",
}
RETRY_TEMPERATURE = 0.7


@dataclass
class Snapshot:
    """A session's state before an exchange: /undo puts it back (`extend` and `compress` replace the cache, never
    change it in place)."""

    question: str
    state: dict[str, Any]

    @classmethod
    def of(cls, session, question: str) -> Snapshot:
        state = {name: getattr(session, name) for name in ("messages", "turns", "ids", "text", "cache")}
        return cls(question, {name: list(v) if isinstance(v, list) else v for name, v in state.items()})

    def restore(self, session) -> None:
        for name, value in self.state.items():
            setattr(session, name, list(value) if isinstance(value, list) else value)


@dataclass
class Chat:
    session: Any
    sampling: dict[str, Any]
    interactive: bool
    compress_every: int = 0
    ratio: float = 3.2
    history: list[Snapshot] = field(default_factory=list)
    unsaved: int = 0  # exchanges since the session was opened or last saved
    inputs: dict[str, str] = field(default_factory=dict)  # files the chat read (path → what): /save never replaces one
    opened: int = -1  # messages the session held when the chat opened (-1: read from the session)

    def __post_init__(self) -> None:
        if self.opened < 0:
            self.opened = len(self.session.messages)

    def new_messages(self) -> tuple[int, int]:
        """The messages a running compression takes: those after the ones the chat opened with and after the last
        compressed one, [first, last). Read from the session, so /undo (which restores it) needs no bookkeeping."""
        return max(self.opened, self.session.compressed_through()), len(self.session.messages)

    def compress_new(self) -> None:
        """Compress the new messages onto the running cache, with a count and time left on stderr; Ctrl-C leaves the
        session as it was (compress() replaces the cache only when done)."""
        first, last = self.new_messages()
        if first >= last:
            console.print("no new messages to compress")
            return
        method = self.session.method
        label = f"compressing {last - first} new message(s) by {getattr(method, 'name', method)} at {self.ratio:g}×"
        try:
            with counted(label, last - first) as done:
                self.session.compress((first, last), self.ratio, on_turn=lambda turn, segment: done())
        except KeyboardInterrupt:
            errors.print("\n[yellow]compression stopped[/]; those messages stay verbatim until the next one")

    def run(self) -> int:
        history_file = _readline_history() if self.interactive else None
        try:
            while True:
                try:
                    line = self.read("you> ")
                    if line is None:  # Ctrl-D, or the pipe's end
                        break
                    question = line.strip()
                    if question.startswith("/"):
                        if self.slash_command(question):
                            break
                    elif question:
                        self.exchange(question)
                except KeyboardInterrupt:  # landed between steps (a loaded machine delays it): nothing is half done
                    print("\n(Ctrl-D or /quit leaves)")
            self.offer_to_save()
        finally:
            _save_history(history_file)
        return 0

    def read(self, prompt: str) -> str | None:
        """A line of input (None at its end); Ctrl-C at the prompt clears the line."""
        if not self.interactive:
            return sys.stdin.readline() or None
        while True:
            try:
                return input(prompt)
            except EOFError:
                print()
                return None
            except KeyboardInterrupt:
                print("\n(Ctrl-D or /quit leaves)")

    def exchange(self, question: str, **overrides: Any) -> None:
        """Answer `question` and keep the exchange; Ctrl-C stops the answer and keeps nothing of it."""
        before = None
        try:  # the snapshot too: a Ctrl-C right after the question may land while it is taken
            before = Snapshot.of(self.session, question)
            answer, looped = self.answer(question, **overrides)
            self.session.extend(
                [{"role": "user", "content": question}, {"role": "assistant", "content": answer or "…"}]
            )
            if looped:
                errors.print("[dim](the answer began to repeat itself: stopped, only the text before the loop kept)[/]")
            if not self.interactive:
                print(answer, flush=True)
        except KeyboardInterrupt:
            if before is not None:
                before.restore(self.session)
            errors.print("\n[yellow]answer stopped[/]; the session is as it was before the question")
            return
        self.history.append(before)
        self.unsaved += 1
        first, last = self.new_messages()
        if self.compress_every and last - first >= self.compress_every:
            self.compress_new()

    def answer(self, question: str, **overrides: Any) -> tuple[str, bool]:
        """The answer's text (streamed on a terminal) and whether it was cut at a loop."""
        from transformers import TextStreamer

        from vkv.lm.generate import generate

        session, guard = self.session, RepetitionGuard()
        tokenizer = session.lm.tokenizer
        streamer = TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True) if self.interactive else None
        sampling = {**self.sampling, **overrides}
        ids = generate(
            session.lm,
            session.cache,
            session.prompt_ids(question),
            streamer=streamer,
            stopping_criteria=[guard],
            **sampling,
        )[0]
        kept = ids[: guard.keep] if guard.keep is not None else ids
        return tokenizer.decode(kept, skip_special_tokens=True).strip(), guard.keep is not None

    def slash_command(self, line: str) -> bool:
        """Carry out a /command (True: end the chat); an unknown one is refused, never sent to the model."""
        command, _, rest = line.partition(" ")
        if command in ("/quit", "/exit"):
            return True
        if command == "/help":
            for usage, what in COMMANDS.items():
                console.print(f"{usage}: {what}")
        elif command == "/save":
            self.save(rest.strip())
        elif command == "/compress":
            self.compress_new()
        elif command in ("/undo", "/retry"):
            self.undo(retry=command == "/retry")
        else:
            console.print(f"unknown command {command}; /help lists them (a message starting with / is not sent)")
        return False

    def undo(self, retry: bool) -> None:
        if not self.history:
            console.print("no exchange to undo in this chat")
            return
        last = self.history.pop()
        last.restore(self.session)
        self.unsaved = max(0, self.unsaved - 1)
        if not retry:
            console.print(f"forgot the last exchange ({last.question[:60]!r})")
            return
        temperature = self.sampling.get("temperature") or RETRY_TEMPERATURE
        self.exchange(last.question, do_sample=True, temperature=temperature)

    def save(self, target: str) -> bool:
        if not target:
            console.print("usage: /save FILE")
        elif not self.session.by_messages:
            console.print("this chat continues a compressed transcript's cache, which is not saved as a session")
        else:
            try:
                check_output(target, "/save", "cache", inputs=self.inputs, how="remove it yourself")  # no --force here
                self.session.save(target)
                console.print(f"saved {target}", highlight=False, soft_wrap=True)
                self.unsaved = 0
                return True
            except VkvError as exc:
                console.print(f"[red]not saved:[/] {exc}")
        return False

    def offer_to_save(self) -> None:
        """On a terminal, with exchanges not saved yet: ask for a file to save them to (empty or Ctrl-D: don't)."""
        if not (self.interactive and self.unsaved and self.session.by_messages):
            return
        while True:
            target = self.read(f"{self.unsaved} exchange(s) not saved; save to FILE (Enter: leave without saving)> ")
            if not target or not target.strip() or self.save(target.strip()):
                return


def _readline_history():
    """Line editing and history for `input()` where Python has readline; the history file, or None."""
    try:
        import readline
    except ImportError:  # Windows without pyreadline: plain input
        return None
    path = vkv_home() / "chat_history"
    try:
        readline.read_history_file(path)
    except OSError:
        pass  # none yet
    readline.set_history_length(1000)
    return path


def _save_history(path) -> None:
    if path is None:
        return
    import readline

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        readline.write_history_file(path)
    except OSError:
        pass  # a read-only home: history for this chat only
