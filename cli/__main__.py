"""`python -m powerinfer_cli ...` runs the same app as the `powerinfer` script."""
from .main import app

app(prog_name="powerinfer")
