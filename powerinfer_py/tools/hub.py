"""Models from the Hugging Face Hub: `download` (files into the shared HF cache or a folder) and `resolve_model`
(a path, a short name from the catalog, or a Hub repo id -> a model file on disk).

Transfers go through huggingface_hub, so the cache layout, locking, redirects, tokens and in-process resume of a
dropped connection (HTTP Range) are the library's. What this module adds: which files a PowerInfer repository
needs (one quantization of the model + its activation statistics), resolution from the cache without the network,
per-file and overall progress, and one PowerInferError with an actionable message for each failure.

Settings are read from the environment at every call (HF_ENDPOINT, HF_TOKEN, HF_HUB_OFFLINE, HF_HUB_CACHE /
HF_HOME / XDG_CACHE_HOME) and passed to the library explicitly: huggingface_hub reads its own copies once at
import time, which would make a later change (a test, a long-lived process) silently ignored.
"""
from __future__ import annotations

import fnmatch
import os
import re
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Sequence

from .. import demo
from ..errors import PowerInferError
from . import catalog

QUANTS = ("f16", "q4_0")
_QUANT_ALIASES = {"f16": "f16", "fp16": "f16", "q4": "q4_0", "q4_0": "q4_0"}
# A quantization tag inside a file name: "model.q4.powerinfer.gguf", "bamboo-7b-v0.1.Q4_0.gguf", "x-fp16.gguf".
_QUANT_TAG = re.compile(r"(?:^|[._-])(f32|fp32|f16|fp16|bf16|q\d(?:_[0-9a-z]+)*)(?=[._-]|$)")
# Hub repo ids: "Org/Name", letters, digits, '-', '_', '.'; at most 96 characters per part.
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}$")
_MODEL_SUFFIXES = (".gguf", ".pwri")


class HubUnreachableError(PowerInferError):
    """The Hub (or HF_ENDPOINT) could not be reached: no connection, refused, timed out."""


@dataclass(frozen=True)
class HubSettings:
    endpoint: str | None   # None: the library's default Hub
    token: str | None      # None: the library looks for a saved login
    offline: bool
    cache_dir: Path


@dataclass
class DownloadResult:
    repo_id: str
    revision: str
    root: Path                 # snapshot folder in the cache, or the --local-dir folder
    files: list[Path]          # every selected file, on disk
    model_file: Path | None    # the .gguf chosen for running (None for repos without one)
    from_cache: bool = False   # True when served from disk without asking the Hub (offline)


