"""The errors vsr reports to users. Each message names what is wrong: the file, tensor, revision or device."""


class VsrError(Exception):
    """Base class: a problem the user can act on; the CLI prints its message and exits non-zero."""


class PackageError(VsrError):
    """A package is missing, malformed, changed, or not what was asked for (identity, config, tensors)."""


class DeviceRefusal(VsrError):
    """This device cannot run the package; the message is the reason, word for word from the device table."""


class RequestError(VsrError):
    """One request cannot be answered (empty, over-long, malformed); other requests still are."""
