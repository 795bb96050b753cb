"""A user's text (file names, class labels) is shown as written: never rich markup in a table, never mathtext in a
figure. Before the fix, an image named `[red]x :dog: $a$.jpg` was titled `x 🐶 $a$.jpg` in the tables (rich read
`[red]` as a style and `:dog:` as an emoji), and a `$a$` in a figure title or a class label on a tick was drawn as
maths (the dollar signs gone).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from conftest import RANDOM_CPU

IMAGE_NAME = "[red]x :dog: $a$.jpg"  # no slash in a file name, so no closing tag: `[red]` alone is a markup style
LABEL = "[red]x[/red] $a$ :dog: {index}"  # every class has one (the default ViT-Tiny has 1000): whichever is shown
SHOWN_LABEL = re.compile(r"\[red\]x\[/red\]\$a\$:dog:\d+")  # a label as stdout prints it, whitespace removed


@pytest.fixture
def hostile(tmp_path, photo) -> tuple[Path, Path]:
    """The sample photo under a name full of markup, and a labels file whose every class label is markup."""
    image = tmp_path / "images" / IMAGE_NAME
    image.parent.mkdir()
    shutil.copyfile(photo, image)
    labels = tmp_path / "labels.txt"
    labels.write_text("".join(LABEL.format(index=index) + "\n" for index in range(1000)), encoding="utf-8")
    return image, labels


@pytest.mark.parametrize(
    ("command", "shows_label"),
    [
        (["predict"], True),
        (["attend", "--block", "12", "--head", "1"], False),
        (["explain", "--method", "attention"], True),
        (["attribute"], True),
        (["occlude-quadrants"], True),
    ],
)
def test_tables_show_file_names_and_labels_as_written(cli, hostile, command, shows_label):
    image, labels = hostile
    result = cli(*command, image, "--labels", labels, *RANDOM_CPU, "--no-figures")
    assert result.exit_code == 0, result.output
    printed = re.sub(r"\s+", "", result.stdout)  # rich wraps long titles at the table's width
    assert re.sub(r"\s+", "", IMAGE_NAME) in printed, result.stdout
    assert "🐶" not in result.stdout
    if shows_label:
        assert SHOWN_LABEL.search(printed), result.stdout


def test_random_weights_warning_keeps_its_style():
    """The one piece of markup vitcli wants: the random weights' caption stays bold red, as Text, not markup."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from vitcli.render import fitted, weights_caption

    table = Table(caption=Text.assemble("a definition\n", weights_caption("RANDOM (seed 0)")))
    table.add_column("x")
    console = Console(width=200)
    segments = list(console.render(fitted(table)))
    warning = [segment for segment in segments if "WEIGHTS" in segment.text]
    assert warning and all(segment.style.bold and segment.style.color.name == "red" for segment in warning)
    assert "[bold red]" not in "".join(segment.text for segment in segments)


def test_table_cells_and_titles_are_not_markup():
    """Any table printed through render.fitted: str titles, captions, headers and cells are literal text."""
    from rich.console import Console
    from rich.table import Table

    from vitcli.render import fitted

    table = Table(title="[bold]title[/bold]", caption="[i]caption[/i] :dog:")
    table.add_column("[red]header")
    inner = Table(show_header=False)
    inner.add_column("x")
    inner.add_row("[green]nested")
    table.add_row("[blue]cell[/blue]")
    table.add_row(inner)
    console = Console(record=True, width=200)
    console.print(fitted(table))
    shown = console.export_text()
    for text in ("[bold]title[/bold]", "[i]caption[/i] :dog:", "[red]header", "[blue]cell[/blue]", "[green]nested"):
        assert text in shown, shown


def _drawn(figure) -> bytes:
    import io

    stream = io.BytesIO()
    figure.savefig(stream, format="png", dpi=50)
    return stream.getvalue()


def test_figure_title_is_not_mathtext():
    """figures.title keeps `$a$` as written: its Text does not parse maths, so it draws differently from the same
    string read as mathtext (where the dollar signs vanish and `a` is set in italics)."""
    import matplotlib.pyplot as plt

    from vitcli import figures

    text = "cost $5 and $6: a$b$c.jpg"
    literal, maths = plt.figure(figsize=(4, 1)), plt.figure(figsize=(4, 1))
    try:
        figures.title(literal, text, "RANDOM (seed 0)")
        maths.suptitle(f"{text}\nRANDOM (seed 0) WEIGHTS: untrained model", fontsize=10, parse_math=True)
        title = literal.get_suptitle()
        assert text in title
        assert literal._suptitle.get_parse_math() is False
        assert _drawn(literal) != _drawn(maths)
    finally:
        plt.close(literal)
        plt.close(maths)


def _texts_with_dollars(figure) -> list:
    from matplotlib.text import Text

    figure.canvas.draw()  # tick labels are made when drawn
    return [text for text in figure.findobj(Text) if "$" in text.get_text()]


@pytest.mark.parametrize("command", ["predict", "explain", "occlude_quadrants"])
def test_figures_draw_file_names_and_labels_as_written(hostile, command):
    """Every text holding a `$` in the figure (the file name in the title, class labels on predict's ticks) is drawn
    literally."""
    import matplotlib.pyplot as plt

    import vitcli

    image, labels = hostile
    model = vitcli.load_model(weights="random", device="cpu", labels=labels)
    options = {"method": ["attention"]} if command == "explain" else {}
    figure = getattr(vitcli, command)(model, image, **options).figure()
    try:
        texts = _texts_with_dollars(figure)
        assert any("$a$.jpg" in text.get_text() for text in texts)
        if command == "predict":
            assert any(text.get_text().endswith(LABEL.format(index=text.get_text().split()[0])) for text in texts)
        assert all(text.get_parse_math() is False for text in texts), [
            text.get_text() for text in texts if text.get_parse_math()
        ]
    finally:
        plt.close(figure)


def test_progress_bar_names_images_as_written():
    """The progress bar's description (`occluding NAME`) is printed as written."""
    from vitcli.runner import progress_display

    with progress_display(True) as progress:
        task = progress.add_task(f"occluding {IMAGE_NAME}", total=1)
        shown = progress.columns[0].render(progress.tasks[task])
    assert shown.plain == f"occluding {IMAGE_NAME}"
