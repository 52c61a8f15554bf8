"""`vkv chat` on a terminal (a pseudo-terminal): Ctrl-C stops an answer or clears the line and the chat goes on;
Ctrl-D leaves cleanly, offering to save the unsaved exchange. Also the loop guard that keeps looped answers out."""

import os
import pty
import select
import signal
import sys
import time

import pytest

from tests.conftest import FIXTURES
from vkv.cli.repetition import loop_start


def test_a_loop_is_cut_after_its_first_copy():
    words = list(range(100, 110))
    looped = words + [1, 2, 3, 4, 5, 6, 7, 8] * 5
    assert loop_start(looped) == len(words) + 8  # the text before it and one copy kept
    assert loop_start(words + [7] * 31) is None  # a short run of one token (a rule of dashes) is not a loop
    assert loop_start(words + [7] * 32) == len(words) + 1
    assert loop_start(list(range(200))) is None
    assert loop_start([1, 2, 3] * 2) is None  # two copies are not a loop


def _read_until(fd: int, seen: bytearray, text: bytes, timeout: float = 300, marks: tuple[bytes, ...] = ()) -> str:
    """Read the terminal until `text` appears after what was already matched (with `marks`: until one of them does);
    the output so far, decoded."""
    deadline = time.monotonic() + timeout
    start = len(seen)
    while not any(m in seen[start:] for m in marks or (text,)):
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            raise AssertionError(f"no {text!r} on the terminal; it shows:\n{seen.decode(errors='replace')}")
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # the child has exited
            chunk = b""
        if not chunk:
            raise AssertionError(f"chat ended before {text!r}:\n{seen.decode(errors='replace')}")
        seen += chunk
    return seen.decode(errors="replace")


@pytest.mark.integration
def test_chat_on_a_terminal_survives_ctrl_c_and_leaves_on_ctrl_d(test_model_dir, smol, tmp_path, monkeypatch):
    from vkv.api.session import Session

    home = tmp_path / "home"
    home.mkdir()
    (home / "models").symlink_to(test_model_dir.parent)  # the fetched test model; history goes to this home
    saved = tmp_path / "chat.safetensors"
    argv = [sys.executable, "-m", "vkv.cli", "chat", str(FIXTURES / "mini-agent.json"), "--model", "smollm2-135m"]
    argv += ["--quant", "fp32", "--max-new-tokens", "24"]
    pid, fd = pty.fork()
    if pid == 0:  # the child: chat on the pseudo-terminal
        # as a shell starts it: SIGINT handled and unblocked. Both are inherited through exec, and a test process
        # that ignores or blocks SIGINT (as the test runner may, after earlier tests) would make the Ctrl-C vanish
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        os.environ.update(VKV_HOME=str(home), OMP_NUM_THREADS="1", VKV_DEBUG="0")
        os.execv(sys.executable, argv)
    seen = bytearray()
    try:
        _read_until(fd, seen, b"you> ")
        os.write(fd, b"Which library hashes passwords?\n")
        _read_until(fd, seen, b"you> ")  # answered, and kept
        os.write(fd, b"List every file the agent touched, in detail.\n")
        _read_until(fd, seen, b"in detail.\r\n")  # the line taken; the answer starts (or has ended)
        # wait for the answer's first output: on a loaded machine a Ctrl-C written the moment the line is echoed was
        # lost (it neither stopped the answer nor reached the prompt), as if line editing still held the terminal
        _read_until(fd, seen, b"", marks=tuple(bytes([c]) for c in range(256)))
        os.write(fd, b"\x03")  # Ctrl-C: stops the answer, or clears the prompt's line if it has ended
        # an answer that ends first prints its prompt before the Ctrl-C lands: wait for what the Ctrl-C prints
        marks = (b"answer stopped", b"Ctrl-D or /quit leaves")
        text = _read_until(fd, seen, b"", marks=marks)
        stopped = "answer stopped" in text
        if b"you> " not in seen[max(seen.rfind(m) for m in marks) :]:  # the next prompt, if not read with the mark
            _read_until(fd, seen, b"you> ")
        os.write(fd, b"\x04")  # Ctrl-D on an empty line: end of input
        _read_until(fd, seen, b"not saved; save to FILE")
        os.write(fd, f"{saved}\n".encode())
        text = _read_until(fd, seen, b"saved " + str(saved).encode())
        _, code = os.waitpid(pid, 0)
        pid = 0
    finally:
        if pid:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        os.close(fd)
    assert os.waitstatus_to_exitcode(code) == 0 and "Traceback" not in text
    monkeypatch.setenv("VKV_HOME", str(home))  # the chat's user, whose key signed the file
    session = Session.load(saved, smol)
    asked = [m.content for m in session.messages if m.role == "user"]
    # the second question is kept only when its answer ended before the Ctrl-C; a Ctrl-C just after Enter may still
    # clear the line inside input() (Python checks for it when readline returns), so it is then never asked
    kept = asked[-1] == "List every file the agent touched, in detail."
    assert asked[-1 - kept] == "Which library hashes passwords?"  # the first exchange is kept either way
    assert not (stopped and kept)  # a stopped answer's question is not kept
    assert (home / "chat_history").is_file()  # readline's history, for the next chat
