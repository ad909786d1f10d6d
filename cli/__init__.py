"""powerinfer_cli: the `powerinfer` command line (Typer). A thin shell over powerinfer_py: each command parses
its options, calls one library function and prints; logic lives in the runtime (DESIGN rule 5)."""
