"""The errors vsr reports to users. Each message names what is wrong: the file, tensor, revision or device.
Also read_json_object, the loaders' reader of a package's JSON files, beside the PackageError it turns
what can go wrong with one into (vsr's own writers, such as runtime/compress.py, read back their own output plainly)."""

import json
from pathlib import Path


class VsrError(Exception):
    """Base class: a problem the user can act on; the CLI prints its message and exits non-zero."""


class PackageError(VsrError):
    """A package is missing, malformed, changed, or not what was asked for (identity, config, tensors)."""


class DeviceRefusal(VsrError):
    """This device cannot run the package; the message is the reason, word for word from the device table."""


class RequestError(VsrError):
    """One request cannot be answered (empty, over-long, malformed); other requests still are."""


def read_json_object(path: Path) -> dict:
    """A package file's JSON object, or a PackageError that says what is wrong with the file."""
    try:
        config = json.loads(path.read_text())
    except OSError as e:
        raise PackageError(f"{path}: cannot be read: {e}") from None
    except UnicodeDecodeError as e:
        raise PackageError(f"{path}: not UTF-8 text: {e}") from None
    except json.JSONDecodeError as e:
        raise PackageError(f"{path}: broken JSON at line {e.lineno}, column {e.colno}: {e.msg}") from None
    if not isinstance(config, dict):
        raise PackageError(f"{path}: not a JSON object")
    return config
