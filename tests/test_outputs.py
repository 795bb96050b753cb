"""Output integrity (issue 9): where results land, that they never overwrite each other, that nothing is written
outside --output-dir, and that a kill, a full disk or a bad image costs nothing already written."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from vitcli import interrupts, store
from vitcli.errors import VitcliError
from vitcli.filenames import path_from_escaped
from vitcli.naming import LONGEST_RESULT_NAME, image_subject, result_name, safe_name, set_subject, setting
from vitcli.store import INDEX, OutputStore, ResultFiles, read_index

from conftest import RANDOM_CPU, result_files

VITCLI = shutil.which("vitcli", path=str(Path(sys.executable).parent)) or "vitcli"
MODEL_FOLDER = "vit_tiny_patch16_224.augreg_in21k_ft_in1k-random-s0"
SAFE_NAME = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9._-]*$")
BOOKKEEPING = {INDEX, ".index.lock"}


def small_image(path: Path, seed: int = 0, size: tuple[int, int] = (64, 48)) -> Path:
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Pillow takes the format from os.path.splitext, which finds no extension in names like `...jpg`.
    Image.fromarray(pixels).save(path, format="PNG" if path.suffix == ".png" else "JPEG")
    return path


def subject_folders(root: Path) -> list[Path]:
    return sorted(path for path in (root / MODEL_FOLDER).iterdir() if path.is_dir())


def stamps(root: Path) -> dict[Path, tuple[int, int]]:
    """Every result file under root with (inode, mtime): a replaced file gets a new inode."""
    return {
        path: (path.stat().st_ino, path.stat().st_mtime_ns)
        for path in root.rglob("*")
        if path.is_file() and path.name not in BOOKKEEPING
    }


def temporaries(root: Path) -> list[str]:
    return [os.path.join(folder, name) for folder, _, names in os.walk(root) for name in names if name.endswith(".tmp")]


def indexed_results(folder: Path) -> dict[str, dict]:
    return read_index(folder)["results"]


def one_line(stderr: str) -> str:
    assert stderr.count("\n") == 1 and "Traceback" not in stderr, stderr
    return stderr.strip()


@pytest.fixture
def no_model_load(monkeypatch):
    """Any weights loading fails the test: usage errors must come before it."""
    import vitcli.loading

    monkeypatch.setattr(vitcli.loading, "load_model", lambda *args, **kwargs: pytest.fail("the model was loaded"))


# ----- names: settings in the file name, one folder per input file


def test_different_settings_land_in_different_files(cli, photo, workdir):
    runs = [
        ("predict", "--top-k", "3"),
        ("predict", "--top-k", "5"),
        ("patches", "--patch", "63"),
        ("patches", "-p", "74"),
    ]
    for command, *options in runs:
        result = cli(command, photo, *RANDOM_CPU, *options, "-q")
        assert result.exit_code == 0, result.stderr
    (folder,) = subject_folders(workdir / "outputs")
    documents = {name: json.loads((folder / f"{name}.json").read_text()) for name in indexed_results(folder)}
    assert set(documents) == {"predict-k3", "predict-k5", "patches-p63-v8", "patches-p74-v8"}
    assert len(documents["predict-k3"]["result"]["top"]) == 3 and len(documents["predict-k5"]["result"]["top"]) == 5
    assert documents["patches-p63-v8"]["result"]["selected"][0]["patch"] == "P63"
    assert documents["patches-p74-v8"]["result"]["selected"][0]["patch"] == "P74"
    for name, document in documents.items():
        assert document["experiment"]["name"] == name
        assert OutputStore(workdir / "outputs").is_complete(folder, name)


def test_same_stem_in_other_folders_gets_its_own_folder_the_same_on_every_run(cli, workdir, monkeypatch):
    paths = [small_image(workdir / "a" / "x.jpg", 1), small_image(workdir / "b" / "x.jpg", 2)]
    paths.append(small_image(workdir / "c" / "x-2.jpg", 3))
    assert cli("predict", *[p.relative_to(workdir) for p in paths], *RANDOM_CPU, "-k", "1", "-q").exit_code == 0
    folders = subject_folders(workdir / "outputs")
    assert len(folders) == 3
    by_image = {}
    for folder in folders:
        document = json.loads((folder / "predict-k1.json").read_text())
        image = (workdir / document["subject"]["path"]).resolve()
        assert document["subject"]["sha256"] == hashlib.sha256(image.read_bytes()).hexdigest()
        by_image[image] = folder.name
    assert set(by_image) == {path.resolve() for path in paths}
    # Again, in another order, with absolute paths, and from a sub-folder through `..`: the same folders.
    assert cli("predict", paths[2], paths[0], paths[1], *RANDOM_CPU, "-k", "1", "-q").exit_code == 0
    (workdir / "sub").mkdir()
    monkeypatch.chdir(workdir / "sub")
    assert cli("predict", "../b/x.jpg", *RANDOM_CPU, "-k", "1", "-q", "-o", "../outputs").exit_code == 0
    assert [folder.name for folder in subject_folders(workdir / "outputs")] == sorted(by_image.values())
    assert image_subject(Path("../b/x.jpg")) == by_image[paths[1].resolve()]


def test_rerunning_a_command_replaces_exactly_its_own_files(cli, photo, newfoundland, workdir):
    for command, image, *options in [
        ("predict", photo, "-k", "3"),
        ("predict", photo, "-k", "5"),
        ("patches", photo, "-p", "63"),
        ("predict", newfoundland, "-k", "3"),
    ]:
        assert cli(command, image, *RANDOM_CPU, *options, "-q").exit_code == 0
    root = workdir / "outputs"
    before = stamps(root)
    assert cli("predict", photo, *RANDOM_CPU, "-k", "3", "-q").exit_code == 0
    after = stamps(root)
    assert set(after) == set(before)
    replaced = {path for path in after if after[path] != before[path]}
    (folder,) = {path.parent for path in replaced}
    assert {path.name for path in replaced} == {"predict-k3.json", "predict-k3.csv", "predict-k3.png"}
    assert json.loads((folder / "predict-k3.json").read_text())["subject"]["path"] == str(photo)
    assert set(indexed_results(folder)) == {"predict-k3", "predict-k5", "patches-p63-v8"}
    assert all(OutputStore(root).is_complete(folder, name) for name in indexed_results(folder))


def test_json_files_carry_provenance_and_the_image_sha256(cli, vit, photo, workdir):
    assert cli("patches", photo, *RANDOM_CPU, "-p", "63", "-q").exit_code == 0
    assert cli("predict", photo, *RANDOM_CPU, "-q").exit_code == 0
    digest = hashlib.sha256(photo.read_bytes()).hexdigest()
    for name, command in (("patches-p63-v8", "patches"), ("predict-k5", "predict")):
        document = json.loads(result_files(workdir / "outputs", name)["json"].read_text())
        assert set(document) == {"provenance", "subject", "experiment", "result"}
        provenance = document["provenance"]
        assert provenance["model"] == "vit_tiny_patch16_224.augreg_in21k_ft_in1k"
        assert provenance["parameters_sha256"] == vit.parameter_sha256
        assert provenance["weights_label"] == "RANDOM (seed 0)"
        assert provenance["command"].startswith("vitcli")
        assert document["subject"]["sha256"] == digest and document["subject"]["path"] == str(photo)
        assert document["experiment"]["command"] == command


def test_csv_files_of_several_runs_concatenate(cli, photo, newfoundland, workdir):
    for image, seed in ((photo, "0"), (newfoundland, "0"), (photo, "1")):
        options = ["--weights", "random", "--seed", seed, "--device", "cpu"]
        assert cli("predict", image, *options, "-k", "2", "-q").exit_code == 0
    files = sorted((workdir / "outputs").glob("*/*/predict-k2.csv"))
    assert len(files) == 3
    frames = [pd.read_csv(path) for path in files]
    assert all(list(frame.columns) == list(frames[0].columns) for frame in frames)
    assert list(frames[0].columns[:5]) == ["image", "image_sha256", "model", "weights", "result"]
    rows = pd.concat(frames, ignore_index=True)
    assert len(rows) == 6 and not rows.isna().any().any()
    assert set(rows["image"]) == {str(photo), str(newfoundland)}
    assert set(rows["model"]) == {"vit_tiny_patch16_224.augreg_in21k_ft_in1k"}
    assert set(rows["weights"]) == {"RANDOM (seed 0)", "RANDOM (seed 1)"}
    assert set(rows["result"]) == {"predict-k2"}


# ----- nothing outside the output folder


def test_two_token_lists_that_differ_after_the_cut_keep_both_results(cli, photo, workdir):
    """Issue 27 item 2: the 80-character cut made both lists one name, and the second run replaced the first."""
    shared = ",".join(str(patch) for patch in range(1, 40))
    runs = [f"{shared},150", f"{shared},151"]
    for tokens in runs:
        result = cli("trace", photo, *RANDOM_CPU, "--token", tokens, "--blocks", "none", "--values", "1", "-q")
        assert result.exit_code == 0, result.stderr
    (folder,) = subject_folders(workdir / "outputs")
    names = [name for name in indexed_results(folder) if name.startswith("trace-")]
    assert len(names) == 2 and all(len(name) <= LONGEST_RESULT_NAME for name in names), names
    followed = {name: json.loads((folder / f"{name}.json").read_text())["result"] for name in names}
    assert sorted(result["followed"][-1]["name"] for result in followed.values()) == ["P150", "P151"]
    for name in names:
        assert OutputStore(workdir / "outputs").is_complete(folder, name)


def test_distinct_settings_get_distinct_names_within_the_limit_and_the_same_settings_the_same_name():
    """A property over many random settings: the names are a function of the settings, injective, and bounded."""
    import random

    generator = random.Random(27)
    settings = set()
    while len(settings) < 3000:
        tokens = tuple(f"P{generator.randint(1, 196)}" for _ in range(generator.choice([1, 2, 5, 20, 60])))
        blocks = tuple(sorted(generator.sample(range(1, 13), generator.randint(1, 12))))
        settings.add((tokens, blocks, generator.choice([1, 3, 1000]), generator.choice([0.1, 0.1 + 1e-12, 2.0])))
    names = {}
    for tokens, blocks, values, noise in settings:
        name = result_name(
            "trace", setting("t", tokens), setting("b", blocks), setting("v", values), setting("s", noise)
        )
        assert len(name) <= LONGEST_RESULT_NAME and SAFE_NAME.match(name), name
        assert name not in names, (name, names.get(name), (tokens, blocks, values, noise))
        names[name] = (tokens, blocks, values, noise)
        again = result_name(
            "trace", setting("t", tokens), setting("b", blocks), setting("v", values), setting("s", noise)
        )
        assert again == name
    assert any(len(name) == LONGEST_RESULT_NAME for name in names)  # some were shortened


@pytest.mark.parametrize(
    ("command", "spellings"),
    [
        ("trace", [{"token": ["0,74"]}, {"token": ["cls", " P74 ", "r5c3", "074"]}]),
        ("trace", [{"blocks": ["all"]}, {"blocks": ["1-12"]}, {"blocks": ["1-6", "7,8,9-12"]}]),
        ("explore", [{}, {"blocks": "all"}, {"blocks": "1-12"}, {"blocks": "01-6,7-12"}]),
        ("patches", [{"patch": ["63"]}, {"patch": ["P63"]}, {"patch": ["r4c6"]}]),
        ("attend", [{"block": 4, "head": 1, "query": q} for q in ("74", "P74", "r5c3", " p074")]),
    ],
)
def test_one_setting_spelled_several_ways_gets_one_name(command, spellings):
    """Names come from the parsed settings, never from the text typed (issue 27 item 2)."""
    from vitcli import cli as _commands  # noqa: F401  (registers the job builders)
    from vitcli.jobs import JOB_BUILDERS
    from vitcli.loading import describe
    from vitcli.spec import WeightsSpec

    architecture = describe(WeightsSpec(random=True))
    names = set()
    for options in spellings:
        (job,) = JOB_BUILDERS[command](**options)
        names.add(job.plan(architecture).name())
    assert len(names) == 1, names


def test_two_mask_folders_of_one_name_are_two_settings(tmp_path):
    from vitcli.jobs.explain import explain_jobs
    from vitcli.loading import describe
    from vitcli.spec import WeightsSpec

    names = set()
    for parent in ("a", "b"):
        (tmp_path / parent / "masks").mkdir(parents=True)
        (job,) = explain_jobs(masks=tmp_path / parent / "masks")
        names.add(job.plan(describe(WeightsSpec(random=True))).name())
    assert len(names) == 2, names


def test_a_text_setting_that_sanitizing_changes_keeps_its_own_name():
    """Two texts that sanitize to the same characters ("a b", "a_b", "a\u00e9b", "ab") must not share a name."""
    texts = ["a b", "a_b", "a\u00e9b", "ab", "a/b", "a" * 100, "a" * 101]
    names = [result_name("x", setting("m", text)) for text in texts]
    assert len(set(names)) == len(texts), names
    assert all(SAFE_NAME.match(name) and len(name) <= LONGEST_RESULT_NAME for name in names), names


@pytest.mark.parametrize(
    "stem",
    [
        *["..", ".", ".hidden", "_.hidden", "..\\..\\x", "a\\b", "tab\there", "new\nline", "\x1b[31mred"],
        *["café", "猫", " ", "a" * 300],
    ],
)
def test_names_made_from_inputs_are_safe(stem, tmp_path):
    subject = image_subject(tmp_path / f"{stem}.jpg")
    assert SAFE_NAME.match(subject) and not subject.startswith("."), subject
    assert len(subject) <= 80 + 11
    assert SAFE_NAME.match(safe_name(stem)) and safe_name(stem) not in ("", ".", "..")


def test_subject_folders_never_collide():
    paths = [Path(f"{folder}/{stem}.jpg") for folder in ("a", "b", "a/b", "../a") for stem in ("x", "x-2", "x_2", "X")]
    names = [image_subject(path) for path in paths]
    assert len(set(names)) == len(paths)
    assert names == [image_subject(path) for path in paths]
    assert set_subject(paths[:3]) == set_subject(reversed(paths[:3])) != set_subject(paths[1:4])


def test_hostile_file_names_stay_inside_the_output_folder(cli, workdir):
    names = ["...jpg", ".hidden.jpg", "a\\b.jpg", "new\nline.jpg", "\x1b[31mred.jpg", "猫.jpg", "café.jpg"]
    for seed, name in enumerate(names):
        small_image(workdir / "pics" / name, seed)
    result = cli("predict", workdir / "pics", *RANDOM_CPU, "-k", "1", "-q", "-o", "out")
    assert result.exit_code == 0, result.stderr
    written = {path for path in workdir.rglob("*") if path.is_file() and "pics" not in path.parts}
    folders = subject_folders(workdir / "out")
    assert len(folders) == len(names)
    assert all(SAFE_NAME.match(folder.name) and not folder.name.startswith(".") for folder in folders)
    assert all(path.parent.parent.parent == workdir / "out" for path in written), written
    # Paths are written escaped (a backslash doubled, see vitcli/filenames.py) and read back to the real name.
    assert {
        str(path_from_escaped(json.loads((folder / "predict-k1.json").read_text())["subject"]["path"]))
        for folder in folders
    } == {str(workdir / "pics" / name) for name in names}


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("", "--output-dir is empty"),
        ("  ", "--output-dir is empty"),
        ("a_file", "is a file, not a folder"),
        ("a_file/sub", "a part of it is a file"),
    ],
)
def test_an_unusable_output_dir_is_a_usage_error_before_the_model_loads(
    cli, photo, workdir, no_model_load, value, message
):
    (workdir / "a_file").write_text("")
    result = cli("predict", photo, *RANDOM_CPU, "-o", value)
    assert result.exit_code == 2
    assert message in one_line(result.stderr)
    assert sorted(path.name for path in workdir.iterdir()) == ["a_file"]


def test_a_read_only_output_dir_is_one_line_and_exit_1(cli, photo, workdir, no_model_load):
    if os.geteuid() == 0:
        pytest.skip("running as root: chmod 555 does not stop root from writing")
    folder = workdir / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        result = cli("predict", photo, *RANDOM_CPU, "-o", folder)
    finally:
        folder.chmod(0o755)
    assert result.exit_code == 1 and "is not writable" in one_line(result.stderr)


def test_an_output_dir_the_file_system_refuses_is_one_line_and_exit_1(cli, photo, workdir, no_model_load, monkeypatch):
    """What chmod 555 gives a normal user, simulated so that it also runs as root."""
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: False if Path(path).name == "ro" else real_access(path, mode))
    result = cli("predict", photo, *RANDOM_CPU, "-o", "ro")
    assert result.exit_code == 1 and "--output-dir ro is not writable" in one_line(result.stderr)


# ----- a full disk, a read-only file system, a signal


def refuse_writes_from(monkeypatch, folder_stem: str, first_refused: str, code: int) -> None:
    """Writes raise OSError(code) from file `first_refused` in the subject folder of image `folder_stem` on (the
    disk stays full), the way a real full disk answers the write() of a temporary file."""
    real = store._write_temporary
    refused = {"on": False}

    def write(temporary: Path, writer):
        if temporary.parent.name.startswith(f"{folder_stem}-") and temporary.name.startswith(f".{first_refused}."):
            refused["on"] = True
        if refused["on"]:
            with open(temporary, "xb") as stream:
                stream.write(b"partial")
            temporary.unlink()
            raise OSError(code, os.strerror(code))
        return real(temporary, writer)

    monkeypatch.setattr(store, "_write_temporary", write)


@pytest.mark.parametrize(("code", "words"), [(errno.ENOSPC, "no space left on device"), (errno.EROFS, "read-only")])
def test_a_failed_write_keeps_earlier_results_and_leaves_no_temporary(cli, workdir, monkeypatch, code, words):
    a, b = small_image(workdir / "pics" / "a.jpg", 1), small_image(workdir / "pics" / "b.jpg", 2)
    assert cli("predict", b, *RANDOM_CPU, "-k", "2", "-q").exit_code == 0
    root = workdir / "outputs"
    earlier = stamps(root)
    refuse_writes_from(monkeypatch, "b", "predict-k2.csv", code)  # b's second file; a's result is written before
    monkeypatch.setattr(store, "_remove_orphaned_temporaries", lambda folder: None)  # not here to tidy up for us
    result = cli("predict", a, b, *RANDOM_CPU, "-k", "2", "-q")
    assert result.exit_code == 1
    lines = result.stderr.splitlines()
    assert len([line for line in lines if words in line]) == 1, result.stderr
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr
    assert "unexpected" not in result.stderr and "Errno" not in result.stderr
    assert temporaries(workdir) == []
    outputs = OutputStore(root)
    folders = {indexed_results(folder)["predict-k2"]["subject"]["path"]: folder for folder in subject_folders(root)}
    assert outputs.is_complete(folders[str(a)], "predict-k2")  # written before the disk filled
    assert outputs.is_complete(folders[str(b)], "predict-k2")  # the earlier run's result, untouched
    assert all(stamps(root)[path] == stamp for path, stamp in earlier.items())


def test_a_full_disk_ends_the_run_with_one_line(cli, workdir, monkeypatch):
    images = [small_image(workdir / "pics" / f"{name}.jpg", seed) for seed, name in enumerate("abc")]
    refuse_writes_from(monkeypatch, "b", "predict-k2.csv", errno.ENOSPC)
    result = cli("predict", *images, *RANDOM_CPU, "-k", "2", "-q")
    assert result.exit_code == 1
    assert "no space left on device" in one_line(result.stderr)


@pytest.fixture
def signals_as_exceptions():
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    interrupts.install()
    yield
    for signum, handler in handlers.items():
        signal.signal(signum, handler)


def text_files(**contents: str) -> dict:
    return {suffix: (lambda stream, text=text: stream.write(text.encode())) for suffix, text in contents.items()}


def test_a_signal_during_the_swap_waits_until_the_whole_result_is_in_place(
    tmp_path, signals_as_exceptions, monkeypatch
):
    outputs = OutputStore(tmp_path)
    folder = outputs.folder("model", "image")
    outputs.write(folder, ResultFiles("r", text_files(json="old json", csv="old csv", png="old png")))
    real_replace = os.replace
    killed = []

    def replace_then_terminate(source, target):
        real_replace(source, target)
        if not killed:
            killed.append(target)
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(os, "replace", replace_then_terminate)
    with pytest.raises(interrupts.Terminated):
        outputs.write(folder, ResultFiles("r", text_files(json="new json", csv="new csv")))
    monkeypatch.setattr(os, "replace", real_replace)
    assert killed, "the signal was never sent"
    assert outputs.is_complete(folder, "r")
    assert sorted(path.name for path in folder.iterdir()) == [".index.lock", INDEX, "r.csv", "r.json"]
    assert (folder / "r.json").read_text() == "new json" and (folder / "r.csv").read_text() == "new csv"


@pytest.mark.parametrize(
    ("signum", "exception"), [(signal.SIGTERM, interrupts.Terminated), (signal.SIGINT, KeyboardInterrupt)]
)
def test_a_signal_while_writing_keeps_the_old_result_and_no_temporary(
    tmp_path, signals_as_exceptions, signum, exception
):
    outputs = OutputStore(tmp_path)
    folder = outputs.folder("model", "image")
    outputs.write(folder, ResultFiles("r", text_files(json="old json", csv="old csv")))

    def half_then_terminate(stream):
        stream.write(b"half of the new csv")
        os.kill(os.getpid(), signum)
        stream.write(b" and the rest")

    files = {**text_files(json="new json"), "csv": half_then_terminate}
    with pytest.raises(exception):
        outputs.write(folder, ResultFiles("r", files))
    assert temporaries(tmp_path) == []
    assert outputs.is_complete(folder, "r") and (folder / "r.json").read_text() == "old json"


def test_an_index_entry_counts_only_while_its_files_match(tmp_path):
    outputs = OutputStore(tmp_path)
    folder = outputs.folder("model", "image")
    outputs.write(folder, ResultFiles("r", text_files(json="{}", csv="a,b\n")))
    assert outputs.is_complete(folder, "r") and not outputs.is_complete(folder, "other")
    (folder / "r.csv").write_text("a,b\n1,2\n")
    assert not outputs.is_complete(folder, "r")
    (folder / "r.csv").unlink()
    assert not outputs.is_complete(folder, "r")


def test_temporaries_of_dead_processes_are_removed_and_live_ones_kept(tmp_path):
    """Only this host's dead processes' temporaries go: another host's process ids mean nothing here (issue 19)."""
    folder = tmp_path / "model" / "image"
    folder.mkdir(parents=True)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    orphan = folder / f".r.json.{store.HOST}.p{int(dead.stdout)}.0a1b2c3d.tmp"
    live = folder / f".r.json.{store.HOST}.p{os.getpid()}.0a1b2c3d.tmp"
    other_host = folder / f".r.json.node7-0a1b2c.p{int(dead.stdout)}.0a1b2c3d.tmp"
    for path in (orphan, live, other_host):
        path.write_text("a temporary")
    OutputStore(tmp_path).folder("model", "image")
    assert not orphan.exists() and live.exists() and other_host.exists()


