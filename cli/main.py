"""The `powerinfer` Typer app: the commands live in run.py, chat.py, info.py, bench.py, hub_cmds.py and convert_cmds.py
(each imports its library lazily, so `powerinfer --help` stays fast); they are registered here."""
from __future__ import annotations

import typer

from . import bench, chat, convert_cmds, hub_cmds, calibrate_cmd, info, perplexity_cmd, place_cmd, run, synth_cmd
from . import predictor_cmd, profile_cmd  # issue 7: activation profiles and predictor training
from . import serve_cmd

app = typer.Typer(
    name="powerinfer",
    help="Run GGUF language models on the CPU with hand-written C kernels, exploiting activation sparsity, "
         "and compare them with llama.cpp.\n\n"
         'MODEL is a GGUF or PowerInfer (PWRI) file, "demo" (Gemma 3 270M from the demo package), a short name '
         "from `powerinfer models`, or a Hugging Face repo id.",
    epilog='Start with: powerinfer run -m demo "The capital of France is" -n 32',
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,  # a bug keeps its plain traceback; user errors never reach Typer
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
)

app.command("run", epilog=run.EPILOG)(run.run)
app.command("chat", epilog=chat.EPILOG)(chat.chat)
app.command("info", epilog=info.EPILOG)(info.info)
app.command("bench", epilog=bench.EPILOG)(bench.bench)
app.command("download", epilog=hub_cmds.DOWNLOAD_EPILOG)(hub_cmds.download)
app.command("models")(hub_cmds.models)
app.command("convert", epilog=convert_cmds.CONVERT_EPILOG)(convert_cmds.convert)
app.command("quantize", epilog=convert_cmds.QUANTIZE_EPILOG)(convert_cmds.quantize)
app.command("place", epilog=place_cmd.EPILOG)(place_cmd.place)
app.command("calibrate", epilog=calibrate_cmd.EPILOG)(calibrate_cmd.calibrate)
app.command("perplexity", epilog=perplexity_cmd.EPILOG)(perplexity_cmd.perplexity)
app.command("synth", hidden=True, epilog=synth_cmd.EPILOG)(synth_cmd.synth)
app.command("profile", epilog=profile_cmd.EPILOG)(profile_cmd.profile)
app.command("train-predictor", epilog=predictor_cmd.EPILOG)(predictor_cmd.train_predictor)
app.command("serve", epilog=serve_cmd.EPILOG)(serve_cmd.serve)


if __name__ == "__main__":
    app(prog_name="powerinfer")
