"""vitcli: follow one photograph through a Vision Transformer, with measured numbers.

As a library (docs/python.md): `model = vitcli.load_model(name, weights="random")`, then one function per image
experiment, `vitcli.attend(model, "photo.jpg", block=4, head=1, query=74)`, each returning a `vitcli.Result` with
`.to_frame()`, `.to_dict()` and `.figure()`. They are imported on first use, so `import vitcli` (and `vitcli --help`)
stays light.
"""

from typing import Any

__version__ = "0.1.0"

_API = (
    "Result",
    "ablate",
    "anatomy",
    "attend",
    "attribute",
    "compare",
    "compare_patch_size",
    "explain",
    "explore",
    "heads",
    "lens",
    "load_model",
    "occlude_patches",
    "occlude_quadrants",
    "patch",
    "patches",
    "predict",
    "probe",
    "run_experiment",
    "trace",
)
_SETS_API = (
    "anatomy",
    "compare",
    "compare_patch_size",
    "heads",
    "patch",
    "probe",
)  # in vitcli.api_sets, the rest in vitcli.api
_ERRORS = ("UsageError", "VitcliError")
__all__ = ["__version__", *_API, *_ERRORS]


def __getattr__(name: str) -> Any:
    if name in _SETS_API:
        from vitcli import api_sets

        return getattr(api_sets, name)
    if name in _API:
        from vitcli import api

        return getattr(api, name)
    if name in _ERRORS:
        from vitcli import errors

        return getattr(errors, name)
    raise AttributeError(f"module 'vitcli' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
