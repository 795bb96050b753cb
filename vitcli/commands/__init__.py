"""The thin CLI layer: one module per command, Typer glue. A command's options are declared once, as the typed
parameters of its builder in vitcli.jobs (vitcli.declared_options); its function takes them as `**options`, builds
its Jobs with that builder and hands them to the runner."""
