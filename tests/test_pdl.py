"""kernels.pdl: the switch of programmatic dependent launch for a forward's kernels."""
import torch

from vsr.kernels import common, pdl


def test_off_by_default_and_scoped_to_its_context():
    cpu = torch.device("cpu")
    assert not pdl.enabled(cpu) and pdl.options(cpu) == {"WAIT": False, "RELEASE": False}
    with pdl.programmatic_forward():
        # a device without PDL (the CPU, the interpreter) launches as it always does
        assert not pdl.enabled(cpu) and pdl.options(cpu) == {"WAIT": False, "RELEASE": False}
        with pdl.programmatic_forward(False):
            assert not pdl._ON.get()
        assert pdl._ON.get()
    assert not pdl._ON.get()


def test_on_a_device_with_pdl_the_kernels_wait_release_and_launch_as_dependents(monkeypatch):
    feats = common.DeviceFeatures(nvidia=True, capability=(9, 0), pdl=True, hardware_e4m3=True)
    monkeypatch.setattr(pdl.common, "device_features", lambda device: feats)
    dev = torch.device("cpu")   # the features say sm_90; nothing is launched here
    assert pdl.options(dev) == {"WAIT": False, "RELEASE": False}
    with pdl.programmatic_forward():
        assert pdl.options(dev) == {"WAIT": True, "RELEASE": True, "launch_pdl": True}
