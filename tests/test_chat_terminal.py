"""`powerinfer chat` in a real pseudo-terminal (pexpect): turns, slash commands, Ctrl-C, Ctrl-D."""
from __future__ import annotations

import json
import os
import sys

import pexpect
import pytest

PROMPT = ">>> "


def _spawn(path, tmp_path, *extra):
    env = dict(os.environ, POWERINFER_CACHE=str(tmp_path / "cache"), TERM="xterm", COLUMNS="200")
    args = ["-m", "powerinfer_cli", "chat", "-m", str(path), "--template", "plain", "--temp", "0", "-t", "1", *extra]
    child = pexpect.spawn(sys.executable, args, env=env, encoding="utf-8", timeout=90, dimensions=(50, 200))
    child.expect_exact(PROMPT)
    return child


def _stats(child) -> tuple[int, str]:
    child.sendline("/stats")
    child.expect(r"context: (\d+) of \d+ tokens, (\d+) messages")
    n_past, n_msgs = int(child.match.group(1)), int(child.match.group(2))
    child.expect_exact(PROMPT)
    return n_past, n_msgs


@pytest.mark.slow
def test_two_turns_reset_save_load_and_ctrl_d(synthetic_model, tmp_path):
    child = _spawn(synthetic_model("llama"), tmp_path, "-n", "8")
    try:
        child.sendline("hello world")
        child.expect_exact(PROMPT)
        child.sendline("the cat")
        child.expect_exact(PROMPT)
        n_past, n_msgs = _stats(child)
        assert n_msgs == 4 and n_past > 0
        saved = tmp_path / "conv.json"
        child.sendline(f"/save {saved}")
        child.expect_exact("saved 4 messages")
        child.expect_exact(PROMPT)
        assert [m["content"] for m in json.loads(saved.read_text())["messages"]][::2] == ["hello world", "the cat"]
        child.sendline("/reset")
        child.expect_exact("conversation cleared")
        child.expect_exact(PROMPT)
        assert _stats(child)[1] == 0
        child.sendline(f"/load {saved}")
        child.expect_exact("loaded 4 messages")
        child.expect_exact(PROMPT)
        assert _stats(child)[1] == 4
        child.sendline("/nonsense")
        child.expect_exact("unknown command /nonsense")
        child.expect_exact(PROMPT)
        child.sendeof()
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0


@pytest.mark.slow
def test_ctrl_c_stops_the_reply_and_keeps_the_session(synthetic_model, tmp_path):
    # a larger model and no reply limit: the reply is still running when Ctrl-C arrives
    path = synthetic_model("llama", dtype="f16", n_layer=4, n_embd=256, n_ff=1024, n_head=4, n_head_kv=2,
                           n_ctx_train=4096)
    child = _spawn(path, tmp_path, "-n", "-1")
    try:
        child.sendline("hello world")
        child.expect_exact("hello world\r\n")  # the terminal's echo of the input line
        child.expect(r"\S")  # the reply has started streaming
        child.sendintr()
        child.expect_exact("interrupted")
        child.expect_exact(PROMPT)
        child.sendline("/stats")
        child.expect_exact("stop: interrupted")
        child.expect(r"(\d+) messages")
        assert int(child.match.group(1)) == 2  # the partial reply stayed in the conversation
        child.expect_exact(PROMPT)
        child.sendintr()  # Ctrl-C at the prompt leaves cleanly
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0