def hub_settings() -> HubSettings:
    """The Hub settings from the environment, now."""
    env = os.environ
    if env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE"):
        cache = Path(env.get("HF_HUB_CACHE") or env["HUGGINGFACE_HUB_CACHE"])
    else:
        home = env.get("HF_HOME") or os.path.join(env.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
        cache = Path(home) / "hub"
    offline = (env.get("HF_HUB_OFFLINE") or "").strip().upper() in ("1", "ON", "YES", "TRUE")
    endpoint = (env.get("HF_ENDPOINT") or "").rstrip("/") or None
    return HubSettings(endpoint, env.get("HF_TOKEN") or None, offline, cache.expanduser())


def _sync_library(s: HubSettings) -> None:
    """huggingface_hub blocks every request while its import-time offline flag is set, whatever we pass:
    keep that flag equal to the environment of this call."""
    from huggingface_hub import constants

    constants.HF_HUB_OFFLINE = s.offline


# ---- names: repo ids, quantizations, file choice ------------------------------------------------------------

def is_repo_id(text: str) -> bool:
    return bool(_REPO_ID.match(text)) and not text.lower().endswith(_MODEL_SUFFIXES)


def normalize_quant(quant: str) -> str:
    q = _QUANT_ALIASES.get(quant.strip().lower())
    if q is None:
        raise PowerInferError(f"unknown quantization {quant!r}: choose one of {', '.join(QUANTS)}")
    return q


def gguf_quant(filename: str) -> str:
    """The quantization a GGUF file name declares ("q4_0", "f16", "q8_0"...). PowerInfer repos name their
    unquantized (F16) file without a tag (`llama-7b-relu.powerinfer.gguf`), so no tag means f16."""
    tags = _QUANT_TAG.findall(Path(filename).name.lower())
    if not tags:
        return "f16"
    return _QUANT_ALIASES.get(tags[-1], tags[-1])


def choose_gguf(names: Iterable[str], repo_id: str, quant: str | None = None,
                default_quant: str | None = None) -> str:
    """The model file to run among a repository's files: the one of quantization `quant`, or by default
    `default_quant`, then f16, then q4_0, or the only .gguf there is."""
    ggufs = sorted(n for n in names if n.lower().endswith(".gguf"))
    if not ggufs:
        raise PowerInferError(f"{repo_id} holds no .gguf file; original checkpoints need `powerinfer convert`")
    by_quant: dict[str, list[str]] = {}
    for n in ggufs:
        by_quant.setdefault(gguf_quant(n), []).append(n)
    if quant is not None:
        order = [normalize_quant(quant)]
    elif len(ggufs) == 1:
        return ggufs[0]
    else:
        order = [q for q in (default_quant, "f16", "q4_0") if q]
    for q in order:
        found = by_quant.get(q, [])
        if len(found) == 1:
            return found[0]
        if len(found) > 1:
            raise PowerInferError(f"{repo_id} has several {q} model files ({', '.join(found)}): "
                                  f"name one as {repo_id}:FILE.gguf")
    raise PowerInferError(f"{repo_id} has no {order[0]} model file; it has: "
                          + ", ".join(f"{n} ({q})" for q, ns in sorted(by_quant.items()) for n in ns))


def activation_dirs(names: Iterable[str]) -> list[str]:
    """Top-level folders of activation statistics (`activation/`, Bamboo-DPO's `mistral_chat_activation/`)."""
    return sorted({n.split("/", 1)[0] for n in names if "/" in n and n.split("/", 1)[0].endswith("activation")})


def select_files(names: Sequence[str], repo_id: str, *, files: Sequence[str] = (), include: Sequence[str] = (),
                 quant: str | None = None, model_file: str | None = None,
                 require_model: bool = False) -> tuple[str | None, list[str]]:
    """Which files of a repository to fetch -> (model file or None, files in fetch order).

    FILES and --include globs, when given, are the selection (plus the --quant model file if asked).
    Otherwise a repository with .gguf files gives one model file (by quant / model_file) and its activation
    folders; a repository without any (original weights, predictors) is taken whole."""
    present = set(names)
    missing = [f for f in files if f not in present]
    if missing:
        raise PowerInferError(f"{repo_id} has no file {', '.join(missing)}")
    entry = catalog.by_repo(repo_id)
    default_quant = entry.default_quant if entry else None
    if files or include:
        chosen = list(dict.fromkeys([*files, *(n for n in names if any(fnmatch.fnmatch(n, g) for g in include))]))
        if include and len(chosen) == len(files):
            raise PowerInferError(f"no file of {repo_id} matches {', '.join(include)}")
        model = model_file or (choose_gguf(names, repo_id, quant) if quant else None)
        if model and model not in chosen:
            chosen.insert(0, model)
        model = model or next((n for n in chosen if n.lower().endswith(".gguf")), None)
        return model, chosen
    if not any(n.lower().endswith(".gguf") for n in names):
        if quant or model_file or require_model:
            choose_gguf(names, repo_id, quant)  # raises "holds no .gguf file"
        return None, sorted(names)
    if model_file is not None and model_file not in present:
        raise PowerInferError(f"{repo_id} has no file {model_file}")
    model = model_file or choose_gguf(names, repo_id, quant, default_quant)
    stats = [n for n in sorted(names) if n.split("/", 1)[0] in activation_dirs(names)]
    return model, [model, *stats]


# ---- the cache on disk ---------------------------------------------------------------------------------------

def _repo_folder(repo_id: str, cache_dir: Path) -> Path:
    return cache_dir / ("models--" + repo_id.replace("/", "--"))


def cached_snapshot(repo_id: str, revision: str = "main", cache_dir: Path | None = None) -> Path | None:
    """The cache's snapshot folder of `repo_id` at `revision` (a branch, tag or commit), or None."""
    folder = _repo_folder(repo_id, cache_dir or hub_settings().cache_dir)
    commit = revision
    if not re.fullmatch(r"[0-9a-f]{40}", revision):
        ref = folder / "refs" / revision
        if not ref.is_file():
            return None
        commit = ref.read_text().strip()
    snap = folder / "snapshots" / commit
    return snap if snap.is_dir() else None


def _files_under(root: Path) -> list[str]:
    """Relative paths of the complete files under root (cache symlinks resolved; no library metadata)."""
    out = []
    for p in root.rglob("*"):
        rel = p.relative_to(root).as_posix()
        if rel.startswith(".cache/") or rel.endswith(".incomplete") or not p.is_file():
            continue
        out.append(rel)
    return sorted(out)


def cached_files(repo_id: str, revision: str = "main", cache_dir: Path | None = None) -> list[str]:
    """Files of `repo_id` present in the cache at `revision` (empty if none)."""
    snap = cached_snapshot(repo_id, revision, cache_dir)
    return _files_under(snap) if snap else []


# ---- errors --------------------------------------------------------------------------------------------------

@contextmanager
def _hub_errors(repo_id: str, revision: str, s: HubSettings) -> Iterator[None]:
    """huggingface_hub and transport exceptions -> one PowerInferError saying what to do."""
    import httpx2
    from huggingface_hub import errors as e

    where = s.endpoint or "the Hugging Face Hub"
    try:
        yield
    except e.GatedRepoError:  # before RepositoryNotFoundError: it is a subclass
        raise PowerInferError(
            f"{repo_id} is gated (401 unauthorised): accept its terms on its Hub page, then set HF_TOKEN to an "
            f"access token of that account{' (the token in HF_TOKEN was refused)' if s.token else ''}") from None
    except e.RepositoryNotFoundError:
        raise PowerInferError(
            f"repository {repo_id} not found on {where} (404): check the id; if it is private, set HF_TOKEN") \
            from None
    except e.RevisionNotFoundError:
        raise PowerInferError(f"{repo_id} has no revision {revision!r}") from None
    except e.RemoteEntryNotFoundError as err:
        raise PowerInferError(f"{repo_id}@{revision}: file not found on the Hub ({err.response.url})") from None
    except e.LocalEntryNotFoundError:
        raise PowerInferError(
            f"{repo_id} is not in the local cache ({s.cache_dir}) and {where} cannot be reached"
            + (" (HF_HUB_OFFLINE is set)" if s.offline else "")) from None
    except e.HfHubHTTPError as err:
        status = err.response.status_code if err.response is not None else "?"
        hint = ": set HF_TOKEN to a valid access token" if status in (401, 403) else ""
        raise PowerInferError(f"{where} refused {repo_id} (HTTP {status}){hint}") from None
    except (httpx2.TransportError, e.OfflineModeIsEnabled) as err:
        raise HubUnreachableError(f"cannot reach {where} for {repo_id} ({type(err).__name__}: {err}); "
                              "set HF_HUB_OFFLINE=1 to use only the local cache") from None
    except OSError as err:  # a size mismatch after retries, a full disk
        raise PowerInferError(f"download of {repo_id} failed: {err}") from None
    except ValueError as err:  # the library's checks of what the Hub answered (names, commit ids)
        raise PowerInferError(f"huggingface_hub refused {repo_id}@{revision}: {err}") from None


# ---- download ------------------------------------------------------------------------------------------------

def _progress_classes(total: int, desc: str, enabled: bool, current: dict[str, str]):
    """(overall bar, per-file bar class). The per-file class is handed to huggingface_hub, which creates one bar
    per file (labelled with current["name"], the file being fetched); every byte it counts also advances the
    overall bar. Both are huggingface_hub bars: HF_HUB_DISABLE_PROGRESS_BARS and non-terminals turn them off."""
    from huggingface_hub.utils import tqdm as hf_tqdm

    overall = hf_tqdm(total=total, unit="B", unit_scale=True, desc=desc, disable=None if enabled else True,
                      position=0, leave=True)

    class FileBar(hf_tqdm):
        def __init__(self, *args, **kwargs):
            if not enabled:
                kwargs["disable"] = True
            name = current.get("name", "")
            kwargs["desc"] = name if len(name) <= 40 else "…" + name[-39:]
            kwargs.setdefault("position", 1)
            kwargs.setdefault("leave", False)
            super().__init__(*args, **kwargs)

        def update(self, n=1):
            if n:
                overall.update(n)
            return super().update(n)

    return overall, FileBar


def _listing(repo_id: str, revision: str, s: HubSettings) -> dict[str, int]:
    """path -> size in bytes of every file of the repository at `revision`, from the Hub.

    One repo-info request with file metadata. (list_repo_tree would do too, but the library retries it with
    backoff for ~25 s when the Hub is unreachable, and an unreachable Hub should fall back to the cache at once.)"""
    from huggingface_hub import HfApi

    api = HfApi(endpoint=s.endpoint, token=s.token)
    with _hub_errors(repo_id, revision, s):
        info = api.model_info(repo_id, revision=revision, files_metadata=True)
    return {f.rfilename: int(f.size or 0) for f in info.siblings or ()}


def _from_disk(repo_id: str, revision: str, local_dir: Path | None, s: HubSettings, why: str,
               **select) -> DownloadResult:
    """The selection served from the cache (or local_dir) without the network, or a PowerInferError."""
    root = local_dir if local_dir is not None else cached_snapshot(repo_id, revision, s.cache_dir)
    names = _files_under(root) if root is not None and root.is_dir() else []
    place = f"{local_dir}" if local_dir is not None else f"the local cache ({s.cache_dir})"
    if not names:
        raise PowerInferError(f"{repo_id} is not in {place} and {why}: run `powerinfer download {repo_id}` "
                              "while online")
    try:
        model, chosen = select_files(names, repo_id, **select)
    except PowerInferError as err:
        raise PowerInferError(f"{err} (looked only in {place}: {why})") from None
    return DownloadResult(repo_id, revision, root, [root / n for n in chosen],
                          root / model if model else None, from_cache=True)


def download(repo_id: str, files: Sequence[str] = (), *, include: Sequence[str] = (), revision: str | None = None,
             local_dir: str | os.PathLike | None = None, quant: str | None = None, model_file: str | None = None,
             require_model: bool = False, progress: bool = True) -> DownloadResult:
    """Fetch files of a Hub repository (see select_files for which) into the HF cache, or into local_dir.

    repo_id may also be a catalog short name, and either may end in `:q4_0` / `:f16` / `:file.gguf`.
    Files already present are not fetched again. Offline (HF_HUB_OFFLINE=1) the selection is served from the
    cache, or local_dir, or it is an error."""
    parsed = parse_model_spec(repo_id)
    if parsed is None:
        raise PowerInferError(f"{repo_id!r} is neither a Hugging Face repo id (Org/Name) nor a known short name "
                              "(see `powerinfer models`)")
    repo_id, spec_quant, spec_file = parsed
    quant = spec_quant or (normalize_quant(quant) if quant is not None else None)
    model_file = spec_file or model_file
    s = hub_settings()
    _sync_library(s)
    rev = revision or "main"
    local = Path(local_dir).expanduser() if local_dir is not None else None
    select = dict(files=tuple(files), include=tuple(include), quant=quant, model_file=model_file,
                  require_model=require_model)
    if s.offline:
        return _from_disk(repo_id, rev, local, s, "HF_HUB_OFFLINE is set", **select)
    try:
        sizes = _listing(repo_id, rev, s)
    except HubUnreachableError as err:
        try:  # no network: what is on disk may still be enough
            return _from_disk(repo_id, rev, local, s, "the Hub cannot be reached", **select)
        except PowerInferError:
            raise err from None
    model, chosen = select_files(list(sizes), repo_id, **select)
    return _fetch(repo_id, rev, chosen, model, sizes, local, s, progress)


_DRIVE = re.compile(r"[A-Za-z]:")  # a Windows drive prefix: C:\dir, or the drive-relative C:name


def check_repo_filename(repo_id: str, name: str) -> None:
    """Refuse a repository file name that is not a plain relative path, before huggingface_hub sees it (it
    raises a bare ValueError for those): an empty name or segment, `..`, an absolute, drive or UNC path (the
    library reads names under Windows rules too, so a backslash separates), control characters."""
    segments = name.replace("\\", "/").split("/")
    if (not name or any(seg in ("", ".", "..") or _DRIVE.match(seg) for seg in segments)
            or any(ord(c) < 32 or ord(c) == 127 for c in name)):
        raise PowerInferError(f"{repo_id}: file name {name!r} is not a plain relative path inside the repository; "
                              "refusing to download it")


def _fetch(repo_id: str, rev: str, chosen: list[str], model: str | None, sizes: dict[str, int],
           local: Path | None, s: HubSettings, progress: bool) -> DownloadResult:
    from huggingface_hub import hf_hub_download

    for name in chosen:
        check_repo_filename(repo_id, name)

    total = sum(sizes[n] for n in chosen)
    current: dict[str, str] = {}
    overall, file_bar = _progress_classes(total, f"{repo_id} ({len(chosen)} files)", progress, current)
    paths: list[Path] = []
    done = 0
    try:
        for name in chosen:
            current["name"] = name
            with _hub_errors(repo_id, rev, s):
                # The user's revision (not the commit) so that the library records refs/<rev> for offline use.
                p = hf_hub_download(repo_id, name, revision=rev, cache_dir=s.cache_dir, local_dir=local,
                                    endpoint=s.endpoint, token=s.token, tqdm_class=file_bar)
            paths.append(Path(p))
            done += sizes[name]
            overall.update(done - overall.n)  # files found in the cache count as done too
    finally:
        overall.close()
    if local is not None:
        root = local.resolve()
    else:
        root = cached_snapshot(repo_id, rev, s.cache_dir) or Path(paths[0]).parent
    return DownloadResult(repo_id, rev, root, paths, paths[chosen.index(model)] if model else None)


# ---- resolution ----------------------------------------------------------------------------------------------

def parse_model_spec(spec: str) -> tuple[str, str | None, str | None] | None:
    """`bamboo-7b:q4_0`, `Org/Name`, `Org/Name:q4_0`, `Org/Name:file.gguf` -> (repo_id, quant, file), or None
    when spec is neither a catalog short name nor a repo id."""
    name, _, suffix = spec.partition(":")
    entry = catalog.find(name)
    if entry is not None:
        repo_id = entry.repo_id
    elif is_repo_id(name):
        repo_id = name
    else:
        return None
    if not suffix:
        return repo_id, None, None
    if suffix.lower().endswith(".gguf"):
        return repo_id, None, suffix
    return repo_id, normalize_quant(suffix), None


def _gguf_in_folder(folder: Path, quant: str | None) -> Path:
    names = [p.name for p in folder.iterdir() if p.is_file() and p.name.lower().endswith(".gguf")]
    if not names and any(p.name.lower().endswith(".pwri") for p in folder.iterdir()):
        names = [p.name for p in folder.iterdir() if p.name.lower().endswith(".pwri")]
        if len(names) == 1:
            return folder / names[0]
    return folder / choose_gguf(names, str(folder), quant)


def resolve_model(spec: str | os.PathLike, *, allow_download: bool = True, quant: str | None = None) -> Path:
    """A model argument -> a model file on disk.

    In order: "demo" (the demo model, assembled on first use); an existing file (or a folder holding one .gguf per quantization); a catalog short name or a Hub
    repo id, optionally with `:q4_0` / `:f16` / `:file.gguf`, taken from the HF cache when it is there
    (no network), else downloaded (model file + activation statistics) when allowed and online."""
    text = os.fspath(spec)
    path = Path(text).expanduser()
    if text == demo.DEMO_NAME and not path.exists():
        return demo.demo_model_path()
    if path.is_file():
        return path
    if path.is_dir():
        return _gguf_in_folder(path, quant)
    parsed = parse_model_spec(text)
    if parsed is None:
        if text.lower().endswith(_MODEL_SUFFIXES) or text.startswith((".", "/", "~")):
            raise PowerInferError(f"model file not found: {path}")
        raise PowerInferError(f"model {text!r} not found: no such file, not a known short name "
                              "(see `powerinfer models`) and not a Hugging Face repo id (Org/Name)")
    repo_id, spec_quant, filename = parsed
    quant = spec_quant or (normalize_quant(quant) if quant else None)
    s = hub_settings()
    snap = cached_snapshot(repo_id, "main", s.cache_dir)
    if snap is not None:
        names = _files_under(snap)
        if filename is not None and filename in names:
            return snap / filename
        if filename is None and any(n.lower().endswith(".gguf") for n in names):
            try:
                entry = catalog.by_repo(repo_id)
                return snap / choose_gguf(names, repo_id, quant, entry.default_quant if entry else None)
            except PowerInferError:
                pass  # not this quantization in the cache: fetch it below
    if s.offline or not allow_download:
        why = "HF_HUB_OFFLINE is set" if s.offline else "downloading is not allowed here"
        raise PowerInferError(f"{repo_id} ({filename or quant or 'default model file'}) is not in the local cache "
                              f"({s.cache_dir}) and {why}: run `powerinfer download {repo_id}"
                              f"{' --quant ' + quant if quant else ''}` first")
    result = download(repo_id, quant=quant, model_file=filename, require_model=True)
    assert result.model_file is not None  # require_model: a repo without .gguf raised before any transfer
    return result.model_file


def cached_ggufs(repo_id: str) -> list[str]:
    """The .gguf files of `repo_id` present in the cache (main), for `powerinfer models`."""
    return [n for n in cached_files(repo_id) if n.lower().endswith(".gguf")]
