"""Hub download and model resolution with the real huggingface_hub client against tests/hub_server.py.

Every test gets its own loopback server (HF_ENDPOINT), its own HF_HOME under tmp_path and no token; the server
records each request, so the tests can check what the client asked for (Range on resume, no request offline).
"""
from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from powerinfer_py.tools import catalog, hub
from powerinfer_py.errors import PowerInferError

from hub_server import FakeRepo, HubServer

MiB = 1 << 20
REPO = "PowerInfer/Tiny-PowerInfer-GGUF"
CHAT = "Org/Tiny-Chat-gguf"
BIG = "Org/Big-GGUF"
GATED = "Org/Gated-GGUF"
ORIGINAL = "Org/Tiny-Original"
SECRET = "hf_test_secret_token"


def gguf_bytes(n: int, seed: int) -> bytes:
    """A valid empty GGUF v3 header (no tensors, no metadata) followed by n pseudo-random bytes."""
    body = (bytes(range(256)) * (n // 256 + 1))[:n]
    return struct.pack("<4sIQQ", b"GGUF", 3, 0, 0) + bytes((b + seed) & 0xFF for b in body[:4096]) + body[4096:]


def make_repos() -> list[FakeRepo]:
    act = {f"activation/activation_{i}.pt": bytes([i]) * 3000 for i in range(2)}
    return [
        FakeRepo(REPO, {"tiny.powerinfer.gguf": gguf_bytes(200_000, 1), "tiny.q4.powerinfer.gguf": gguf_bytes(60_000, 2),
                        "README.md": b"# tiny\n", "config.json": b"{}", **act}),
        FakeRepo(CHAT, {"chat.gguf": gguf_bytes(50_000, 3), "chat.Q4_0.gguf": gguf_bytes(20_000, 4),
                        "mistral_chat_activation/activation_0.pt": b"a" * 1000}),
        # Bigger than huggingface_hub's 10 MiB read chunk, so a drop after the first chunk is resumed with Range.
        FakeRepo(BIG, {"big.gguf": os.urandom(10 * MiB + 300_000)}),
        FakeRepo(GATED, {"gated.gguf": gguf_bytes(10_000, 5)}, gated_token=SECRET),
        FakeRepo(ORIGINAL, {"config.json": b'{"architectures": ["LlamaForCausalLM"]}',
                            "model.safetensors": b"\x08\x00\x00\x00\x00\x00\x00\x00{}      "}),
        # Stands in for the catalog's Bamboo repository, to resolve a short name end to end.
        FakeRepo(catalog.find("bamboo-7b").repo_id, {"bamboo-7b-v0.1.gguf": gguf_bytes(30_000, 6),
                                                     "bamboo-7b-v0.1.Q4_0.gguf": gguf_bytes(10_000, 7),
                                                     "activation/activation_0.pt": b"b" * 500}),
    ]


REPOS = make_repos()
CONTENT = {r.repo_id: r.files for r in REPOS}


@pytest.fixture
def hub_env(tmp_path, monkeypatch):
    """An isolated Hugging Face environment: HF_HOME in tmp_path, online, no token."""
    from huggingface_hub import constants
    from huggingface_hub.utils import _detect_agent

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE",
                "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    # hub.py keeps the library's import-time offline flag in step with the environment: restore it afterwards.
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", constants.HF_HUB_OFFLINE)
    # The library fetches an "agent harness" list from its import-time endpoint once per process; pre-empt it
    # so that no test traffic leaves the loopback server.
    monkeypatch.setattr(_detect_agent, "_registry", {"harnesses": {}, "standardEnvVars": []}, raising=False)
    return tmp_path / "hf" / "hub"


@pytest.fixture
def server(hub_env, monkeypatch):
    with HubServer(REPOS, max_lifetime_s=60) as srv:
        monkeypatch.setenv("HF_ENDPOINT", srv.url)
        yield srv


def assert_same_bytes(path: Path, repo_id: str, name: str) -> None:
    assert path.is_file(), path
    assert path.read_bytes() == CONTENT[repo_id][name], f"{name}: bytes differ"


# ---- choosing files (no network) ------------------------------------------------------------------------------

def test_quant_from_file_names():
    assert hub.gguf_quant("llama-7b-relu.powerinfer.gguf") == "f16"  # PowerInfer: no tag = unquantized
    assert hub.gguf_quant("llama-7b-relu.q4.powerinfer.gguf") == "q4_0"
    assert hub.gguf_quant("bamboo-7b-v0.1.Q4_0.gguf") == "q4_0"
    assert hub.gguf_quant("model-fp16.gguf") == "f16"
    assert hub.gguf_quant("model.Q8_0.gguf") == "q8_0"


def test_choose_gguf_by_quant_and_errors():
    names = ["a.powerinfer.gguf", "a.q4.powerinfer.gguf", "activation/activation_0.pt"]
    assert hub.choose_gguf(names, "X/Y") == "a.powerinfer.gguf"
    assert hub.choose_gguf(names, "X/Y", "q4") == "a.q4.powerinfer.gguf"
    assert hub.choose_gguf(["only.q4.gguf"], "X/Y") == "only.q4.gguf"
    with pytest.raises(PowerInferError, match="no .gguf file"):
        hub.choose_gguf(["config.json"], "X/Y")
    with pytest.raises(PowerInferError, match=r"no q4_0 model file; it has: a.powerinfer.gguf \(f16\)"):
        hub.choose_gguf(["a.powerinfer.gguf"], "X/Y", "q4_0")
    with pytest.raises(PowerInferError, match="several f16 model files"):
        hub.choose_gguf(["a.gguf", "b.gguf"], "X/Y", "f16")
    with pytest.raises(PowerInferError, match="unknown quantization 'q3'"):
        hub.choose_gguf(names, "X/Y", "q3")


def test_select_files_default_explicit_and_whole_repo():
    names = ["m.gguf", "m.q4.gguf", "activation/activation_0.pt", "README.md"]
    assert hub.select_files(names, "X/Y") == ("m.gguf", ["m.gguf", "activation/activation_0.pt"])
    assert hub.select_files(names, "X/Y", files=["README.md"]) == (None, ["README.md"])
    assert hub.select_files(names, "X/Y", include=["*.gguf"]) == ("m.gguf", ["m.gguf", "m.q4.gguf"])
    assert hub.select_files(["config.json", "w.safetensors"], "X/Y") == (None, ["config.json", "w.safetensors"])
    with pytest.raises(PowerInferError, match="has no file nope.bin"):
        hub.select_files(names, "X/Y", files=["nope.bin"])
    with pytest.raises(PowerInferError, match=r"no file of X/Y matches \*.txt"):
        hub.select_files(names, "X/Y", include=["*.txt"])


# ---- download -------------------------------------------------------------------------------------------------

def test_download_default_into_cache(server, hub_env):
    res = hub.download(REPO, progress=False)
    assert res.model_file.name == "tiny.powerinfer.gguf"
    assert sorted(p.relative_to(res.root).as_posix() for p in res.files) == [
        "activation/activation_0.pt", "activation/activation_1.pt", "tiny.powerinfer.gguf"]
    for p in res.files:
        assert_same_bytes(p, REPO, p.relative_to(res.root).as_posix())
    # The standard cache layout, shared with other tools: refs/main -> the commit the files came from.
    folder = hub_env / "models--PowerInfer--Tiny-PowerInfer-GGUF"
    commit = (folder / "refs" / "main").read_text()
    assert res.root == folder / "snapshots" / commit
    assert not (res.root / "README.md").exists() and not (res.root / "tiny.q4.powerinfer.gguf").exists()
    # A second download finds everything in place: metadata requests only, no file bytes.
    before = len(server.log("GET", "/blobs/"))
    again = hub.download(REPO, progress=False)
    assert again.files == res.files and len(server.log("GET", "/blobs/")) == before


def test_download_quant_into_local_dir(server, hub_env, tmp_path):
    out = tmp_path / "out"
    res = hub.download(REPO, quant="q4_0", local_dir=out, progress=False)
    assert res.root == out.resolve() and res.model_file == out.resolve() / "tiny.q4.powerinfer.gguf"
    assert_same_bytes(out / "tiny.q4.powerinfer.gguf", REPO, "tiny.q4.powerinfer.gguf")
    assert_same_bytes(out / "activation" / "activation_1.pt", REPO, "activation/activation_1.pt")
    assert not (out / "tiny.powerinfer.gguf").exists()
    assert not (hub_env / "models--PowerInfer--Tiny-PowerInfer-GGUF" / "snapshots").exists()


def test_download_explicit_files_include_and_chat_statistics(server, hub_env):
    res = hub.download(REPO, ["README.md"], include=["activation/*"], progress=False)
    assert sorted(p.name for p in res.files) == ["README.md", "activation_0.pt", "activation_1.pt"]
    assert res.model_file is None
    chat = hub.download(CHAT + ":q4_0", progress=False)  # Bamboo-DPO style: mistral_chat_activation/
    assert sorted(p.relative_to(chat.root).as_posix() for p in chat.files) == [
        "chat.Q4_0.gguf", "mistral_chat_activation/activation_0.pt"]


def test_download_resumes_after_dropped_connection(server, hub_env):
    cut = 10 * MiB + 100_000
    server.drop_once(BIG, "big.gguf", cut)
    res = hub.download(BIG, progress=False)
    assert_same_bytes(res.model_file, BIG, "big.gguf")
    gets = server.log("GET", "/blobs/")
    assert len(gets) == 2, [g.path for g in gets]
    assert "range" not in gets[0].headers
    # The retry asked only for the rest: from the last complete 10 MiB chunk the client had written.
    assert gets[1].headers["range"] == f"bytes={10 * MiB}-"
    assert not list(res.model_file.parent.parent.parent.rglob("*.incomplete"))


def test_missing_repo_is_a_clear_404(server):
    with pytest.raises(PowerInferError, match=r"repository Org/Missing not found on http://127\.0\.0\.1:\d+ "
                                              r"\(404\): check the id"):
        hub.download("Org/Missing", progress=False)
    with pytest.raises(PowerInferError, match="not found"):
        hub.resolve_model("Org/Missing")


def test_gated_repo_needs_hf_token(server, monkeypatch):
    with pytest.raises(PowerInferError, match=r"Org/Gated-GGUF is gated \(401 unauthorised\).*set HF_TOKEN"):
        hub.download(GATED, progress=False)
    monkeypatch.setenv("HF_TOKEN", "hf_wrong")
    with pytest.raises(PowerInferError, match="the token in HF_TOKEN was refused"):
        hub.download(GATED, progress=False)
    monkeypatch.setenv("HF_TOKEN", SECRET)
    res = hub.download(GATED, progress=False)
    assert_same_bytes(res.model_file, GATED, "gated.gguf")
    assert server.log("HEAD", "/resolve/")[-1].headers["authorization"] == f"Bearer {SECRET}"
    # The token stays on the Hub: the CDN (another origin) never sees it.
    assert all("authorization" not in r.headers for r in server.log("GET", "/blobs/"))


def test_offline_served_from_cache(server, monkeypatch):
    online = hub.download(REPO, progress=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    n_requests = len(server.requests)
    offline = hub.download(REPO, progress=False)
    assert offline.from_cache and offline.model_file == online.model_file
    assert sorted(offline.files) == sorted(online.files)
    assert hub.resolve_model(REPO) == online.model_file
    assert len(server.requests) == n_requests, "offline mode must not touch the network"


def test_offline_not_cached_is_a_clear_error(server, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(PowerInferError, match=r"not in the local cache .* HF_HUB_OFFLINE is set: "
                                              r"run `powerinfer download"):
        hub.download(REPO, progress=False)
    with pytest.raises(PowerInferError, match="not in the local cache.*HF_HUB_OFFLINE is set"):
        hub.resolve_model(REPO + ":q4_0")
    assert server.requests == []


def test_unreachable_hub_falls_back_to_cache(server, hub_env, monkeypatch):
    cached = hub.download(REPO, progress=False)
    dead = HubServer([])
    dead.start()
    dead.stop()  # its port is now closed: connections are refused at once
    monkeypatch.setenv("HF_ENDPOINT", dead.url)
    assert hub.download(REPO, progress=False).model_file == cached.model_file
    with pytest.raises(PowerInferError, match="cannot reach http://127.0.0.1:.*HF_HUB_OFFLINE=1"):
        hub.download(CHAT, progress=False)


# ---- resolve_model --------------------------------------------------------------------------------------------

def test_resolve_local_paths(tmp_path, hub_env):
    f = tmp_path / "m.gguf"
    f.write_bytes(gguf_bytes(10, 0))
    assert hub.resolve_model(f) == f and hub.resolve_model(str(f)) == f
    (tmp_path / "m.q4.gguf").write_bytes(gguf_bytes(10, 0))
    assert hub.resolve_model(tmp_path) == f
    assert hub.resolve_model(tmp_path, quant="q4_0") == tmp_path / "m.q4.gguf"
    with pytest.raises(PowerInferError, match="model file not found: .*nope.gguf"):
        hub.resolve_model(tmp_path / "nope.gguf")
    with pytest.raises(PowerInferError, match="not a known short name .* not a Hugging Face repo id"):
        hub.resolve_model("no such model")


def test_resolve_repo_id_downloads_once_then_uses_cache(server, hub_env):
    path = hub.resolve_model(REPO)
    assert path.name == "tiny.powerinfer.gguf" and hub_env in path.parents
    assert_same_bytes(path, REPO, "tiny.powerinfer.gguf")
    assert (path.parent / "activation" / "activation_0.pt").is_file()  # statistics come with the model
    n_requests = len(server.requests)
    assert hub.resolve_model(REPO) == path
    assert len(server.requests) == n_requests, "a cached model resolves without the network"
    q4 = hub.resolve_model(REPO + ":q4_0")  # not cached yet: fetched now
    assert q4.name == "tiny.q4.powerinfer.gguf" and len(server.requests) > n_requests
    assert hub.resolve_model(f"{REPO}:tiny.q4.powerinfer.gguf") == q4


def test_resolve_short_name(server, hub_env):
    path = hub.resolve_model("bamboo-7b:q4_0")
    assert path.name == "bamboo-7b-v0.1.Q4_0.gguf"
    assert_same_bytes(path, catalog.find("bamboo-7b").repo_id, "bamboo-7b-v0.1.Q4_0.gguf")
    assert hub.resolve_model("Bamboo-7B", quant="f16").name == "bamboo-7b-v0.1.gguf"


def test_resolve_refusals(server):
    with pytest.raises(PowerInferError, match="not in the local cache.*downloading is not allowed"):
        hub.resolve_model(REPO, allow_download=False)
    with pytest.raises(PowerInferError, match="holds no .gguf file; original checkpoints need `powerinfer convert`"):
        hub.resolve_model(ORIGINAL)
    with pytest.raises(PowerInferError, match="has no file nope.gguf"):
        hub.resolve_model(REPO + ":nope.gguf")
    assert server.log("GET", "/blobs/") == []


def test_download_whole_repo_without_gguf(server):
    res = hub.download(ORIGINAL, progress=False)
    assert sorted(p.name for p in res.files) == ["config.json", "model.safetensors"]
    assert res.model_file is None


# ---- the CLI commands -----------------------------------------------------------------------------------------

def cli_app() -> typer.Typer:
    from powerinfer_cli.hub_cmds import download, models

    app = typer.Typer()
    app.command()(download)
    app.command()(models)
    return app


def test_cli_download_and_models(server, hub_env, tmp_path):
    runner = CliRunner()
    app = cli_app()
    out = tmp_path / "dl"
    res = runner.invoke(app, ["download", REPO, "--quant", "q4_0", "--local-dir", str(out)])
    assert res.exit_code == 0, res.output
    assert f"3 files of {REPO} in {out.resolve()}" in res.stdout
    assert f"model: {out.resolve() / 'tiny.q4.powerinfer.gguf'}" in res.stdout
    assert_same_bytes(out / "tiny.q4.powerinfer.gguf", REPO, "tiny.q4.powerinfer.gguf")

    res = runner.invoke(app, ["download", "bamboo-7b:q4_0"])
    assert res.exit_code == 0, res.output
    assert str(hub_env) in res.stdout

    res = runner.invoke(app, ["download", "Org/Missing"])
    assert res.exit_code == 1 and res.stderr.startswith("error: repository Org/Missing not found")
    assert "Traceback" not in res.output

    res = runner.invoke(app, ["models"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    for entry in catalog.CATALOG:
        assert entry.name in res.stdout and entry.repo_id in res.stdout
    bamboo_line = next(line for line in res.stdout.splitlines() if " bamboo-7b " in line)
    assert "q4_0" in bamboo_line.rsplit("│", 2)[-2]  # the cached column names what is on disk
    relu_line = next(line for line in res.stdout.splitlines() if " relullama-7b " in line)
    assert relu_line.rsplit("│", 2)[-2].strip() == "-"
