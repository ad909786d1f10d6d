"""`powerinfer chat`: a terminal conversation with a model, or one reply per input line when stdin is a pipe.

Interactive: readline line editing and history (saved in the cache folder), a trailing backslash or a paste
continues the message on the next line, replies stream as they are generated, Ctrl-C stops a reply (the
partial reply stays in the conversation) and Ctrl-C or Ctrl-D at the prompt leaves. Slash commands: see HELP.
Piped: each non-empty input line is a user message (the whole input with --single); only the replies are
printed, one per message, without colours or prompts.
"""
from __future__ import annotations

import select
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape

from . import options as O
from .shell import EXIT_INTERRUPTED, fail, model_path, print_load_notes, stderr, user_errors

EPILOG = """\
[bold]Examples[/]

  powerinfer chat -m demo
  powerinfer chat -m model.gguf --system "You answer in one sentence." --temp 0.7
  powerinfer chat -m model.gguf --template chatml -c 8192
  printf 'Hello!\\nName three colours.\\n' | powerinfer chat -m model.gguf --temp 0
  powerinfer chat -m model.gguf --single < question.txt
"""

HELP = """\
/help            this list
/reset           forget the conversation (the system prompt stays)
/system [TEXT]   show or set the system prompt
/save FILE       write the conversation as JSON
/load FILE       continue a conversation saved with /save
/stats           speed of the last reply, context used, active neurons
/exit            leave (so do Ctrl-D and Ctrl-C at the prompt)
End a line with \\ to continue the message on the next line; pasted lines stay one message."""

PROMPT, MORE = ">>> ", "... "


