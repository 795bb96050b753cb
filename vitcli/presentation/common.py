"""What several presentation modules share, so that none imports another's privates."""

from __future__ import annotations

from typing import Any

import numpy as np

from vitcli.jobs import Presentation


def method_column(method: str) -> str:
    """A method's name as part of a summary column (`explain_integrated_gradients_deletion_auc`)."""
    return method.replace("-", "_")


def matrix_csv(matrix: np.ndarray) -> str:
    """A headerless CSV of a matrix, full precision (numpy.loadtxt(path, delimiter=",") reads it back)."""
    return "\n".join(",".join(repr(float(value)) for value in line) for line in np.asarray(matrix)) + "\n"


class View:
    """A view's presentation functions; subclasses define table, rows, document, figure, summary and extra files."""

    @classmethod
    def presentation(cls, result: Any) -> Presentation:
        presentation = Presentation.of(cls, result)
        if getattr(result, "skipped", None):
            presentation.document["skipped_images"] = list(result.skipped)
        presentation.extra_files = cls.extra_files(result)
        if cls.has_figure(result) is False:
            presentation.figure = None
        return presentation

    @staticmethod
    def has_figure(result: Any) -> bool:
        return True

    @staticmethod
    def extra_files(result: Any) -> dict[str, Any]:
        return {}
