"""Finding image files from command-line arguments and decoding them to RGB, with one-line errors for bad input."""

from __future__ import annotations

import glob
import importlib.util
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from vitcli.errors import VitcliError
from vitcli.filenames import escaped_path
from vitcli.hashing import file_sha256

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm", ".pbm", ".pnm"}
# The Pillow formats of those suffixes (PPM covers .pgm, .pbm, .pnm). Other formats are refused from the header:
# Pillow can open dozens more, some through external programs (EPS runs Ghostscript).
PILLOW_FORMATS = ("JPEG", "PNG", "BMP", "GIF", "TIFF", "WEBP", "PPM")

T = TypeVar("T")


@dataclass(frozen=True)
class ImageSource:
    """Where an image came from: enough to reproduce or verify the input."""

    path: Path
    sha256: str
    original_size: tuple[int, int]  # (width, height)
    original_mode: str

    @property
    def display_path(self) -> str:
        """The path as every output writes it: a name that is not UTF-8 escaped (vitcli.filenames)."""
        return escaped_path(self.path)

    @property
    def display_name(self) -> str:
        return escaped_path(self.path.name)

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.display_path,
            "sha256": self.sha256,
            "original_width": self.original_size[0],
            "original_height": self.original_size[1],
            "original_mode": self.original_mode,
        }


def sample_photo() -> Path:
    """matplotlib's grace_hopper.jpg, found without importing matplotlib."""
    spec = importlib.util.find_spec("matplotlib")
    if spec is None or spec.origin is None:
        raise VitcliError("no image given and matplotlib (which ships the sample photo) is not installed")
    path = Path(spec.origin).parent / "mpl-data" / "sample_data" / "grace_hopper.jpg"
    if not path.is_file():
        raise VitcliError(f"no image given and the sample photo is missing at {path}")
    return path


def resolve_images(arguments: list[str]) -> list[Path]:
    """Expand files, folders (their images, sorted) and quoted globs into a list of image paths."""
    paths: list[Path] = []
    for argument in arguments:
        path = Path(argument)
        if path.is_dir():
            found = sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
            if not found:
                raise VitcliError(
                    f"no images in directory {escaped_path(path)} (looked for {', '.join(sorted(IMAGE_SUFFIXES))})"
                )
            paths.extend(found)
        elif path.is_file():
            paths.append(path)
        elif glob.has_magic(argument):
            matches = sorted(Path(match) for match in glob.glob(argument, recursive=True) if Path(match).is_file())
            if not matches:
                raise VitcliError(f"no files match {escaped_path(argument)}")
            paths.extend(matches)
        else:
            raise VitcliError(f"no such file or directory: {escaped_path(argument)}")
    return paths


def load_rgb(path: Path) -> tuple[Any, ImageSource]:
    """Decode an image fully and convert it to 8-bit RGB (EXIF rotation applied, alpha dropped as timm does)."""
    from PIL import ImageOps

    return decode(path, lambda opened: _to_rgb(ImageOps.exif_transpose(opened)))


def decode(path: Path, finish: Callable[[Any], T]) -> tuple[T, ImageSource]:
    """`finish` of the fully decoded Pillow image at `path`, for every image vitcli reads (photos, masks...).

    The header is checked first (format and pixel count), so a large file that is not an image, or an image too
    large to decode, is refused after reading a few bytes; only then is the file hashed, in chunks.
    """
    from PIL import Image, UnidentifiedImageError

    try:
        with warnings.catch_warnings():
            # A merely large image (PIL warns) is refused too: it would take minutes and gigabytes to decode.
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            # Pillow warns about damaged metadata ("Corrupt EXIF data"); the error or the pixels say what counts.
            warnings.filterwarnings("ignore", category=UserWarning, module="PIL")
            with Image.open(path, formats=PILLOW_FORMATS) as opened:
                source = ImageSource(path, file_sha256(path), opened.size, opened.mode)
                opened.load()
                finished = finish(opened)
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as error:
        raise VitcliError(f"{escaped_path(path)} is too large to decode safely ({error})") from error
    except UnidentifiedImageError as error:
        formats = f"{', '.join(PILLOW_FORMATS[:-1])} or {PILLOW_FORMATS[-1]}"
        raise VitcliError(f"{escaped_path(path)} is not an image that Pillow can read as {formats}") from error
    except OSError as error:
        if error.filename is not None:  # the file system's error, not the decoder's
            raise VitcliError(f"cannot read {escaped_path(path)}: {(error.strerror or str(error)).lower()}") from error
        raise VitcliError(f"{escaped_path(path)} is damaged or truncated{_detail(error)}") from error
    except MemoryError:  # a full memory says nothing about the file
        raise
    except Exception as error:
        # Pillow's decoders report damaged data with many exception types (SyntaxError, struct.error, EOFError...).
        raise VitcliError(f"{escaped_path(path)} is damaged or truncated{_detail(error)}") from error
    return finished, source


def split_readable(paths: Sequence[Path]) -> tuple[list[Path], list[str]]:
    """The paths that decode (fully: a truncated file shows only then), and the one-line refusal of each other."""
    readable: list[Path] = []
    refusals: list[str] = []
    for path in paths:
        try:
            load_rgb(path)
        except VitcliError as error:
            refusals.append(str(error))
        else:
            readable.append(path)
    return readable, refusals


def _detail(error: Exception) -> str:
    """': <Pillow's message>' when it says something a person can read, not a bare code or nothing."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return f": {text}" if any(character.isalpha() for character in text) else ""


def _to_rgb(image: Any) -> Any:
    from PIL import Image

    if image.mode in ("I;16", "I;16B", "I;16L", "I;16N", "I", "F"):
        import numpy as np

        # Pillow's own convert clips these modes at 255; scale the full range to 8 bits instead.
        values = np.asarray(image, dtype=np.float64)
        top = _full_scale(image.mode, float(values.max(initial=0.0)))
        gray = np.clip(np.round(values / top * 255.0), 0, 255).astype(np.uint8)
        return Image.fromarray(gray).convert("RGB")
    if image.mode == "P" and "transparency" in image.info:
        image = image.convert("RGBA")
    return image.convert("RGB")


def _full_scale(mode: str, largest: float) -> float:
    """The value that maps to white: the format's range where it can be told, else the image's maximum."""
    if mode.startswith("I;16"):
        return 65535.0
    for scale in (1.0, 255.0, 65535.0):
        if largest <= scale and (mode == "F" or scale > 1.0):
            return scale
    return largest
