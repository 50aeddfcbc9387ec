"""Helpers the vsr command-line tools share: exit codes, error reporting, JSON lines, device text."""
from __future__ import annotations

import functools
import json
import sys

import click

from vsr.runtime.errors import DeviceRefusal, PackageError, RequestError, VsrError

# Exit codes (documented in `vsr-run --help`).
EXIT_OK = 0
EXIT_REQUEST_FAILED = 1      # some request was not answered; the others were
EXIT_USAGE = 2               # click's own code for bad options
EXIT_REFUSED = 3             # the device cannot run the package
EXIT_PACKAGE = 4             # unknown, malformed or changed package
EXIT_MISMATCH = 5            # --self-check found answers that differ from the recorded ones

EXIT_CODES_HELP = ("Exit codes: 0 every request answered; 1 a request failed (the others were answered); "
                   "2 bad options; 3 the device refuses the package; 4 a package error (unknown, "
                   "malformed, changed or unverified package); 5 --self-check mismatch.")


def exit_code_for(err: VsrError) -> int:
    if isinstance(err, DeviceRefusal):
        return EXIT_REFUSED
    if isinstance(err, PackageError):
        return EXIT_PACKAGE
    if isinstance(err, RequestError):
        return EXIT_REQUEST_FAILED
    return EXIT_PACKAGE


def fail(err: VsrError, prog: str = "vsr-run") -> None:
    """Print the error's message (it names what is wrong) and exit with its code."""
    kind = "refused" if isinstance(err, DeviceRefusal) else "error"
    click.echo(f"{prog}: {kind}: {err}", err=True)
    sys.exit(exit_code_for(err))


def reports_errors(fn):
    """Turn a VsrError escaping a command into its message and exit code, without a traceback."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except VsrError as err:
            fail(err)
    return wrapper


def echo_json(obj) -> None:
    """One JSON object per line, UTF-8 as is (labels and texts stay readable)."""
    click.echo(json.dumps(obj, ensure_ascii=False, separators=(", ", ": ")))


def describe_text(info: dict) -> str:
    """The human form of vsr.runtime.device.describe()."""
    dv = info["device"]
    if dv["vendor"] == "cpu":
        where = f"cpu, {dv['multiprocessors']} cores"
    else:
        arch = (f"compute capability {dv['compute_capability']}" if dv["compute_capability"]
                else dv["gfx_arch"] or dv["arch"])
        where = f"{dv['vendor']}, {arch}, {dv['multiprocessors']} multiprocessors"
    lines = [f"device: {dv['name']} ({where})",
             f"table row: {info['table_row']}",
             f"software: torch {info['software']['torch']}, triton {info['software']['triton'] or 'absent'}, "
             f"torch FP4 tensors {'yes' if info['software']['torch_fp4'] else 'no'}, "
             f"tl.dot_scaled {'yes' if info['software']['tl_dot_scaled'] else 'no'}"]
    names = {"dense": "dense (FP32/FP16)", "bf16": "dense BF16", "fp8": "FP8 (W8A8)",
             "int4": "int4 (W4A16)", "nvfp4": "NVFP4 (W4A4)"}
    width = max(len(v) for v in names.values())
    for key, entry in info["formats"].items():
        label = names.get(key, key).ljust(width)
        if entry["status"] == "refused":
            text = f"refused: {entry['reason']}"
            if "emulation" in entry:
                text += f" [emulation {entry['emulation']}]"
        else:
            text = entry["status"] + (f" ({entry['note']})" if entry.get("note") else "")
        lines.append(f"  {label}  {text}")
    return "\n".join(lines)


def parse_device(device: str | None):
    """The torch.device `device` names (None: cuda where this machine has one, else cpu); a name
    torch does not parse is a usage error on --device."""
    import torch
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        return torch.device(device)
    except RuntimeError as e:
        raise click.BadParameter(f"{device!r} is not a torch device ({e})", param_hint="--device")