def chat(
    ctx: typer.Context,
    model: str = O.MODEL,
    system: Optional[str] = typer.Option(None, "--system", help="System prompt."),
    template: Optional[str] = typer.Option(None, "--template", help=O.TEMPLATE_HELP),
    max_tokens: int = O.flag("max_tokens", default=-1,
                             help="Tokens per reply at most; -1 = until the end of the turn."),
    temperature: float = O.flag("temperature"),
    top_k: int = O.flag("top_k"),
    top_p: float = O.flag("top_p"),
    min_p: float = O.flag("min_p"),
    repeat_penalty: float = O.flag("repeat_penalty"),
    repeat_last_n: int = O.flag("repeat_last_n"),
    frequency_penalty: float = O.flag("frequency_penalty"),
    presence_penalty: float = O.flag("presence_penalty"),
    seed: Optional[int] = O.flag("seed"),
    threads: Optional[int] = O.flag("threads"),
    n_ctx: Optional[int] = O.flag("n_ctx"),
    sparse: Optional[str] = O.flag("sparse"),
    sparse_threshold: Optional[float] = O.flag("sparse_threshold"),
    sparsity: Optional[float] = O.flag("sparsity"),
    predictor_dtype: str = O.flag("predictor_dtype"),
    backend: str = O.flag("backend"),
    vram_budget: Optional[float] = O.flag("vram_budget"),
    no_mmap: bool = O.flag("use_mmap"),
    single: bool = typer.Option(False, "--single", help="Piped input: the whole input is one message."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Show loading details and tracebacks."),
) -> None:
    """Chat with a model in the terminal; with piped input, print one reply per input line."""
    interactive = sys.stdin.isatty()
    with user_errors(verbose):
        try:
            session = _open(model, system, template, O.load_options(ctx.params), O.sampling_params(ctx.params))
        except KeyboardInterrupt:
            raise typer.Exit(EXIT_INTERRUPTED)
        try:
            code = _interactive(session) if interactive else _piped(session, single)
        finally:
            session.llm.close()
    raise typer.Exit(code)


def _open(model, system, template, load_options, sampling):
    from powerinfer_py import load
    from powerinfer_py.chat import ChatSession, template_for

    llm = load(model_path(model), **load_options.kwargs())
    print_load_notes(llm)
    try:
        return ChatSession(llm, template_for(llm, template), system, max_tokens=sampling.max_tokens,
                           sampling=sampling)
    except BaseException:
        llm.close()
        raise


# ---- piped ---------------------------------------------------------------------------------------------------

def _piped(session, single: bool) -> int:
    from powerinfer_py.errors import PowerInferError

    messages = [sys.stdin.read().strip()] if single else [line.strip() for line in sys.stdin]
    for text in (m for m in messages if m):
        try:
            reply = session.send(text)
        except PowerInferError as e:
            raise fail(str(e)) from None
        try:
            for piece in reply:
                sys.stdout.write(piece)
                sys.stdout.flush()
        except KeyboardInterrupt:
            reply.close()
            sys.stdout.write("\n")
            return EXIT_INTERRUPTED
        sys.stdout.write("\n")
        sys.stdout.flush()
        if reply.stats.stop_reason == "context":
            stderr.print(f"context full ({session.n_ctx} tokens): the reply was cut; raise the context size (-c)")
    return 0


# ---- interactive ---------------------------------------------------------------------------------------------

def _history_file() -> Path:
    from powerinfer_py.demo import cache_dir

    return cache_dir() / "chat_history"


def _setup_readline():
    """Line editing and a persistent history, when the readline module exists (it does on Linux/macOS)."""
    try:
        import readline
    except ImportError:
        return None
    path = _history_file()
    try:
        readline.read_history_file(path)
    except OSError:
        pass
    readline.set_history_length(1000)
    return readline, path


def _save_history(rl) -> None:
    if rl is None:
        return
    readline, path = rl
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        readline.write_history_file(path)
    except OSError:
        pass


def _more_input_waiting() -> bool:
    """True when more typed-ahead or pasted text is already waiting on stdin."""
    try:
        return bool(select.select([sys.stdin], [], [], 0.02)[0])
    except (OSError, ValueError):
        return False


def _read_message() -> str:
    """One user message: lines ending in a backslash, and lines pasted together, make one message. A slash
    command is always one line (lines typed ahead after it stay for the next read).
    Raises EOFError (Ctrl-D) or KeyboardInterrupt (Ctrl-C) at the prompt."""
    lines, prompt = [], PROMPT
    while True:
        line = input(prompt)
        if not lines and line.lstrip().startswith("/"):
            return line.strip()
        if line.endswith("\\"):
            lines.append(line[:-1])
        else:
            lines.append(line)
            if not _more_input_waiting():
                return "\n".join(lines).strip()
        prompt = MORE


def _interactive(session) -> int:
    out = Console(highlight=False, soft_wrap=True)
    rl = _setup_readline()
    c = session.llm.config
    stderr.print(f"[bold]{escape(session.llm.path.name)}[/] [dim]({c.arch}, {session.template.name} template, "
                 f"context {session.n_ctx}, sparse {session.llm.sparse.mode})[/]")
    stderr.print("[dim]Type a message; /help for commands; Ctrl-D or /exit to leave.[/]")
    try:
        while True:
            try:
                text = _read_message()
            except (EOFError, KeyboardInterrupt):
                out.print()
                return 0
            if not text:
                continue
            if text.startswith("/"):
                if _command(session, text, out) == "exit":
                    return 0
                continue
            _reply(session, text, out)
    finally:
        _save_history(rl)


def _reply(session, text: str, out: Console) -> None:
    from powerinfer_py.errors import PowerInferError

    try:
        reply = session.send(text)
    except PowerInferError as e:
        stderr.print(f"[bold red]error:[/] {escape(str(e))}")
        return
    st = reply.stats
    if st.dropped_turns:
        stderr.print(f"[dim]context full: dropped the {st.dropped_turns} oldest exchange(s); re-reading "
                     f"{st.n_prefilled} tokens[/]")
    try:
        for piece in reply:
            out.out(piece, end="", style="cyan", highlight=False)
    except KeyboardInterrupt:
        reply.close()
        out.print()
        stderr.print("[dim]interrupted (the partial reply stays in the conversation)[/]")
        return
    out.print()
    if st.stop_reason == "context":
        stderr.print(f"[dim]context full ({session.n_ctx} tokens): the reply was cut; the next message drops the "
                     "oldest exchanges[/]")


def _command(session, text: str, out: Console) -> str | None:
    from powerinfer_py.errors import PowerInferError

    name, _, arg = text.partition(" ")
    arg = arg.strip()
    try:
        if name in ("/exit", "/quit"):
            return "exit"
        if name == "/help":
            out.print(HELP, markup=False)
        elif name == "/reset":
            session.reset()
            stderr.print("[dim]conversation cleared[/]")
        elif name == "/system":
            if arg:
                session.set_system(arg)
                stderr.print("[dim]system prompt set[/]")
            else:
                out.print(session.system or "(no system prompt)", markup=False)
        elif name in ("/save", "/load"):
            if not arg:
                stderr.print(f"[bold red]error:[/] {name} needs a file name")
            elif name == "/save":
                path = session.save(Path(arg).expanduser())
                stderr.print(f"[dim]saved {len(session.messages)} messages to {escape(str(path))}[/]")
            else:
                n = session.load(Path(arg).expanduser())
                stderr.print(f"[dim]loaded {n} messages from {escape(arg)}[/]")
        elif name == "/stats":
            out.print(_stats_text(session), markup=False)
        else:
            stderr.print(f"[bold red]error:[/] unknown command {escape(name)}; /help lists them")
    except PowerInferError as e:
        stderr.print(f"[bold red]error:[/] {escape(str(e))}")
    except OSError as e:
        stderr.print(f"[bold red]error:[/] {escape(e.strerror or str(e))}: {escape(str(e.filename or arg))}")
    return None


def _stats_text(session) -> str:
    st = session.last
    lines = []
    if st is None:
        lines.append("no reply yet")
    else:
        lines.append(f"last reply: {st.n_gen} tokens, {st.decode_tok_s:.1f} tok/s, first token after "
                     f"{st.ttft_s * 1000:.0f} ms ({st.n_prefilled} prompt tokens prefilled, {st.n_reused} reused "
                     f"from the cache), stop: {st.stop_reason}")
    lines.append(f"context: {session.cache.n_past} of {session.n_ctx} tokens, {len(session.messages)} messages")
    sp = session.llm.sparsity_stats
    mode = session.llm.sparse.mode
    if sp is not None and sp.tokens.any():
        lines.append(f"sparse mode {mode}: {100 * sp.mean_fraction:.1f}% of {sp.n_ff} FFN neurons active per token "
                     "(last turn)")
    else:
        lines.append(f"sparse mode {mode}" + ("" if sp is not None else " (FFN not ReLU-family: all neurons run)"))
    return "\n".join(lines)