WRITER = """
import os, sys, time
from pathlib import Path
from vitcli.store import HOST, OutputStore, ResultFiles

def slowly(stream):
    for _ in range(5):
        stream.write(b"x" * 1000)
        time.sleep(0.001)

store = OutputStore(Path(sys.argv[1]))
for index in range(int(sys.argv[2])):
    store.write(store.folder("model", "shared"), ResultFiles(f"r-{sys.argv[3]}-{index}", {"json": slowly, "csv": "a"}))
print(HOST, os.getpid())
"""


@pytest.mark.slow  # several seconds: `make test` leaves it to CI's full run
def test_shards_on_two_hosts_sharing_a_folder_never_remove_each_others_files(tmp_path):
    """Two writers in two PID namespaces (what two machines look like to each other) publish into one folder at
    once, each cleaning the folder before every write; each has a process id the other's namespace lacks. With the
    host left out of the temporaries' names (tried on purpose), tries fail with "No such file or directory"."""
    if subprocess.run(["unshare", "--pid", "--fork", "true"], capture_output=True).returncode != 0:
        pytest.skip("unshare --pid needs root (or user namespaces) here")
    environment = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    failures = []
    for attempt in range(20):
        folder = tmp_path / f"try{attempt}"
        writers = [
            # Some short-lived processes first, so each writer's id differs from the other's and is free there.
            subprocess.Popen(
                [
                    "unshare",
                    "--pid",
                    "--fork",
                    "--mount-proc",
                    "sh",
                    "-c",
                    f'for i in $(seq {spawned}); do true; done; exec "$0" -c "$1" "$2" 40 {name}',
                    sys.executable,
                    WRITER,
                    str(folder),
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=environment,
            )
            for name, spawned in (("a", 3), ("b", 9))
        ]
        outputs = [writer.communicate(timeout=60) for writer in writers]
        failures += [error for writer, (_, error) in zip(writers, outputs, strict=True) if writer.returncode]
        hosts = {output.split()[0] for output, _ in outputs if output}
    assert failures == []
    assert len(hosts) == 2  # the two namespaces are two hosts
    assert len(read_index(tmp_path / "try19" / "model" / "shared")["results"]) == 80


def test_no_folder_outside_the_store_is_ever_made(tmp_path):
    for parts in (("..", "x"), ("model", "."), ("a/b",), ("",)):
        with pytest.raises(VitcliError, match="refusing an output folder outside"):
            OutputStore(tmp_path / "out").folder(*parts)
    assert not (tmp_path / "x").exists()


@pytest.mark.slow
def test_sigterm_mid_run_exits_143_and_every_indexed_result_is_whole(tmp_path):
    for index in range(30):
        small_image(tmp_path / "pics" / f"img{index:02d}.png", index, (48, 40))
    process = subprocess.Popen(
        [VITCLI, "patches", "pics", *RANDOM_CPU, "-o", "out", "--batch-size", "4"],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    wrote, deadline = 0, time.monotonic() + 240
    try:
        while wrote < 3:
            assert time.monotonic() < deadline, "no results within the time limit"
            ready, _, _ = select.select([process.stderr], [], [], 5)
            if ready:
                line = process.stderr.readline()
                assert line, f"vitcli ended before it was killed (exit {process.wait()})"
                wrote += line.startswith("wrote ")
        process.send_signal(signal.SIGTERM)
        rest = process.communicate(timeout=60)[1]
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 143, rest
    assert rest.strip().splitlines()[-1] == "error: terminated"
    assert temporaries(tmp_path) == []
    outputs = OutputStore(tmp_path / "out")
    folders = subject_folders(tmp_path / "out")
    indexed, unindexed = 0, set()
    for folder in folders:
        results = indexed_results(folder)
        indexed += len(results)
        assert all(outputs.is_complete(folder, name) for name in results)
        listed = {file for entry in results.values() for file in entry["files"]}
        unindexed |= {
            (folder, path.name.split(".")[0]) for path in folder.iterdir() if path.name not in listed | BOOKKEEPING
        }
    assert 3 <= indexed < 30, "the signal did not arrive mid-run"
    assert len(unindexed) <= 1, unindexed  # at most the result being written when the signal came


# ----- one bad image does not stop a folder


@pytest.fixture
def folder_with_a_bad_image(workdir) -> Path:
    small_image(workdir / "pics" / "a.jpg", 1)
    (workdir / "pics" / "b.jpg").write_text("this is text, not a JPEG")
    small_image(workdir / "pics" / "c.jpg", 3)
    return workdir / "pics"


def written_images(root: Path) -> set[str]:
    if not root.is_dir():
        return set()
    return {
        Path(entry["subject"]["path"]).name
        for folder in subject_folders(root)
        for entry in indexed_results(folder).values()
    }


def test_one_bad_image_does_not_stop_a_folder(cli, folder_with_a_bad_image, workdir):
    result = cli("predict", folder_with_a_bad_image, *RANDOM_CPU, "-k", "1", "-q")
    assert result.exit_code == 1
    lines = result.stderr.splitlines()
    assert len(lines) == 2 and "b.jpg" in lines[0] and "Traceback" not in result.stderr, result.stderr
    assert lines[-1] == "error: 2 of 3 images done, 1 failed"
    assert written_images(workdir / "outputs") == {"a.jpg", "c.jpg"}


def test_fail_fast_stops_at_the_first_failure(cli, folder_with_a_bad_image, workdir):
    result = cli("predict", folder_with_a_bad_image, *RANDOM_CPU, "-k", "1", "--fail-fast", "-q")
    assert result.exit_code == 1
    line = one_line(result.stderr)
    assert "b.jpg" in line and "--fail-fast" in line
    written = written_images(workdir / "outputs")
    assert "a.jpg" in written and "c.jpg" not in written  # the image before the bad one, in the same batch


def test_one_image_and_a_folder_take_the_same_path_to_the_same_files(cli, workdir):
    small_image(workdir / "pics" / "x.jpg", 1)
    small_image(workdir / "pics" / "y.jpg", 2)
    assert cli("predict", workdir / "pics" / "x.jpg", *RANDOM_CPU, "-k", "2", "-q").exit_code == 0
    (alone,) = subject_folders(workdir / "outputs")
    alone_files = sorted(path.name for path in alone.iterdir())
    alone_top = json.loads((alone / "predict-k2.json").read_text())["result"]["top"]
    assert cli("predict", workdir / "pics", *RANDOM_CPU, "-k", "2", "-q").exit_code == 0
    folders = subject_folders(workdir / "outputs")
    assert len(folders) == 2 and alone in folders
    assert all(sorted(path.name for path in folder.iterdir()) == alone_files for folder in folders)
    batched_top = json.loads((alone / "predict-k2.json").read_text())["result"]["top"]
    assert [row["class_index"] for row in batched_top] == [row["class_index"] for row in alone_top]
    assert [row["probability"] for row in batched_top] == pytest.approx(
        [row["probability"] for row in alone_top], abs=1e-6
    )


# ----- issue 19: signals held only around the swap, read-only and vanished folders

SLOW_FIGURE = """
import sys, time
from pathlib import Path
from vitcli import interrupts
from vitcli.jobs import Job, Presentation
from vitcli.output import Emitter, Messages
from vitcli.publisher import Publisher
from vitcli.runner import Report, Runner
from vitcli.store import OutputStore


class SlowFigure(Job):
    command = "slow"
    scope = "model"

    def name(self):
        return "slow"

    def settings(self):
        return {}

    def compute_once(self, model):
        return None

    def present(self, result):
        def figure():
            print("drawing", flush=True)
            time.sleep(120)

        return Presentation("", [], {"x": 1}, figure=figure)


interrupts.install()
publisher = Publisher(OutputStore(Path(sys.argv[1])), "model", Emitter("json", True), Messages(True), {})
try:
    Runner(None, publisher, False).run_once([SlowFigure()], Report())
except interrupts.Terminated:
    sys.exit(143)
"""


def test_sigterm_while_a_figure_is_drawn_ends_the_run_at_once_with_nothing_half_written(tmp_path):
    """Presentation and figures are interruptible: SIGTERM during a two-minute figure ends the process at once (it
    waited for the whole figure while the runner held signals around the publication, tried on purpose), and
    neither the result's files nor a temporary remain."""
    environment = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    process = subprocess.Popen(
        [sys.executable, "-c", SLOW_FIGURE, str(tmp_path / "out")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environment,
    )
    try:
        assert process.stdout.readline() == "drawing\n", process.stderr.read()
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=20)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 143
    folder = tmp_path / "out" / "model" / "model"
    assert temporaries(tmp_path) == []
    assert sorted(path.name for path in folder.iterdir()) == [".index.lock"] or not list(folder.iterdir())


def test_a_signal_during_the_swap_waits_for_the_callers_record_line(tmp_path, signals_as_exceptions):
    outputs = OutputStore(tmp_path)
    folder = outputs.folder("model", "image")
    recorded = []

    def record(paths):
        os.kill(os.getpid(), signal.SIGTERM)
        recorded.append(paths)

    with pytest.raises(interrupts.Terminated):
        outputs.write(folder, ResultFiles("r", text_files(json="{}", csv="a")), then=record)
    assert recorded and outputs.is_complete(folder, "r")


def test_a_read_only_folder_under_the_output_dir_is_the_real_error_in_one_line(tmp_path):
    """A read-only mount inside -o holding a temporary a killed process left: its clean-up failed with "internal
    error (OSError)" and hid the real error; now the write says why, exit 1."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root for a read-only bind mount in a private mount namespace")
    image = small_image(tmp_path / "a.png", 1)
    folder = tmp_path / "out" / MODEL_FOLDER / image_subject(image)
    folder.mkdir(parents=True)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (folder / f".predict-k1.json.{store.HOST}.p{int(dead.stdout)}.0a1b2c3d.tmp").write_text("left by kill -9")
    script = 'mount --bind -o ro "$1" "$1" && exec "$2" predict "$3" --weights random --device cpu -k 1 -o out -q'
    result = subprocess.run(
        ["unshare", "--mount", "sh", "-c", script, "sh", str(folder), VITCLI, str(image)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 1, result.stderr
    assert "read-only file system" in one_line(result.stderr) and "internal error" not in result.stderr


def test_a_record_whose_folder_vanished_is_a_store_error(tmp_path):
    outputs = OutputStore(tmp_path / "run")
    appender = outputs.appender(outputs.folder("records"), "mine.jsonl")
    appender.append('{"line": 1}')
    shutil.rmtree(tmp_path / "run")
    with pytest.raises(store.StoreError, match="was removed while this run was writing it"):
        appender.append('{"line": 2}')
